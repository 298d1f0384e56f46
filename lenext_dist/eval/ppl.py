"""Sliding-window perplexity (DESIGN section 4), the extrapolation penalty and context use.

Convention: a window is W input tokens t[a : a+W]; its prediction at window position p is of
t[a+p+1], with p+1 tokens of context. A document of n tokens has n-1 targets; documents with
fewer than W+1 tokens are skipped by every protocol (so each length is measured on full windows).

Protocols (stride S):
- `last-stride` (the nope_head_scale protocol): windows start at a = 0, S, 2S, ... while
  a+W+1 <= n; each scores only its last S positions [W-S, W), i.e. with >= W-S tokens of context.
  The first W-S targets of a document and a tail shorter than S are never scored.
- `yarn` (YaRN / HF perplexity guide): windows start at 0, S, 2S, ... and end at min(a+W, n-1);
  the first scores all its W positions, each later one only the targets no window has scored yet;
  the last window may be shorter than W. Every target of the document is scored once.
- `full`: non-overlapping windows a = 0, W, 2W, ..., each scoring all W positions (context 1..W).

Budget: windows are interleaved across documents (doc0 w0, doc1 w0, ..., doc0 w1, ...) and taken
in that order until `budget_tokens` targets are scored (whole windows; the exact count is
reported).

Extrapolation penalty (W > L, the training length): per position p >= L of full-protocol windows,
loss with the full context minus the loss of the same target under a window of L tokens (positions
p < L have the same context in both, so their penalty is 0 by definition). The baseline scores
each target as the last-stride protocol at length L with stride S_b does (context L-S_b+1..L, so
it stays in distribution). Context use (a model whose loss stops falling after a few tokens has
nothing to lose past L), paired: every target at window positions [L/2, L) of the full-protocol
windows is scored again with only 5..8 tokens of context (windows of 8 tokens scoring their last
4), and the gain is the mean loss of those short-context predictions minus the mean loss of the
same targets with their L/2+1..L tokens. The unpaired gain (mean loss at positions [4, 8) minus
[L/2, L), i.e. other tokens: the first words of each window's text) is kept for comparison; it
depends on which windows are sampled (document starts are easier or harder than middles).

Public API: `PROTOCOLS`, `plan_document`, `plan_windows`, `evaluate_ppl`, `context_diagnostics`,
`run_ppl`.
"""
from __future__ import annotations

import math
import time
from typing import Optional, Sequence

import numpy as np
from torch import nn

from .data import round_robin
from .options import PROTOCOLS
from .scoring import Window, score_windows

S_EDGES = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)


def plan_document(n: int, W: int, S: int, protocol: str) -> list[tuple[int, int, int, int]]:
    """(start, length, lo, hi) of every window of a document of n tokens."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {PROTOCOLS}")
    if W < 1 or (protocol != "full" and not 1 <= S <= W):
        raise ValueError(f"need 1 <= stride ({S}) <= length ({W})")
    if n < W + 1:
        return []
    if protocol == "last-stride":
        return [(a, W, W - S, W) for a in range(0, n - W, S)]
    if protocol == "full":
        return [(a, W, 0, W) for a in range(0, n - W, W)]
    out, prev_end, a = [(0, W, 0, W)], W, S  # yarn; targets up to index prev_end are scored
    while prev_end < n - 1:
        end = min(a + W, n - 1)
        if end > prev_end:
            out.append((a, end - a, prev_end - a, end - a))
            prev_end = end
        a += S
    return out


def plan_windows(docs: Sequence, W: int, S: int, protocol: str,
                 budget_tokens: Optional[int] = None) -> tuple[list[Window], list[str]]:
    """Windows over all documents, interleaved, cut to the budget; and the skipped documents."""
    per_doc, skipped = [], []
    for i, d in enumerate(docs):
        ws = [Window(i, *t) for t in plan_document(len(d), W, S, protocol)]
        if not ws:
            skipped.append(d.name)
        per_doc.append(ws)
    windows = round_robin(per_doc)
    if budget_tokens is not None:
        kept, total = [], 0
        for w in windows:
            if total >= budget_tokens:
                break
            kept.append(w)
            total += w.scored
        windows = kept
    return windows, skipped


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="win", leave=False, disable=None)


def _curve(windows: Sequence[Window], nlls: Sequence[np.ndarray], W: int, all_positions: bool):
    s, c = np.zeros(W, np.float64), np.zeros(W, np.int64)
    for w, x in zip(windows, nlls):
        a = 0 if all_positions else w.lo
        s[a:a + len(x)] += x
        c[a:a + len(x)] += 1
    return s, c


def _mean_or_none(x: np.ndarray) -> Optional[float]:
    return float(x.mean()) if x.size else None


def _binned(values: np.ndarray, counts: np.ndarray, bins: int) -> dict:
    """Mean of a per-position curve over position bins (weighted by counts): log-spaced (every
    position near the start, wider bins further out) when the curve starts at position 0,
    linear over the scored tail otherwise."""
    W = len(values)
    nz = np.flatnonzero(counts)
    a0 = int(nz[0]) if nz.size else 0
    if a0 > 0:  # only a tail is scored (last-stride): linear bins over it
        edges = np.linspace(a0, W, min(bins, W - a0) + 1).round()
    else:
        edges = np.concatenate([[0], np.geomspace(1, W, min(bins, W) + 1).round()])
    edges = np.unique(edges).astype(int)
    pos, loss = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        n = counts[a:b].sum()
        if n:
            pos.append(float((a + b - 1) / 2))
            loss.append(float((values[a:b] * counts[a:b]).sum() / n))
    return {"position": pos, "loss": loss}


def evaluate_ppl(model: nn.Module, docs: Sequence, W: int, *, stride: int = 256,
                 protocol: str = "last-stride", budget_tokens: Optional[int] = None,
                 batch_size: int = 1, curve_all: bool = False, curve_bins: int = 64,
                 progress: bool = True) -> dict:
    """PPL at evaluation length W under `protocol`, and the mean loss at each window position.

    curve_all: also compute the loss at unscored positions for the per-position curve (costs the
    output layer on all W positions; the PPL still uses the protocol's scored positions only).
    """
    windows, skipped = plan_windows(docs, W, stride, protocol, budget_tokens)
    if not windows:
        raise ValueError(f"no document has {W + 1} tokens: nothing to evaluate at length {W}")
    bar = _progress(len(windows), f"ppl W={W} {protocol}", progress)
    t0 = time.perf_counter()
    nlls = score_windows(model, docs, windows, batch_size=batch_size, all_positions=curve_all,
                         progress=bar)
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    scored = [x[w.lo:w.hi] if curve_all else x for w, x in zip(windows, nlls)]
    n_tok = int(sum(len(x) for x in scored))
    nll = float(sum(float(x.astype(np.float64).sum()) for x in scored) / n_tok)
    s, c = _curve(windows, nlls, W, curve_all)
    with np.errstate(invalid="ignore", divide="ignore"):
        curve = np.where(c > 0, s / np.maximum(c, 1), np.nan)
    used = sorted({w.doc for w in windows})
    return {
        "length": W, "protocol": protocol, "stride": stride if protocol != "full" else W,
        "budget_tokens": budget_tokens, "windows": len(windows), "scored_tokens": n_tok,
        "nll": nll, "ppl": math.exp(nll),
        "documents_used": [docs[i].name for i in used], "documents_skipped": skipped,
        "seconds": seconds, "scored_tokens_per_s": n_tok / max(seconds, 1e-9),
        "position_curve": {"scope": "all positions" if curve_all else "scored positions",
                           "loss": [None if np.isnan(v) else round(float(v), 6) for v in curve],
                           "count": c.tolist()},
        "position_curve_binned": _binned(np.nan_to_num(curve), c, curve_bins),
    }


def _penalty_stride(lengths: Sequence[int], L: int, penalty_stride: Optional[int]) -> int:
    """The baseline windows' stride S_b (default L/4): <= L and a divisor of every W - L > 0."""
    Sb = penalty_stride or max(1, L // 4)
    bad = [W for W in lengths if W > L and ((W - L) % Sb or Sb > L)]
    if bad:
        raise ValueError(f"penalty stride {Sb} must be <= L={L} and divide W-L for every length W > L; "
                         f"it does not for {bad}: choose --penalty-stride (e.g. a divisor of "
                         f"{math.gcd(*[W - L for W in bad])}) or --no-penalty")
    return Sb


SHORT_CONTEXT = 4  # the paired measure's short windows: 8 tokens, scoring positions [4, 8)


def _short_context_windows(main: Sequence[Window], L: int) -> list[Window]:
    """Windows of 8 tokens that score the targets of positions [L/2, L) of every main window, 4 at
    a time, each with 5..8 tokens of context: position SHORT_CONTEXT + j of the window starting at
    w.start + p0 - SHORT_CONTEXT predicts the same token as position p0 + j of w."""
    k = SHORT_CONTEXT
    if L // 2 < k:
        return []
    return [Window(w.doc, w.start + p0 - k, k + min(k, L - p0), k, k + min(k, L - p0))
            for w in main for p0 in range(L // 2, L, k)]


def _context_use(model, docs, full, short, curve, L, batch_size, bar) -> dict:
    lo, hi = curve[4:min(8, len(curve))], curve[L // 2:L]
    out = {"loss_pos_4_8": _mean_or_none(lo), "loss_pos_halfL_L": _mean_or_none(hi),
           "gain_unpaired": (float(lo.mean() - hi.mean()) if lo.size and hi.size else None),
           "gain": None, "targets": 0,
           "note": "gain: mean loss of the targets at positions [L/2, L) with 5..8 tokens of "
                   "context minus with their full L/2+1..L (same tokens); ~0 = context unused. "
                   "gain_unpaired: loss at positions [4, 8) minus [L/2, L) (other tokens)"}
    if not short:
        return out
    # many tiny windows: batch them widely (8 tokens each, the memory is negligible)
    nll = score_windows(model, docs, short, batch_size=max(batch_size, 64), progress=bar)
    # the short windows run over each main window's positions [L/2, L) in order
    a = np.concatenate([x.astype(np.float64) for x in nll])
    b = np.concatenate([x[L // 2:L].astype(np.float64) for x in full])
    out.update({"gain": float(a.mean() - b.mean()), "targets": int(a.size),
                "loss_short_context": float(a.mean()), "loss_full_context": float(b.mean())})
    return out


def context_diagnostics(model: nn.Module, docs: Sequence, W: int, L: int, *,
                        penalty_stride: Optional[int] = None, budget_tokens: Optional[int] = None,
                        batch_size: int = 1, progress: bool = True) -> dict:
    """Extrapolation penalty (if W > L) and context use (if W >= L) on full-protocol windows."""
    out: dict = {"length": W, "train_length": L}
    if W < L:
        return {**out, "note": f"length {W} < training length {L}: nothing to measure"}
    Sb = _penalty_stride([W], L, penalty_stride)
    main, _ = plan_windows(docs, W, W, "full", budget_tokens)
    if not main:
        raise ValueError(f"no document has {W + 1} tokens")
    base = [Window(w.doc, w.start + j * Sb, L, L - Sb, L)
            for w in main for j in range(1, (W - L) // Sb + 1)]
    short = _short_context_windows(main, L)
    bar = _progress(len(main) + len(short) + len(base), f"penalty W={W} L={L}", progress)
    full = score_windows(model, docs, main, batch_size=batch_size, progress=bar)
    s, c = _curve(main, full, W, True)
    curve = s / np.maximum(c, 1)
    out["context_use"] = _context_use(model, docs, full, short, curve, L, batch_size, bar)
    out["windows"] = len(main)
    b_nll = score_windows(model, docs, base, batch_size=batch_size, progress=bar) if base else []
    if bar is not None:
        bar.close()
    if W == L:
        return out
    pen_sum, pen_cnt = np.zeros(W), np.zeros(W, np.int64)
    k = (W - L) // Sb
    for i in range(len(main)):
        for j in range(1, k + 1):
            x = b_nll[i * k + j - 1]  # baseline window at start + j*Sb: main positions below
            p0 = j * Sb + L - Sb
            pen_sum[p0:p0 + Sb] += full[i][p0:p0 + Sb] - x
            pen_cnt[p0:p0 + Sb] += 1
    pen = np.where(pen_cnt > 0, pen_sum / np.maximum(pen_cnt, 1), 0.0)
    s_of_p = (np.arange(W) + 1) / L  # context length / L
    by_s = []
    for a, b in zip(S_EDGES[:-1], S_EDGES[1:]):
        sel = (s_of_p > a) & (s_of_p <= b) & (pen_cnt > 0)
        if sel.any():
            by_s.append({"s_from": a, "s_to": b, "penalty": float(pen[sel].mean()),
                         "loss_full": float(curve[sel].mean()),
                         "loss_window_L": float((curve[sel] - pen[sel]).mean())})
    out.update({
        "penalty_stride": Sb, "baseline_windows": len(base),
        "penalty_mean": float(pen[L:].mean()),
        "penalty_by_s": by_s,
        "penalty_binned": _binned(pen, (pen_cnt > 0).astype(np.int64), 64),
        "loss_full_binned": _binned(curve, c, 64),
    })
    return out


def run_ppl(model: nn.Module, docset, lengths: Sequence[int], *, stride: int = 256,
            protocol: str = "last-stride", budget_tokens: Optional[int] = None,
            batch_size: int = 1, curve_all: bool = False, penalty: bool = True,
            penalty_stride: Optional[int] = None, train_length: Optional[int] = None,
            progress: bool = True) -> dict:
    """Every length (and, if `penalty` and L is known, the context diagnostics): one result dict."""
    if penalty and train_length:  # before any work: a bad length would lose the finished ones
        _penalty_stride(lengths, train_length, penalty_stride)
    results, diags = [], []
    for W in lengths:
        st = min(stride, W)
        results.append(evaluate_ppl(model, docset.docs, W, stride=st, protocol=protocol,
                                    budget_tokens=budget_tokens, batch_size=batch_size,
                                    curve_all=curve_all, progress=progress))
        if penalty and train_length and W >= train_length:
            diags.append(context_diagnostics(model, docset.docs, W, train_length,
                                             penalty_stride=penalty_stride,
                                             budget_tokens=budget_tokens,
                                             batch_size=batch_size, progress=progress))
    return {"kind": "ppl", "protocol": protocol, "stride": stride, "budget_tokens": budget_tokens,
            "batch_size": batch_size, "train_length": train_length,
            "convention": "window = W input tokens t[a:a+W]; position p predicts t[a+p+1] "
                          "with p+1 tokens of context; documents with < W+1 tokens skipped",
            "data": docset.describe(), "results": results, "diagnostics": diags}
