"""Sandwich (Chi, Fan, Rudnicky, Ramadge 2023, "Dissecting Transformer Length Extrapolation via the
Lens of Receptive Field Analysis", ACL 2023, arXiv:2212.10356): no position embedding on the token
stream; the logits get the inner product of sinusoidal position embeddings p of dimension d':

    q.k + lambda p_i . p_j,    p_i = [sin(i w_k), cos(i w_k)]_k,  w_k = base^(-2k/d'), k < d'/2

    p_i . p_j = sum_k cos((i - j) w_k)

a function of the distance only (parameter-free). We subtract its value at distance 0 (d'/2), a
constant per query row that softmax ignores, so the bias is 0 on the diagonal and decays
(log-like, then flat around -d'/2) with distance: the same function as q.k + lambda p_i.p_j.

lambda: `scale` (default 1, d' = head dim by default); `per_head: true` multiplies it by
ALiBi-style head factors 2^(-8(h-1)/H) (h = 1..H; head 1 keeps lambda), our option for
ALiBi-like head diversity, off by default.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .alibi import _need_heads
from .cfg import cfg_get
from .position import PositionVariant, alibi_slopes


class Sandwich(PositionVariant):
    name = "sandwich"
    needs_num_heads = True

    def __init__(self, num_heads: int, dim: int, scale: float = 1.0, per_head: bool = False,
                 base: float = 10000.0):
        super().__init__()
        if dim < 2 or dim % 2:
            raise ValueError(f"sandwich dim must be even and >= 2, got {dim}")
        self.num_heads, self.dim, self.scale, self.per_head, self.base = (
            num_heads, dim, scale, per_head, base)
        lam = torch.full((num_heads,), float(scale), device="cpu")
        if per_head:
            s = torch.tensor(alibi_slopes(num_heads), device="cpu")
            lam = lam * s / s[0]
        self.lam = lam  # [h] fp32, plain attr
        self.inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)  # [d'/2]

    @classmethod
    def from_config(cls, attn_cfg, *, head_dim: int, train_length: int,
                    num_heads: Optional[int] = None) -> "Sandwich":
        def opt(key, default):
            return cfg_get(attn_cfg, "sandwich", key, default=default)

        return cls(_need_heads(cls, num_heads), int(opt("dim", head_dim)),
                   scale=float(opt("scale", 1.0)), per_head=bool(opt("per_head", False)),
                   base=float(opt("base", 10000.0)))

    def distance_bias(self, n: int, device: Optional[torch.device] = None) -> Tensor:
        dist = torch.arange(n, device=device, dtype=torch.float32)
        dots = torch.cos(dist[:, None] * self.const("inv_freq", device)[None, :]).sum(-1)  # [n]
        return self.const("lam", device)[:, None] * (dots - self.dim // 2)[None, :]

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, num_heads={self.num_heads}, dim={self.dim}, "
                f"scale={self.scale}, per_head={self.per_head}")
