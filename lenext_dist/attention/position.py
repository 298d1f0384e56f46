"""The position-variant interface, and NoPE.

A position variant is everything about *where* tokens are that enters attention. The core
function (`core.attend`) asks a variant for exactly these hooks, so a new variant is a new class
plus one line in `registry.POSITIONS`, never a branch in core code:

- `rotate(q, k, positions)`: a rotation of queries and keys (RoPE and its PI/NTK/YaRN scalings;
  later XPOS). Identity by default. `positions` is a tensor [s] or an int start (positions
  start..start+s-1, the common case, which variants may cache on without a device sync).
- `query_scale(positions)`: an optional per-position multiplier t[s] of the logits (the seam for a
  position-dependent log-length scale, e.g. c(i) = 1 + a ln(i/L)); folded into q, so the SDPA fast
  path still applies. None by default.
- `score_mod(scores, q_pos, k_pos)`: an optional additive bias / mask on raw logits (the seam for
  ALiBi, KERPLE, Sandwich, sliding windows). A variant that sets it leaves the SDPA fast path: core
  then runs the chunked eager path (a FlexAttention path can replace that where it runs).
  None by default.

Variants are built by `from_config(attn_cfg, head_dim=..., train_length=...)`, where `attn_cfg` is
the `AttentionConfig` of lenext_dist.config (duck-typed: this package imports nothing from config,
so it can be copied next to an exported HF modeling file).
"""
from __future__ import annotations

from typing import Callable, Optional, Union

from torch import Tensor


class PositionVariant:
    """Base class: no position information at all (all hooks are identities)."""

    name: str = "base"
    score_mod: Optional[Callable[[Tensor, Tensor, Tensor], Tensor]] = None
    """(scores [b, h, sq, sk] fp32, q_pos [sq], k_pos [sk]) -> scores; None keeps the fast path."""

    @classmethod
    def from_config(cls, attn_cfg, *, head_dim: int, train_length: int) -> "PositionVariant":
        return cls()

    def rotate(self, q: Tensor, k: Tensor, positions: Union[Tensor, int]) -> tuple[Tensor, Tensor]:
        """q [b, h, s, d], k [b, g, s, d], positions [s] or int start -> rotated (q, k)."""
        return q, k

    def query_scale(self, positions: Tensor) -> Optional[Tensor]:
        """Per-position logit multiplier t [s] (fp32), or None for none."""
        return None

    def extra_repr(self) -> str:  # for logs: `PositionVariant(name=...)`
        return f"name={self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"


class NoPE(PositionVariant):
    """No positional encoding: causal attention alone carries order (Kazemnejad et al. 2023)."""

    name = "nope"
