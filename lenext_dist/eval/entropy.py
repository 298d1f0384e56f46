"""Attention entropy per position (DESIGN section 4): H_i = -sum_j a_ij log a_ij for every head of
every layer, averaged over samples, with the upper bound log(n_i), uniform attention over the n_i keys
query i sees: n_i = i+1 for 0-based query i under causal attention ("log i" 1-based), min(i+1, W)
under a sliding window W (and fewer under XPOS's blockwise mask).

Computed by query chunks with `attention.iter_attention_probs` (fp32): only
[b, h, chunk, L] probabilities exist at a time, never [h, L, L] (one head at 16K is 1 GiB);
q/k of one layer at a time come from `adapter.capture_qk`. The chunk is chosen so a chunk of
probabilities stays under `mem_bytes`.

Public API: `entropy_from_probs`, `entropy_by_position`, `visible_keys`, `evaluate_entropy`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..attention import iter_attention_probs
from .adapter import attention_layers, capture_qk, layout
from .ppl import plan_windows

DEFAULT_MEM_BYTES = 256 << 20


def entropy_from_probs(p: Tensor, dim: int = -1) -> Tensor:
    """-sum p log p along `dim` (0 log 0 = 0), in fp32."""
    p = p.float()
    return -torch.special.xlogy(p, p).sum(dim)


def auto_chunk(b: int, h: int, sk: int, mem_bytes: int = DEFAULT_MEM_BYTES) -> int:
    """Query rows per chunk so that b*h*chunk*sk fp32 probabilities fit in mem_bytes
    (the softmax needs ~3 such buffers: scores, masked scores, probabilities)."""
    return max(1, min(sk, mem_bytes // (3 * 4 * max(1, b * h * sk))))


def entropy_by_position(q: Tensor, k: Tensor, m: Tensor, *, chunk_size: Optional[int] = None,
                        q_scale: Optional[Tensor] = None, score_mod=None,
                        mem_bytes: int = DEFAULT_MEM_BYTES) -> Tensor:
    """q [b, h, s, d], k [b, g, s, d] (rotated), m [h] -> entropy [b, h, s] fp32."""
    b, h, s, _ = q.shape
    chunk = chunk_size or auto_chunk(b, h, k.shape[2], mem_bytes)
    out = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
    for start, probs in iter_attention_probs(q, k, m, chunk_size=chunk, q_scale=q_scale,
                                             score_mod=score_mod):
        out[:, :, start:start + probs.shape[2]] = entropy_from_probs(probs)
    return out


def _position_hooks(attn: nn.Module, s: int, device):
    """(q_scale, score_mod) of a lenext attention's position variant, else (None, None)."""
    pos = getattr(attn, "position", None)
    if pos is None:
        return None, None
    qs = pos.query_scale(torch.arange(s, device=device))
    return qs, getattr(pos, "score_mod", None)


def visible_keys(model: nn.Module, n: int) -> np.ndarray:
    """[layers, n] int: keys query i (0..n-1) of each attention layer sees, its mask's
    visible_counts (a window, a layout's local layers, chunks, blocks); i + 1 (causal) where the
    model holds no mask (a stock export, whose sliding window capture_qk refuses)."""
    layers = attention_layers(model)
    masks = [getattr(getattr(a, "position", None), "mask", None) for a in layers] \
        if layout(model) == "lenext" else [None] * len(layers)
    return np.stack([np.arange(1, n + 1) if m is None else m.visible_counts(n).numpy()
                     for m in masks])


def evaluate_entropy(model: nn.Module, docs: Sequence, length: int, *, samples: int = 8,
                     batch_size: int = 1, chunk_size: Optional[int] = None,
                     mem_bytes: int = DEFAULT_MEM_BYTES, progress: bool = True) -> dict:
    """Mean entropy [layers, heads, length] over `samples` windows of `length` tokens
    (non-overlapping windows interleaved across documents).

    Returns numpy arrays: `entropy` [layers, heads, length], `upper_bound` [length] = log(n_i)
    (n_i keys visible to query i, i+1 without a window or block mask; the largest over layers
    when a layout gives layers different windows),
    plus `samples` (windows used) and `windows` (doc name, start)."""
    windows, skipped = plan_windows(docs, length, length, "full", None)
    windows = windows[:samples]
    if not windows:
        raise ValueError(f"no document has {length + 1} tokens")
    layers = attention_layers(model)
    heads = int(model.config.num_attention_heads)
    total = torch.zeros(len(layers), heads, length, dtype=torch.float64)
    kind = layout(model)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(windows) * len(layers), desc=f"entropy L={length}", unit="layer",
                   leave=False, disable=None)

    def on_layer(i, q, k, m):
        qs, mod = _position_hooks(layers[i], q.shape[2], q.device) if kind == "lenext" \
            else (None, None)
        ent = entropy_by_position(q, k, m, chunk_size=chunk_size, q_scale=qs, score_mod=mod,
                                  mem_bytes=mem_bytes)
        total[i] += ent.sum(0).double().cpu()
        if bar is not None:
            bar.update(q.shape[0])

    device = next(model.parameters()).device
    for j in range(0, len(windows), batch_size):
        batch = windows[j:j + batch_size]
        ids = torch.stack([torch.from_numpy(docs[w.doc].tokens[w.start:w.start + length])
                           for w in batch]).to(device)
        capture_qk(model, ids, on_layer)
    if bar is not None:
        bar.close()
    ent = (total / len(windows)).float().numpy()
    # per-layer windows (attention.layout): the most any layer sees, so the bound holds for
    # every layer
    return {"entropy": ent, "upper_bound": np.log(visible_keys(model, length).max(0)),
            "samples": len(windows), "windows": [(docs[w.doc].name, w.start) for w in windows],
            "documents_skipped": skipped}


def summarize_entropy(res: dict, train_length: Optional[int], bins: int = 64) -> dict:
    """JSON-sized view: per-head and averaged curves on log-spaced position bins, and the
    normalized entropy H / log(n_i) (n_i visible keys) at L and at the end."""
    ent = res["entropy"]  # [layers, heads, n]
    n = ent.shape[-1]
    edges = np.unique(np.geomspace(1, n, bins + 1).round().astype(int))
    edges[0] = 0
    centers = [float((a + b - 1) / 2) for a, b in zip(edges[:-1], edges[1:])]
    binned = np.stack([ent[..., a:b].mean(-1) for a, b in zip(edges[:-1], edges[1:])], -1)
    ub = res["upper_bound"]
    ub_b = [float(ub[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])]
    mean = ent.mean((0, 1))
    out = {
        "length": n, "samples": res["samples"], "train_length": train_length,
        "positions": centers, "upper_bound": ub_b,
        "mean": binned.mean((0, 1)).round(6).tolist(),
        "per_layer": binned.mean(1).round(6).tolist(),
        "per_head": binned.round(6).tolist(),
        "mean_at_end": float(mean[-1]), "normalized_at_end": float(mean[-1] / max(ub[-1], 1e-9)),
    }
    if train_length and train_length <= n:
        i = train_length - 1
        out["mean_at_L"] = float(mean[i])
        out["normalized_at_L"] = float(mean[i] / max(ub[i], 1e-9))
    return out
