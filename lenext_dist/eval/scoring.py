"""Per-token losses of batched windows: the one forward-pass primitive every evaluation uses.

A window is W input tokens t[a : a+W] of one document; the prediction at window position p
(0-based) is of t[a+p+1] and has p+1 tokens of context. A window scores positions [lo, hi).

Efficiency: several windows per forward (right-padded: with causal attention the padding never
reaches a real position), `torch.inference_mode`, and the output layer is applied only to the
positions that are scored, in chunks of positions (a [b, 16K, 32K] fp32 logits tensor would be
2 GiB per window): for HF causal LMs with `.model` + `.lm_head` (Llama and our export) the
decoder's last hidden states are projected chunk by chunk (our export's last layer, given
`hidden_from`, computes only the positions from the first scored one on: its queries, attention
output and MLP are skipped for the unscored prefix); any other model falls back to
`model(input_ids).logits` (with `logits_to_keep` when its forward accepts it).

Public API: `Window`, `score_windows`, `batched`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

LOGITS_CHUNK_ELEMENTS = 1 << 26  # 64M fp32 logits (256 MiB) per output-layer chunk


@dataclass(frozen=True)
class Window:
    doc: int      # index of the document
    start: int    # a: first input token (document coordinates)
    length: int   # input tokens; targets are t[a+1 : a+length+1]
    lo: int       # first scored window position
    hi: int       # one past the last scored window position

    @property
    def scored(self) -> int:
        return self.hi - self.lo


def batched(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _hidden_path(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return False
    return isinstance(getattr(model, "lm_head", None), nn.Module) and \
        isinstance(getattr(model, "model", None), nn.Module)


def _accepts(module: nn.Module, argument: str) -> bool:
    try:
        return argument in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def _nll_chunks(hidden: Tensor, targets: Tensor, project, vocab: int) -> Tensor:
    """hidden [b, n, H] (or logits when project is None), targets [b, n] -> nll [b, n] fp32."""
    b, n = targets.shape
    step = max(1, LOGITS_CHUNK_ELEMENTS // max(1, b * vocab))
    out = []
    for i in range(0, n, step):
        h = hidden[:, i:i + step]
        logits = project(h) if project is not None else h
        out.append(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   targets[:, i:i + step].reshape(-1),
                                   reduction="none").view(b, -1))
    return torch.cat(out, dim=1)


def forward_nll(model: nn.Module, input_ids: Tensor, targets: Tensor, keep_from: int,
                keep_to: int) -> Tensor:
    """input_ids, targets [b, T] -> nll [b, keep_to - keep_from] fp32 of positions
    keep_from..keep_to-1 (the output layer only sees those positions)."""
    T = input_ids.shape[1]
    tgt = targets[:, keep_from:keep_to]
    if _hidden_path(model):
        if _accepts(model.model, "hidden_from"):  # our export: the last layer only on the kept
            hidden = model.model(input_ids=input_ids, use_cache=False,
                                 hidden_from=keep_from).last_hidden_state[:, :keep_to - keep_from]
        else:
            hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state
            hidden = hidden[:, keep_from:keep_to]
        return _nll_chunks(hidden, tgt, model.lm_head, model.lm_head.out_features)
    if _accepts(model, "logits_to_keep"):
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=T - keep_from).logits
        logits = logits[:, :keep_to - keep_from]
    else:
        logits = model(input_ids=input_ids).logits[:, keep_from:keep_to]
    return _nll_chunks(logits, tgt, None, logits.shape[-1])


def score_windows(model: nn.Module, docs: Sequence, windows: Sequence[Window], *,
                  batch_size: int = 1, all_positions: bool = False, progress=None,
                  pad_id: int = 0) -> list[np.ndarray]:
    """nll (fp32 numpy) of every window: positions [lo, hi), or [0, length) if all_positions.

    `docs[i].tokens` are int64 numpy arrays; `progress` is an optional tqdm to update by windows.
    """
    device = next(model.parameters()).device
    results: list[np.ndarray] = []
    with torch.inference_mode():
        for batch in batched(list(windows), batch_size):
            T = max(w.length for w in batch)
            ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
            tgt = torch.full((len(batch), T), pad_id, dtype=torch.long)
            for r, w in enumerate(batch):
                toks = docs[w.doc].tokens
                if w.start + w.length + 1 > len(toks):
                    raise ValueError(f"window {w} runs past document {w.doc} ({len(toks)} tokens)")
                ids[r, :w.length] = torch.from_numpy(toks[w.start:w.start + w.length])
                tgt[r, :w.length] = torch.from_numpy(toks[w.start + 1:w.start + w.length + 1])
            lo = 0 if all_positions else min(w.lo for w in batch)
            hi = max(w.length if all_positions else w.hi for w in batch)
            nll = forward_nll(model, ids.to(device), tgt.to(device), lo, hi).cpu().numpy()
            for r, w in enumerate(batch):
                a, b = (0, w.length) if all_positions else (w.lo, w.hi)
                results.append(nll[r, a - lo:b - lo].copy())
            if progress is not None:
                progress.update(len(batch))
    return results
