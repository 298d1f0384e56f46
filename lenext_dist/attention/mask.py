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
which lets the chunked path build only [chunk, W + chunk] blocks. `tiles` gives the same facts
per (query tile, key tile) from the window/block/chunk arithmetic alone, so a FlexAttention block
mask (`block_mask_from_tiles`) never evaluates mask_mod over [L, L] (torch's create_block_mask
without compile does: 1 GiB of booleans at 32K).
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

    def tiles(self, s: int, block_size: int) -> tuple[Tensor, Tensor]:
        """(any, full), boolean [n, n] with n = ceil(s / block_size): some / every (query, key)
        pair of tile (qb, kb) is visible, for a sequence of s tokens (queries at 0..s-1).

        Per constraint, from the extreme positions of the two tiles (qlo..qhi, klo..khi):
        causal k <= q; window q - k < W (distance qlo - khi .. qhi - klo); blocks
        k // B >= q // B - 1; chunks k // C == q // C. `any` is the AND of the per-constraint
        "some pair" conditions (a superset: such a tile is computed with mask_mod), `full` the
        AND of the "every pair" ones (exact: the tile skips mask_mod)."""
        n = -(-s // block_size)
        lo = torch.arange(n) * block_size
        hi = torch.clamp(lo + block_size - 1, max=s - 1)
        qlo, qhi, klo, khi = lo[:, None], hi[:, None], lo[None, :], hi[None, :]
        any_vis, full = klo <= qhi, khi <= qlo
        if self.window is not None:
            any_vis = any_vis & (qlo - khi < self.window)
            full = full & (qhi - klo < self.window)
        if self.block is not None:
            b = self.block
            any_vis = any_vis & (khi // b >= qlo // b - 1)
            full = full & (klo // b >= qhi // b - 1)
        if self.chunked is not None:
            c = self.chunked
            any_vis = any_vis & (khi // c >= qlo // c) & (klo // c <= qhi // c)
            full = full & (qlo // c == qhi // c) & (klo // c == khi // c) & (qlo // c == klo // c)
        return any_vis, full & any_vis


def block_mask_from_tiles(any_vis: Tensor, full: Tensor, mask_mod, block_size: int, s: int):
    """A FlexAttention BlockMask from tile tables any_vis, full [(b,) nq, nk] (full implies
    any_vis): full tiles skip mask_mod, the other visible ones call it, the rest are skipped.
    Only [(b,) 1, nq, nk] index tables are built (BlockMask.from_kv_blocks)."""
    from torch.nn.attention.flex_attention import BlockMask

    if any_vis.dim() == 2:
        any_vis, full = any_vis[None], full[None]
    partial = any_vis & ~full

    def tables(sel: Tensor) -> tuple[Tensor, Tensor]:
        counts = sel.sum(-1).to(torch.int32)  # [b, nq]
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[:, None], order[:, None]  # [b, 1, nq], [b, 1, nq, nk]

    kv_num, kv_idx = tables(partial)
    full_num, full_idx = tables(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size,
                                    mask_mod=mask_mod, seq_lengths=(s, s))
