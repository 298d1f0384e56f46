"""ALiBi (Press, Smith, Lewis 2022, "Train Short, Test Long", arXiv:2108.12409).

Logits of head h: q.k - m_h (i - j) for key j <= i (|i - j| under the causal mask), no position
embedding otherwise. Slopes m_h = 2^(-8h/H), h = 1..H, with the paper's interpolation rule for a
head count H that is not a power of 2 (`position.alibi_slopes`). Parameter-free.

The bias is added after the softmax scale (it is not multiplied by c or the head scales).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .position import PositionVariant, alibi_slopes


class ALiBi(PositionVariant):
    name = "alibi"
    needs_num_heads = True

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float32, device="cpu")  # [h], plain attr

    @classmethod
    def from_config(cls, attn_cfg, *, head_dim: int, train_length: int,
                    num_heads: Optional[int] = None) -> "ALiBi":
        return cls(_need_heads(cls, num_heads))

    def distance_bias(self, n: int, device: Optional[torch.device] = None) -> Tensor:
        dist = torch.arange(n, device=device, dtype=torch.float32)
        return -self.const("slopes", device)[:, None] * dist[None, :]  # [h, n]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_heads={self.num_heads}"


def _need_heads(cls, num_heads: Optional[int]) -> int:
    if num_heads is None:
        raise ValueError(f"attention variant {cls.name!r} needs num_heads (per-head bias)")
    return int(num_heads)
