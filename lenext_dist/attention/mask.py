"""Masks that restrict causal attention further, composable with every position variant.

- Sliding window W (local attention; "super strong baseline" when W = training length): query i
  sees keys j with i - W < j <= i, i.e. the last W tokens including itself.
- Blockwise causal attention (Sun et al. 2022, XPOS, arXiv:2212.10554 sec. 3.3) with block B (the
  training length): positions split into blocks [nB, (n+1)B); a query of block n sees the causal
  part of blocks n - 1 and n. Up to 2B tokens this is plain causal attention.
- Chunked attention C (Llama 4's `attention_chunk_size` on its RoPE layers, iRoPE): positions
  split into chunks [nC, (n+1)C); a query sees the causal part of its own chunk only
  (transformers.masking_utils.chunked_overlay: k // C == q // C). Up to C tokens this is plain
  causal attention.

Both are functions of absolute positions; `first_key` gives the lowest key a query chunk can see,
which lets the chunked path build only [chunk, W + chunk] blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class MaskSpec:
    window: Optional[int] = None
    """Each query sees the last `window` keys (itself included); None: unlimited."""
    block: Optional[int] = None
    """Blockwise causal: own block and the previous one; None: off."""
    chunked: Optional[int] = None
    """Chunked causal: own chunk only; None: off."""

    @property
    def causal_only(self) -> bool:
        return self.window is None and self.block is None and self.chunked is None

    def first_key(self, q_start: int) -> int:
        """Lowest key position visible to any query at absolute position >= q_start."""
        lo = 0
        if self.window is not None:
            lo = max(lo, q_start - self.window + 1)
        if self.block is not None:
            lo = max(lo, (q_start // self.block - 1) * self.block)
        if self.chunked is not None:
            lo = max(lo, q_start // self.chunked * self.chunked)
        return lo

    def visible_counts(self, n: int) -> Tensor:
        """How many keys each query 0..n-1 of a sequence of n sees: [n] int64 (i + 1 causal)."""
        i = torch.arange(n)
        lo = torch.zeros_like(i)
        if self.window is not None:
            lo = torch.maximum(lo, i - self.window + 1)
        if self.block is not None:
            lo = torch.maximum(lo, (torch.div(i, self.block, rounding_mode="floor") - 1) * self.block)
        if self.chunked is not None:
            lo = torch.maximum(lo, torch.div(i, self.chunked, rounding_mode="floor") * self.chunked)
        return i + 1 - lo

    def visible(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Boolean [..., c, n], True = visible, for positions q_pos [..., c], k_pos [..., n]
        (absolute positions, or positions inside documents with a leading batch dim)."""
        q, k = q_pos[..., :, None], k_pos[..., None, :]
        vis = k <= q
        if self.window is not None:
            vis = vis & (q - k < self.window)
        if self.block is not None:
            vis = vis & (torch.div(k, self.block, rounding_mode="floor")
                         >= torch.div(q, self.block, rounding_mode="floor") - 1)
        if self.chunked is not None:
            vis = vis & (torch.div(k, self.chunked, rounding_mode="floor")
                         == torch.div(q, self.chunked, rounding_mode="floor"))
        return vis

    def mask_mod(self, offset: int):
        """A FlexAttention mask_mod(b, h, q_idx, kv_idx) for queries at absolute q_idx + offset."""
        window, block, chunked = self.window, self.block, self.chunked

        def mod(b, h, q_idx, kv_idx):
            q = q_idx + offset
            vis = kv_idx <= q
            if window is not None:
                vis = vis & (q - kv_idx < window)
            if block is not None:
                vis = vis & (kv_idx // block >= q // block - 1)
            if chunked is not None:
                vis = vis & (kv_idx // chunked == q // chunked)
            return vis

        return mod
