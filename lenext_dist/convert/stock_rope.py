"""RoPE settings of a run as transformers `rope_parameters` (stock exports, stock.py).

`ROPE_PARAMETERS` maps attention.rope.scaling (a name of lenext_dist.attention.rope.SCALINGS) to
the rope_parameters giving the same inv_freq and cos/sin multiplier (tested against HF's own
functions in tests/unit/test_stock_export.py); a scaling missing here is refused for stock.
Under partial RoPE (attention.rope.fraction) they act on the r = int(fraction d) rotated dims,
as transformers' rope functions do (dim = int(head_dim * partial_rotary_factor)).
"""
from __future__ import annotations

from typing import Callable

from lenext_dist.attention.rope import rotary_dims


def _rope_none(r, head_dim: int, train_length: int) -> dict:
    return {"rope_type": "default", "rope_theta": float(r.base)}


def _rope_pi(r, head_dim: int, train_length: int) -> dict:
    # HF "linear": inv_freq / factor, our PI: base_inv_freq / factor (same expression)
    return {"rope_type": "linear", "rope_theta": float(r.base), "factor": float(r.factor)}


def _rope_ntk(r, head_dim: int, train_length: int) -> dict:
    # static NTK-aware = plain RoPE with base * s^(d/(d-2)); HF's "dynamic" is another method
    # (base recomputed from the running sequence length), so the base is folded instead
    d = head_dim
    return {"rope_type": "default", "rope_theta": float(r.base * r.factor ** (d / (d - 2)))}


def _rope_yarn(r, head_dim: int, train_length: int) -> dict:
    # transformers' _compute_yarn_parameters with our defaults (beta 32/1, truncate, mscale
    # 0.1 ln s + 1 on cos and sin) and original length = the training length L
    return {"rope_type": "yarn", "rope_theta": float(r.base), "factor": float(r.factor),
            "original_max_position_embeddings": int(train_length), "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": True}


ROPE_PARAMETERS: dict[str, Callable[..., dict]] = {
    "none": _rope_none, "pi": _rope_pi, "ntk": _rope_ntk, "yarn": _rope_yarn}
"""attention.rope.scaling (a name of lenext_dist.attention.rope.SCALINGS) -> transformers 5.23
`rope_parameters` giving the same inv_freq and cos/sin multiplier (tested against HF's own
functions); a scaling missing here is refused for stock."""


def with_scaling(cfg, common: dict) -> tuple[dict, dict]:
    """(rope_parameters of attention.rope, common kwargs with the extended length when scaled)."""
    a, m = cfg.attention, cfg.model
    r = a.rope
    # the rotated dims: int(fraction d) under partial RoPE (transformers' partial_rotary_factor)
    params = ROPE_PARAMETERS[r.scaling](r, rotary_dims(m.head_dim, r.fraction), m.train_length)
    if r.scaling != "none":  # the extended length, informational (factor is given explicitly)
        common = {**common, "max_position_embeddings": max(int(m.train_length * r.factor), m.seq_length)}
    return params, common
