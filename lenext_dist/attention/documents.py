"""Document masking of packed sequences: attention stays within each document of a row.

A training row of L tokens packs several documents end to end (megatron's GPTDataset). With
`Documents`, query i sees key j only when j <= i and both belong to the same document (megatron's
`reset_attention_mask` semantics, gpt_dataset.py `_get_ltor_masks_and_position_ids`: the EOD
token ends its document, the next token starts a new one), and position-dependent variants count
positions from the document's start (megatron's `reset_position_ids`), so each document gets the
function it gets alone:

- RoPE (+ PI/NTK/YaRN) and XPOS rotate by the position inside the document (their logits depend
  on i - j only, so within a document this changes rounding only; XPOS's key scales stay in range);
- the log-length scale t_i = 1 + a ln max(1, i / L) takes i = tokens the query sees in its document;
- XPOS's blockwise mask counts its blocks from the document start;
- ALiBi, KERPLE, Sandwich and the sliding window depend on the distance i - j only: unchanged
  inside a document (cross-document pairs are hidden anyway).

Document ids come from the token batch: a new document starts after every EOS and at every BOS
(`from_tokens`); a BOS right after an EOS starts one document, not two. The first document of a
row may be the tail of a document cut by packing: it is a document of its own here, as in
megatron.

Layout: ids, positions, starts [b, s] int64 (row-wise nondecreasing ids). Nothing here builds an
[L, L] tensor: kernels ask for visibility blocks [b, c, n] of a query chunk (`visible`), the lowest
key a chunk can see (`first_key`), or a FlexAttention block mask built from per-block document
ranges (`flex_block_mask`: [b, L/128, L/128], no [b, L, L] mask).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .mask import MaskSpec, block_mask_from_tiles


class Documents:
    """Document structure of a packed batch (see the module docstring)."""

    def __init__(self, ids: Tensor):
        if ids.dim() != 2:
            raise ValueError(f"document ids must be [batch, seq], got {tuple(ids.shape)}")
        self.ids = ids.long()  # [b, s]
        b, s = ids.shape
        idx = torch.arange(s, device=ids.device).expand(b, s)
        new = torch.ones_like(self.ids, dtype=torch.bool)
        new[:, 1:] = self.ids[:, 1:] != self.ids[:, :-1]
        # absolute index of each token's document start: running max of the start indices
        self.starts = torch.where(new, idx, torch.zeros_like(idx)).cummax(dim=1).values  # [b, s]
        self.positions = idx - self.starts  # [b, s]: position inside the document
        self._flex: dict = {}  # block masks per (mask, block size), built once per batch
        self._single: Optional[bool] = None

    @classmethod
    def from_tokens(cls, tokens: Tensor, *, eos_id: Optional[int] = None,
                    bos_id: Optional[int] = None) -> "Documents":
        """tokens [b, s] -> documents split after each `eos_id` and before each `bos_id`."""
        return cls(document_ids(tokens, eos_id=eos_id, bos_id=bos_id))

    @property
    def single(self) -> bool:
        """Every row is one document: plain causal attention computes the same function (the
        SDPA fast path stays). One device sync per batch, cached."""
        if self._single is None:
            self._single = bool((self.ids[:, -1] == self.ids[:, 0]).all())
        return self._single

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.ids.shape)

    def check(self, q: Tensor) -> None:
        if (q.shape[0], q.shape[2]) != self.shape:
            raise ValueError(f"document ids {self.shape} do not match q [b={q.shape[0]}, "
                             f"s={q.shape[2]}]")

    def first_keys(self, chunk_size: int, mask: MaskSpec) -> list[int]:
        """The lowest key index any query of any row in each query chunk 0, chunk_size, ... can
        see (its document's start, the window included), as python ints: one device sync per
        batch and (chunk_size, mask), cached (every layer of a forward shares it)."""
        key = ("first_keys", chunk_size, mask)
        if key not in self._flex:
            q_starts = range(0, self.shape[1], chunk_size)
            los = self.starts[:, ::chunk_size].min(dim=0).values.tolist()  # starts nondecreasing
            if mask.window is not None:
                los = [max(lo, a - mask.window + 1) for a, lo in zip(q_starts, los)]
            self._flex[key] = los
        return self._flex[key]

    def visible(self, q_idx: Tensor, k_idx: Tensor, mask: MaskSpec) -> Tensor:
        """Boolean [b, c, n], True = visible, for absolute query indices q_idx [c] and keys
        k_idx [n]: same document, causal, and the window/blocks in document positions."""
        same = self.ids[:, q_idx][:, :, None] == self.ids[:, k_idx][:, None, :]
        # inside one document, k <= q in document positions is k <= q in indices
        return same & mask.visible(self.positions[:, q_idx], self.positions[:, k_idx])

    def mask_mod(self, mask: MaskSpec):
        """FlexAttention mask_mod(b, h, q_idx, kv_idx) of `visible`."""
        ids, pos = self.ids, self.positions
        window, block, chunked = mask.window, mask.block, mask.chunked

        def mod(b, h, q_idx, kv_idx):
            vis = (ids[b, q_idx] == ids[b, kv_idx]) & (kv_idx <= q_idx)
            if window is not None:
                vis = vis & (q_idx - kv_idx < window)
            if block is not None:
                vis = vis & (pos[b, kv_idx] // block >= pos[b, q_idx] // block - 1)
            if chunked is not None:
                vis = vis & (pos[b, kv_idx] // chunked == pos[b, q_idx] // chunked)
            return vis

        return mod

    def flex_block_mask(self, mask: MaskSpec, block_size: int = 128):
        """A FlexAttention BlockMask of `visible`, built from per-block document id ranges:
        tile (Q block, KV block) is skipped when it is above the diagonal, outside the window, or
        when the two blocks share no document; fully visible tiles (below the diagonal, one
        document, no window/block cut) skip mask_mod. [b, 1, nq, nk] block tables, no [L, L]."""
        key = (mask, block_size)
        if key in self._flex:
            return self._flex[key]
        b, s = self.shape
        n = -(-s // block_size)
        pad = n * block_size - s
        ids = torch.nn.functional.pad(self.ids, (0, pad), value=-1) if pad else self.ids
        blocks = ids.view(b, n, block_size)
        real = torch.arange(n * block_size, device=ids.device).view(n, block_size) < s
        lo = blocks[:, :, 0]  # first id of each block (ids are nondecreasing)
        hi = torch.where(real[None], blocks, torch.full_like(blocks, -1)).max(-1).values  # [b, n]
        qi = torch.arange(n, device=ids.device)
        share = (lo[:, :, None] <= hi[:, None, :]) & (lo[:, None, :] <= hi[:, :, None])  # [b, q, k]
        below = qi[None, :, None] >= qi[None, None, :]
        any_vis = share & below
        full = (qi[None, :, None] > qi[None, None, :]) & (lo == hi)[:, :, None] & \
            (lo == hi)[:, None, :] & (lo[:, :, None] == lo[:, None, :])
        if mask.window is not None:
            # closest pair of tiles (q, k): distance (q - k - 1) * bs + 1; farthest (q - k + 1) * bs - 1
            gap = (qi[:, None] - qi[None, :]) * block_size
            any_vis = any_vis & (gap - block_size + 1 < mask.window)[None]
            full = full & (gap + block_size - 1 < mask.window)[None]
        if mask.block is not None or mask.chunked is not None:
            full = torch.zeros_like(full)  # blocks/chunks in document positions: mask_mod decides
        full = full & any_vis
        bm = block_mask_from_tiles(any_vis, full, self.mask_mod(mask), block_size, s)
        self._flex[key] = bm
        return bm


def document_ids(tokens: Tensor, *, eos_id: Optional[int] = None,
                 bos_id: Optional[int] = None) -> Tensor:
    """tokens [b, s] -> document ids [b, s] int64 (0 for the first document of each row): a new
    document starts after every `eos_id` and at every `bos_id` (at most one start per token)."""
    if eos_id is None and bos_id is None:
        raise ValueError("document ids need an EOS or a BOS id")
    start = torch.zeros_like(tokens, dtype=torch.bool)
    if eos_id is not None:
        start[:, 1:] |= tokens[:, :-1] == eos_id
    if bos_id is not None:
        start[:, 1:] |= tokens[:, 1:] == bos_id
    return start.long().cumsum(dim=1)
