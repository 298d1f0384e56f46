"""Attention temperature schedules: a per-position multiplier t_i of the logits of query i.

The logits of head h at query i are m_h t_i / sqrt(d) q_i.k (core.py, `scaled_query`), where m_h
is the head multiplier (a uniform c, `attention.scale_c`, or HeadScale's learned m_h,
`attention.head_scale`) and t_i the schedule's. t folds into q, so the SDPA fast paths stay.
A schedule is an entry of `TEMPERATURES`: a function (i, params, L) -> t, with i = position + 1
(the 1-based index of the query: how many tokens it sees) as fp32 [s] or [b, s], and L the
training length. Adding one is a function and a line here.

    none       t_i = 1
    uniform    t_i = c: the paper's uniform scale, on the layers `layers` names only (a NoPE
               layer inside a hybrid), where attention.scale_c scales every layer
    log_fit    t_i = 1 + a ln max(1, i / L): the paper's log fit lambda(s) = (1 + a ln s)/sqrt(d),
               applied per position (1 on the first L tokens)
    llama4     t_i = 1 + attn_scale ln(1 + floor(i / floor_scale)): Llama 4's attention
               temperature tuning of its NoPE layers (transformers modeling_llama4.py,
               `attn_temperature_tuning`: log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1)
    qwen_logn  t_i = max(1, ln i / ln L): Qwen's log-n attention scaling past the training length
               (Qwen-7B modeling_qwen.py `use_logn_attn`: query *= log_L(i) for i > L)
    ssmax      t_i = ln i / ln L with a learned m_h: Scalable-Softmax (Nakanishi 2025,
               arXiv:2501.19399) softmax(s_h ln(n) z) with n = i keys and s_h = m_h / ln L, so m_h
               starts at 1 (t = 1 at i = L); train it with attention.head_scale enabled + trainable
               (min_value null) from scratch

`layers` picks the layers a schedule applies to: `nope` (default; the layers that run NoPE:
Llama 4 scales its NoPE layers only) or `all`. Options are read duck-typed from
`attn_cfg.temperature` (the `TemperatureConfig` of lenext_dist.config, or the plain dict of an
exported config.json); a missing section is `none`.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor

from .cfg import cfg_get


def _uniform(i: Tensor, p, L: int) -> Tensor:
    return torch.full_like(i, float(cfg_get(p, "c", default=1.0)))


def _log_fit(i: Tensor, p, L: int) -> Tensor:
    return 1.0 + float(cfg_get(p, "a", default=0.0)) * torch.log(torch.clamp(i / L, min=1.0))


LLAMA4_DEFAULTS = {"floor_scale": 8192, "attn_scale": 0.1}
"""transformers' Llama4TextConfig defaults, for the options a `llama4` section leaves null."""


def llama4_options(p) -> tuple[float, float]:
    """(floor_scale, attn_scale) of a `llama4` section, nulls at transformers' defaults."""
    return tuple(float(cfg_get(p, k, default=v)) for k, v in LLAMA4_DEFAULTS.items())


def _llama4(i: Tensor, p, L: int) -> Tensor:
    floor_scale, attn_scale = llama4_options(p)
    return torch.log1p(torch.floor(i / floor_scale)) * attn_scale + 1.0


def _qwen_logn(i: Tensor, p, L: int) -> Tensor:
    return torch.clamp(torch.log(i) / math.log(L), min=1.0)


def _ssmax(i: Tensor, p, L: int) -> Tensor:
    return torch.log(i) / math.log(L)


Schedule = Callable[[Tensor, object, int], Tensor]

TEMPERATURES: dict[str, Optional[Schedule]] = {
    "none": None,
    "uniform": _uniform,
    "log_fit": _log_fit,
    "llama4": _llama4,
    "qwen_logn": _qwen_logn,
    "ssmax": _ssmax,
}
PARAMS: dict[str, tuple[str, ...]] = {
    "uniform": ("c",), "log_fit": ("a",), "llama4": ("floor_scale", "attn_scale"),
}
"""The options each schedule reads (the others refuse them: a `c` given to log_fit is a typo)."""
REQUIRED = {"uniform": ("c",), "log_fit": ("a",)}
"""Options without a default (llama4's: LLAMA4_DEFAULTS)."""
NEEDS_LENGTH = ("log_fit", "qwen_logn", "ssmax")
"""Schedules of i / L: they need the training length."""
LAYERS = ("nope", "all")


def check(section) -> None:
    """ValueError naming attention.temperature's key when `section` is unusable."""
    kind = cfg_get(section, "kind", default="none")
    if kind not in TEMPERATURES:
        raise ValueError(f"unknown attention.temperature.kind {kind!r}; registered: "
                         f"{sorted(TEMPERATURES)}")
    layers = cfg_get(section, "layers", default="nope")
    if layers not in LAYERS:
        raise ValueError(f"attention.temperature.layers must be one of {list(LAYERS)}, got {layers!r}")
    reads = PARAMS.get(kind, ())
    for key in ("c", "a", "floor_scale", "attn_scale"):
        v = cfg_get(section, key)
        if v is not None and key not in reads:
            raise ValueError(f"attention.temperature.{key} is not read by kind {kind!r} (it reads "
                             f"{list(reads) or 'nothing'})")
        if v is not None and not math.isfinite(float(v)):  # NaN / inf: every logit NaN
            raise ValueError(f"attention.temperature.{key} must be a finite number, got {v}")
        if v is not None and key in ("c", "floor_scale") and not float(v) > 0:
            raise ValueError(f"attention.temperature.{key} must be > 0, got {v}")
    for key in REQUIRED.get(kind, ()):
        if cfg_get(section, key) is None:
            raise ValueError(f"attention.temperature kind {kind!r} needs attention.temperature.{key}")


def applies(section, layer_position: str) -> bool:
    """Whether the schedule of `section` scales a layer running variant `layer_position`."""
    if section is None or cfg_get(section, "kind", default="none") == "none":
        return False
    return cfg_get(section, "layers", default="nope") == "all" or layer_position == "nope"


def multiplier(section, positions: Tensor, train_length: Optional[int]) -> Optional[Tensor]:
    """t [s] or [b, s] fp32 for 0-based `positions` ([s] or [b, s]), or None for `none`."""
    kind = cfg_get(section, "kind", default="none")
    fn = TEMPERATURES[kind]
    if fn is None:
        return None
    if kind in NEEDS_LENGTH and not train_length:
        raise ValueError(f"attention.temperature {kind!r} needs the training length")
    return fn(positions.to(torch.float32) + 1.0, section, train_length or 0)


def describe(section) -> str:
    """'llama4(floor_scale=64, attn_scale=0.1) on nope layers' (log lines, repr)."""
    kind = cfg_get(section, "kind", default="none")
    args = ", ".join(f"{k}={cfg_get(section, k)}" for k in PARAMS.get(kind, ())
                     if cfg_get(section, k) is not None)
    return f"{kind}({args}) on {cfg_get(section, 'layers', default='nope')} layers"
