"""Uniform-scale sweep and the log-length fit (DESIGN section 3, paper App. B).

For every c on a grid, every head of every layer gets lambda = c / sqrt(d) and the per-position
loss is measured on the same full-protocol windows of N tokens (paired: the same targets for every
c, so differences are not text noise). Position p (0-based, p+1 tokens of context) has
s = (p+1) / L with L the training length. Per-position minima are noisy, so positions are grouped
into log-spaced bins and the best c of a bin is the grid value minimizing the bin's mean loss.
Over the bins with s > 1 the fit is c(s) = 1 + a ln s (least squares through c(1) = 1), with
R^2 = 1 - SS_res / SS_tot around the bins' mean best c.

`best_c_for_length(json, target_len)` turns a sweep into the scale for a target length:
c(target_len / L) from the fit (the paper's 1.2 / 1.5 / 1.8 at 2x / 4x / 8x are such values),
or the grid value minimizing the mean loss over all positions when method="mean" (only for a
sweep run at that length).

Public API: `make_grid`, `sweep_losses`, `fit_log_scale`, `best_c_per_bin`, `run_scale_sweep`,
`best_c_for_length`.
"""
from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence, Union

import numpy as np
from torch import nn

from .adapter import restore_scales, set_uniform_scale
from .ppl import plan_windows
from .scoring import score_windows


def make_grid(c_min: float, c_max: float, c_step: float) -> list[float]:
    n = int(math.floor((c_max - c_min) / c_step + 1e-9)) + 1
    if n < 1:
        raise ValueError(f"empty grid: c-min {c_min} > c-max {c_max}")
    return [round(c_min + i * c_step, 6) for i in range(n)]


def sweep_losses(model: nn.Module, docs: Sequence, length: int, grid: Sequence[float], *,
                 budget_tokens: Optional[int] = None, samples: Optional[int] = None,
                 batch_size: int = 1, progress: bool = True) -> tuple[np.ndarray, dict]:
    """Mean loss [len(grid), length] at every window position for every c (scales restored)."""
    windows, skipped = plan_windows(docs, length, length, "full", budget_tokens)
    if samples is not None:
        windows = windows[:samples]
    if not windows:
        raise ValueError(f"no document has {length + 1} tokens")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(grid) * len(windows), desc=f"scale sweep N={length}", unit="win",
                   leave=False, disable=None)
    loss = np.zeros((len(grid), length))
    with restore_scales(model):
        for i, c in enumerate(grid):
            set_uniform_scale(model, c)
            nll = score_windows(model, docs, windows, batch_size=batch_size, all_positions=True,
                                progress=bar)
            loss[i] = np.mean(np.stack(nll), axis=0)
    if bar is not None:
        bar.close()
    info = {"windows": len(windows), "scored_tokens": len(windows) * length,
            "documents_used": sorted({docs[w.doc].name for w in windows}),
            "documents_skipped": skipped}
    return loss, info


def position_bins(length: int, train_length: int, bins_per_octave: int = 4) -> np.ndarray:
    """Bin edges over positions: 4 linear bins inside L, log-spaced (in s) bins beyond it."""
    L = train_length
    inner = np.linspace(0, min(L, length), 5).round().astype(int)
    if length <= L:
        return np.unique(inner)
    octaves = math.log2(length / L)
    n = max(1, int(math.ceil(octaves * bins_per_octave)))
    outer = np.round(L * np.exp2(np.linspace(0, octaves, n + 1))).astype(int)
    return np.unique(np.concatenate([inner, outer]))


def best_c_per_bin(loss: np.ndarray, grid: Sequence[float], edges: np.ndarray,
                   train_length: int) -> list[dict]:
    """Per position bin: the grid value with the lowest mean loss over the bin."""
    grid = np.asarray(grid)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        m = loss[:, a:b].mean(1)
        j = int(np.argmin(m))
        s = np.exp(np.log((np.arange(a, b) + 1) / train_length).mean())  # geometric mean s
        out.append({"pos_from": int(a), "pos_to": int(b), "s": float(s), "best_c": float(grid[j]),
                    "loss_best": float(m[j]), "loss_by_c": m.round(6).tolist()})
    return out


def fit_log_scale(s: Sequence[float], c: Sequence[float]) -> dict:
    """Least squares c = 1 + a ln s (through c(1) = 1) over the given points; a, R^2, n."""
    s, c = np.asarray(s, float), np.asarray(c, float)
    x, y = np.log(s), c - 1.0
    if len(x) == 0 or not np.any(x):
        return {"a": None, "r2": None, "n_points": int(len(x))}
    a = float((x * y).sum() / (x * x).sum())
    res = ((y - a * x) ** 2).sum()
    tot = ((c - c.mean()) ** 2).sum()
    r2 = float(1 - res / tot) if tot > 0 else (1.0 if res == 0 else None)
    return {"a": a, "r2": r2, "n_points": int(len(x)), "form": "c(s) = 1 + a ln s"}


def analyze(loss: np.ndarray, grid: Sequence[float], train_length: int) -> dict:
    """Bins, fit, and the best c over all positions, from a [len(grid), N] loss matrix."""
    N = loss.shape[1]
    edges = position_bins(N, train_length)
    bins = best_c_per_bin(loss, grid, edges, train_length)
    beyond = [b for b in bins if b["s"] > 1 and b["pos_from"] >= train_length]
    fit = fit_log_scale([b["s"] for b in beyond], [b["best_c"] for b in beyond])
    mean = loss.mean(1)
    out = {"bins": bins, "fit": fit, "best_c_mean": float(grid[int(np.argmin(mean))]),
           "loss_mean_by_c": mean.round(6).tolist()}
    if N > train_length:
        m2 = loss[:, train_length:].mean(1)
        out["best_c_beyond_L"] = float(grid[int(np.argmin(m2))])
    return out


def run_scale_sweep(model: nn.Module, docset, length: int, grid: Sequence[float],
                    train_length: int, *, budget_tokens: Optional[int] = None,
                    samples: Optional[int] = None, batch_size: int = 1,
                    progress: bool = True) -> tuple[dict, np.ndarray]:
    """The JSON dict of a sweep, and the raw loss matrix [len(grid), length]."""
    loss, info = sweep_losses(model, docset.docs, length, grid, budget_tokens=budget_tokens,
                              samples=samples, batch_size=batch_size, progress=progress)
    res = {"kind": "scale_sweep", "length": length, "train_length": train_length,
           "grid": list(grid), "budget_tokens": budget_tokens, "samples": samples,
           "protocol": "full-protocol windows of `length` tokens, loss at every position, "
                       "the same windows for every c; uniform lambda = c/sqrt(d) on all heads",
           **info, "data": docset.describe(), **analyze(loss, grid, train_length)}
    return res, loss


def best_c_for_length(result: Union[str, dict], target_len: int, method: str = "fit") -> float:
    """The uniform scale for evaluating (or initializing HeadScale) at `target_len`.

    result: a scale_sweep JSON dict or its path (a file, or a folder holding scale_sweep.json).
    method "fit": 1 + a ln(target_len / L) (1.0 at or below L); "mean": the grid value with the
    lowest mean loss over all positions (needs a sweep run at target_len).
    """
    if isinstance(result, str):
        path = os.path.join(result, "scale_sweep.json") if os.path.isdir(result) else result
        with open(path) as f:
            result = json.load(f)
    if method == "mean":
        if result["length"] != target_len:
            raise ValueError(f"sweep ran at {result['length']}, not {target_len}: use method='fit'")
        return float(result["best_c_mean"])
    if method != "fit":
        raise ValueError(f"method must be 'fit' or 'mean', got {method!r}")
    s = target_len / result["train_length"]
    a = result["fit"]["a"]
    if s <= 1:
        return 1.0
    if a is None:
        raise ValueError("the sweep has no fit (it did not go past the training length)")
    return float(1.0 + a * math.log(s))
