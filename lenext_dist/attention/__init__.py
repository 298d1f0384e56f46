"""Attention math of every variant, in plain torch (no megatron, no lenext_dist.config import), so
the exported HF modeling code can carry a verbatim copy of this package.

Public API: `attend` (the whole variant), `causal_attention` (SDPA fast path),
`eager_causal_attention` / `iter_attention_probs` (explicit softmax reference, by query chunks),
`build_position` / `POSITIONS` (the registry), `PositionVariant`, `NoPE`, `RoPE`.
"""
from .core import attend, causal_attention, eager_causal_attention, iter_attention_probs
from .position import NoPE, PositionVariant
from .registry import POSITIONS, build_position
from .rope import SCALINGS, RoPE, apply_rotary, rotate_half

__all__ = ["attend", "causal_attention", "eager_causal_attention", "iter_attention_probs",
           "NoPE", "PositionVariant", "POSITIONS", "build_position", "SCALINGS", "RoPE",
           "apply_rotary", "rotate_half"]
