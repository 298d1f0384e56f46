"""QK-norm: each head's query and key vectors normalized over the head dim before attention.

A kind is an entry of `NORMS` (adding one is a class and a line here):

    rms   RMSNorm over the head dim with a learned weight w [d] shared by the heads:
          y = w * (x * rsqrt(mean(x^2) + eps)) (Qwen3's q_norm / k_norm, transformers
          modeling_qwen3 `Qwen3RMSNorm(head_dim)`: the statistic in fp32, cast back to the input
          dtype, then times w). q and k have one weight each.
    l2    Llama 4's weightless norm: y = x * rsqrt(mean(x^2) + eps), in fp32, cast back
          (transformers modeling_llama4 `Llama4TextL2Norm`, meta-llama's model.py `l2_norm`).
          Despite its name it divides by the RMS, not the L2 norm: |y| = sqrt(d). One module
          serves q and k (no parameters).

Where it sits: on q = W_q x and k = W_k x per head, BEFORE the position variant's rotation, the
temperature and the head scale (`core.attend` gets normalized q, k). Qwen3 normalizes before
RoPE (as this does, and as megatron's q_layernorm would); Llama 4 applies RoPE, then qk_norm,
then its temperature (modeling_llama4 `Llama4TextAttention.forward`). For the weightless `l2`
both orders are the same function: a RoPE rotation turns each pair (x_i, x_{i+d/2}) by an angle
and keeps x_i^2 + x_{i+d/2}^2, so mean(x^2) and the norm commute with it (partial RoPE too: the
unrotated dims are untouched); only fp32 rounding differs. Not so with YaRN, whose attention
factor scales cos and sin: a norm after the rotation divides it out (convert/ refuses Llama 4
with RoPE scaling). A temperature or head scale m_h multiplies q after the norm on both
(Llama 4's `query_states * attn_scales` after qk_norm).

Which layers (`layers`): `all`, or `rope`, the layers running RoPE (Llama 4:
`use_qk_norm and not is_nope_layer` in meta-llama's model.py, `config.use_qk_norm and
self.use_rope` in transformers). eps: `attention.qk_norm.eps`, null = the model's RMSNorm
epsilon (model.norm_epsilon; both transformers classes use config.rms_norm_eps).

Options are read duck-typed from `attn_cfg.qk_norm` (the `QKNormConfig` of lenext_dist.config,
or the plain dict of an exported config.json); a missing section is `none` (exports made before
QK-norm).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .cfg import cfg_get
from .layout import layer_names


class L2Norm(nn.Module):
    """Llama 4's weightless qk norm: x * rsqrt(mean(x^2) + eps) over the last dim (fp32)."""

    kind = "l2"

    def __init__(self, head_dim: int, eps: float):
        super().__init__()
        self.head_dim, self.eps = head_dim, float(eps)

    def _norm(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., d] -> [..., d] in x.dtype (the statistic and product in fp32)."""
        return self._norm(x.float()).type_as(x)

    def extra_repr(self) -> str:
        return f"kind={self.kind}, head_dim={self.head_dim}, eps={self.eps}"


class RMSNorm(L2Norm):
    """Per-head RMSNorm with a learned weight [d] shared by the heads (Qwen3's q_norm/k_norm)."""

    kind = "rms"

    def __init__(self, head_dim: int, eps: float):
        super().__init__(head_dim, eps)
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, x: Tensor) -> Tensor:
        # Qwen3RMSNorm: normalize in fp32, cast to the input dtype, then the weight
        return self.weight * self._norm(x.float()).to(x.dtype)


NORMS: dict[str, Optional[type[L2Norm]]] = {"none": None, "rms": RMSNorm, "l2": L2Norm}
LAYERS = ("all", "rope")
LEARNED = ("rms",)
"""Kinds with parameters: one set per layer, on q and on k (`q_norm.weight`, `k_norm.weight`)."""


def check(section) -> None:
    """ValueError naming attention.qk_norm's key when `section` is unusable."""
    kind = cfg_get(section, "kind", default="none")
    if kind not in NORMS:
        raise ValueError(f"unknown attention.qk_norm.kind {kind!r}; registered: {sorted(NORMS)}")
    layers = cfg_get(section, "layers", default="all")
    if layers not in LAYERS:
        raise ValueError(f"attention.qk_norm.layers must be one of {list(LAYERS)}, got {layers!r}")
    eps = cfg_get(section, "eps")
    if eps is not None and not float(eps) > 0:
        raise ValueError(f"attention.qk_norm.eps must be > 0 (or null: model.norm_epsilon), got {eps}")


def layer_kinds(attn_cfg, num_layers: int) -> list[Optional[str]]:
    """The qk-norm kind of each of `num_layers` layers (None: no norm), from attention.qk_norm
    over the layout's layers (`rope`: the layers running RoPE only)."""
    section = cfg_get(attn_cfg, "qk_norm")
    check(section)
    kind = cfg_get(section, "kind", default="none")
    if kind == "none":
        return [None] * num_layers
    if cfg_get(section, "layers", default="all") == "all":
        return [kind] * num_layers
    return [kind if x == "rope" else None for x in layer_names(attn_cfg, num_layers)]


def layer_norms(attn_cfg, *, num_layers: int, head_dim: int, norm_eps: float
                ) -> list[Optional[tuple[nn.Module, nn.Module]]]:
    """(q norm, k norm) of each layer, or None where it has none; `norm_eps` is the model's
    RMSNorm epsilon (the default of attention.qk_norm.eps). Fresh modules per layer (a learned
    kind has its own weights; a weightless one uses the same module for q and k)."""
    eps = float(cfg_get(attn_cfg, "qk_norm", "eps", default=norm_eps))
    out = []
    for kind in layer_kinds(attn_cfg, num_layers):
        if kind is None:
            out.append(None)
        elif kind in LEARNED:
            out.append((NORMS[kind](head_dim, eps), NORMS[kind](head_dim, eps)))
        else:
            norm = NORMS[kind](head_dim, eps)
            out.append((norm, norm))
    return out

