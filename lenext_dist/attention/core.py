"""Causal attention with a per-head softmax scale: the one function both megatron and HF call.

Layout (batch-first, heads before sequence, as `torch.nn.functional.scaled_dot_product_attention`):

    q [b, h, sq, d]    k, v [b, g, sk, d]    m [h] fp32    ->    out [b, h, sq, d]

- GQA: g divides h; query head j reads key/value group j // (h // g) (megatron's fused-QKV
  grouping and HF's `repeat_kv` both use this order). SDPA gets enable_gqa where flash can run
  (CUDA half precision, no mask) and on CPU; elsewhere k/v are repeated to h heads so the
  memory-efficient kernel, not the [b, h, sq, sk] math kernel, runs (`paths.sdpa_call`).
- Scale: the logits of head j are lambda_j q.k with lambda_j = m_j / sqrt(d) (the paper's
  HeadScale parametrization). m is a python float for a fixed uniform scale c: it goes to SDPA's
  `scale=` (c / sqrt(d)) and q reaches the kernel untouched; m [h] (learned or per-head scales)
  is folded into q in fp32 (`paths.scaled_query`) under SDPA's default 1/sqrt(d). Either way no
  [b, h, sq, sk] tensor is materialized by this code and fused kernels (flash on GPU) stay usable.
- Causality: query i (0-based among the sq queries) sits at absolute position sk - sq + i and
  sees keys 0..sk - sq + i (bottom-right alignment; sq == sk in training and scoring, sq < sk when
  decoding with a KV cache).

`attend` adds the position variant (rotation, optional per-position scale, optional distance bias
and window/block mask: those run on one of `BIAS_IMPLS`, see paths.py, chosen by `variant.impl`);
`eager_causal_attention` / `iter_attention_probs` are the explicit-softmax reference, computed in
fp32 by query chunks (for tests, for variants with a score_mod, and for attention entropy).

Packed documents (`documents`, see documents.py): keys of other documents are hidden and positions
count from each document's start; every path above honours it (the SDPA fast path then gives way
to a masked kernel: chunked on CPU under autograd, FlexAttention where it runs).
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, Optional, Union

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch import Tensor

from .backends import note_impl
from .documents import Documents
from .mask import MaskSpec
from .paths import (chunked_attention, choose_impl, flex_path_attention, head_tensor,
                    query_and_scale, scaled_query, sdpa_kv, sdpa_mask_attention)

ScoreMod = Callable[[Tensor, Tensor, Tensor], Tensor]

# kernels for variants with a distance bias or a window/block mask (`attention.impl`); "eager"
# is `eager_causal_attention`, "auto" resolves in `paths.choose_impl`
BIAS_IMPLS = {
    "chunked": chunked_attention,
    "sdpa_mask": sdpa_mask_attention,
    "flex": flex_path_attention,
}
IMPL_NAMES = ("auto", "eager", *BIAS_IMPLS)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, m: Tensor) -> None:
    b, h, sq, d = q.shape
    g, sk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if h % g:
        raise ValueError(f"{g} key/value groups do not divide {h} query heads")
    if sq > sk:
        raise ValueError(f"more queries ({sq}) than keys ({sk})")
    if isinstance(m, Tensor) and m.shape != (h,):
        raise ValueError(f"head multiplier m must have shape [{h}], got {tuple(m.shape)}")


def causal_attention(q: Tensor, k: Tensor, v: Tensor, m: Tensor,
                     q_scale: Optional[Tensor] = None) -> Tensor:
    """SDPA fast path: q [b, h, sq, d], k/v [b, g, sk, d], m [h], q_scale [sq] -> [b, h, sq, d]."""
    _check_shapes(q, k, v, m)
    sq, sk = q.shape[2], k.shape[2]
    qs, scale = query_and_scale(q, m, q_scale)  # a float m: SDPA's scale=, q untouched
    # fewer queries than keys (KV-cache decoding, the last layer's scored rows): SDPA's is_causal
    # is top-left aligned; a lower-right CausalBias (torch.nn.attention.bias) runs CUDA's flash /
    # memory-efficient kernels without an [sq, sk] mask (2 GiB at 32K x 64K), and materializes
    # the same boolean mask where they cannot run (the CPU). sq == 1 sees every key: no mask.
    mask = None if sq in (1, sk) else causal_lower_right(sq, sk)
    k, v, gqa = sdpa_kv(q, k, v, masked=mask is not None)  # repeat KV where flash cannot run
    if sq == sk:
        return F.scaled_dot_product_attention(qs, k, v, is_causal=True, enable_gqa=gqa,
                                              scale=scale)
    return F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, enable_gqa=gqa, scale=scale)


def _causal_mask(sq: int, sk: int, device, q_start: int = 0, q_end: Optional[int] = None) -> Tensor:
    """Boolean [q_end - q_start, sk], True = visible, for queries q_start..q_end-1 of sq."""
    q_end = sq if q_end is None else q_end
    q_pos = torch.arange(q_start, q_end, device=device) + (sk - sq)  # absolute positions
    return torch.arange(sk, device=device)[None, :] <= q_pos[:, None]


def iter_attention_probs(q: Tensor, k: Tensor, m: Tensor, *, chunk_size: int = 1024,
                         q_scale: Optional[Tensor] = None, score_mod: Optional[ScoreMod] = None,
                         documents: Optional[Documents] = None, mask=None,
                         ) -> Iterator[tuple[int, Tensor]]:
    """Explicit softmax by query chunks, in fp32.

    q [b, h, sq, d], k [b, g, sk, d] -> yields (start, probs [b, h, c, sk]) for query rows
    start..start+c-1. Peak extra memory is b*h*chunk_size*sk fp32 (choose chunk_size for 16K).
    `score_mod(scores, q_pos, k_pos)` gets raw fp32 logits [b, h, c, sk] (already scaled) and
    absolute positions q_pos [c], k_pos [sk]; masked entries are set to -inf after it.
    With `documents` (sq == sk), score_mod gets positions inside documents q_pos [b, c],
    k_pos [b, sk] and keys of other documents are hidden. `mask` (the variant's MaskSpec: window,
    blocks, chunks) hides keys with or without documents.
    """
    b, h, sq, d = q.shape
    g, sk = k.shape[1], k.shape[2]
    qs = scaled_query(q, head_tensor(m, h, q.device), q_scale).float()
    kf = k.float().repeat_interleave(h // g, dim=1)  # [b, h, sk, d]
    k_pos = torch.arange(sk, device=q.device)
    for start in range(0, sq, chunk_size):
        end = min(start + chunk_size, sq)
        scores = torch.matmul(qs[:, :, start:end], kf.transpose(-1, -2)) / math.sqrt(d)
        if documents is not None:
            pos = documents.positions
            if score_mod is not None:
                scores = score_mod(scores, pos[:, start:end], pos)
            visible = documents.visible(k_pos[start:end], k_pos,
                                        MaskSpec() if mask is None else mask)[:, None]  # [b, 1, c, sk]
            scores = scores.masked_fill(~visible, float("-inf"))
            yield start, torch.softmax(scores, dim=-1)
            continue
        if score_mod is not None:
            scores = score_mod(scores, k_pos[start:end] + (sk - sq), k_pos)
        visible = (_causal_mask(sq, sk, q.device, start, end) if mask is None
                   else mask.visible(k_pos[start:end] + (sk - sq), k_pos))  # [c, sk]
        scores = scores.masked_fill(~visible, float("-inf"))
        yield start, torch.softmax(scores, dim=-1)


def eager_causal_attention(q: Tensor, k: Tensor, v: Tensor, m: Tensor, *,
                           q_scale: Optional[Tensor] = None, score_mod: Optional[ScoreMod] = None,
                           chunk_size: int = 1024, documents: Optional[Documents] = None,
                           mask=None) -> Tensor:
    """Reference path: same contract as `causal_attention` (+ score_mod), computed in fp32 by query
    chunks, returned in q.dtype. Differentiable (used as the slow path of score_mod variants)."""
    _check_shapes(q, k, v, m)
    h, g = q.shape[1], k.shape[1]
    vf = v.float().repeat_interleave(h // g, dim=1)  # [b, h, sk, d]
    outs = [torch.matmul(p, vf) for _, p in iter_attention_probs(
        q, k, m, chunk_size=chunk_size, q_scale=q_scale, score_mod=score_mod,
        documents=documents, mask=mask)]
    return torch.cat(outs, dim=2).to(q.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, m: Tensor, variant,
           positions: Union[Tensor, int, None] = None, *, eager: bool = False,
           documents: Optional[Documents] = None, keys_rotated: bool = False) -> Tensor:
    """The whole attention function of a variant: rotate, scale, causal softmax, weight values.

    q [b, h, sq, d], k/v [b, g, sk, d] (k not yet rotated unless keys_rotated), m [h] fp32 ->
    [b, h, sq, d] in q.dtype.
    variant: a `position.PositionVariant` (its hooks; not imported here: position.py imports this
    module for `PositionVariant.forward`, and imports run one way).
    positions: absolute positions of the queries, which are also those of the last sq keys: a
    tensor [sq] or an int start; default sk - sq (0..s-1 without a cache).
    keys_rotated: k is rotated already (a KV cache's keys: callers rotate the new ones before
    caching them), so only the queries turn here and decoding copies no key; required when
    sq < sk.
    `eager=True` forces the explicit-softmax reference path (tests).
    documents: packed documents of the batch (ids [b, s]; no KV cache): each document attends
    within itself, with positions counted from its start (`positions` must then be None).
    """
    sq, sk = q.shape[2], k.shape[2]
    if documents is not None:
        if sq != sk or positions is not None:
            raise ValueError("document masking runs full sequences only (no KV cache, no "
                             "explicit positions: they count from each document's start)")
        documents.check(q)
        if documents.single:  # one document per row: the causal function, on its fast paths
            documents = None
        else:
            positions = documents.positions  # [b, s]
    if positions is None:
        positions = sk - sq
    if keys_rotated:  # the new keys' second rotation is dropped: [b, g, sq, d], no cache copy
        q, _ = variant.rotate(q, k[:, :, sk - sq:], positions)
    elif sq == sk:
        q, k = variant.rotate(q, k, positions)
    else:
        raise ValueError(f"{sq} queries for {sk} keys: pass the keys rotated (keys_rotated=True), "
                         "as a KV cache holds them")
    pos = (torch.arange(positions, positions + sq, device=q.device)
           if isinstance(positions, int) else positions)
    q_scale = variant.query_scale(pos)
    score_mod = variant.score_mod
    if eager:
        return eager_causal_attention(q, k, v, m, q_scale=q_scale, score_mod=score_mod,
                                      documents=documents, mask=variant.mask)
    if score_mod is None and documents is None:
        note_impl("sdpa")
        return causal_attention(q, k, v, m, q_scale=q_scale)
    # a distance bias and/or a window/block mask: one of paths.BIAS_IMPLS (variant.impl)
    _check_shapes(q, k, v, m)
    bias = variant.bias_table(sk, q.device) if variant.has_bias else None
    impl = choose_impl(variant.impl, q, k, v, bias, m, q_scale)
    note_impl(impl, f"auto on {q.device.type}" if variant.impl == "auto" else
              "" if impl == variant.impl else f"{variant.impl} cannot run here")
    if impl == "eager":
        return eager_causal_attention(q, k, v, m, q_scale=q_scale, score_mod=score_mod,
                                      chunk_size=variant.chunk_size, documents=documents,
                                      mask=variant.mask)
    return BIAS_IMPLS[impl](q, k, v, m, q_scale=q_scale, bias=bias, mask=variant.mask,
                            chunk_size=variant.chunk_size, documents=documents)
