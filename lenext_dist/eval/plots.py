"""PNG figures of the evaluation results (matplotlib, Agg backend; inputs are the JSON dicts).

Public API: `plot_ppl`, `plot_penalty`, `plot_passkey`, `plot_entropy`, `plot_scale_sweep`,
`plot_head_scales` (lives in lenext_dist/plotting.py: training draws it too).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from lenext_dist.plotting import pyplot, save_figure


def _mark_L(ax, L: Optional[int]):
    if L:
        ax.axvline(L, color="k", ls=":", lw=1, label=f"L = {L}")


def plot_ppl(res: dict, path: str) -> str:
    """Left: PPL per evaluation length. Right: mean loss per window position (binned)."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = res["results"]
    a1.plot([r["length"] for r in rows], [r["ppl"] for r in rows], "o-")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("evaluation length W")
    a1.set_ylabel("perplexity")
    a1.set_title(f"{res['protocol']} (stride {res['stride']})")
    _mark_L(a1, res.get("train_length"))
    for r in rows:
        b = r["position_curve_binned"]
        a2.plot(np.asarray(b["position"]) + 1, b["loss"], ".-" if len(b["loss"]) < 20 else "-",
                label=f"W={r['length']}")
    a2.set_xscale("log")
    a2.set_xlabel("window position + 1 (context length)")
    a2.set_ylabel("mean loss (nats)")
    a2.set_title("per-position loss (" + rows[0]["position_curve"]["scope"] + ")")
    _mark_L(a2, res.get("train_length"))
    a2.legend(fontsize=8)
    return save_figure(fig, path)


def plot_penalty(res: dict, path: str) -> str:
    """Extrapolation penalty (full context minus window-L loss) against s = context / L."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for d in res["diagnostics"]:
        if "penalty_binned" not in d:
            continue
        b = d["penalty_binned"]
        s = (np.asarray(b["position"]) + 1) / d["train_length"]
        sel = s > 1
        ax.plot(s[sel], np.asarray(b["loss"])[sel], label=f"W={d['length']}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("s = context / L")
    ax.set_ylabel("penalty (nats)")
    ax.set_title("extrapolation penalty vs window-L baseline")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_passkey(res: dict, path: str) -> str:
    """Heatmap of accuracy, lengths (rows) x depths (columns)."""
    plt = pyplot()
    acc = np.asarray(res["accuracy"])
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * acc.shape[1], 1.2 + 0.45 * acc.shape[0]))
    im = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(acc.shape[1]), [f"{d:.2f}" for d in res["depths"]], fontsize=7)
    ax.set_yticks(range(acc.shape[0]), [str(x) for x in res["lengths"]], fontsize=8)
    ax.set_xlabel("depth")
    ax.set_ylabel("prompt length (tokens)")
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            ax.text(j, i, f"{acc[i, j]:.1f}", ha="center", va="center", fontsize=6)
    ax.set_title(f"passkey accuracy (mean {res['mean_accuracy']:.2f})")
    fig.colorbar(im, ax=ax, fraction=0.04)
    return save_figure(fig, path)


def plot_tasks(res: dict, path: str) -> str:
    """Accuracy against document length, one line per task (log-2 x axis)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    for task, acc in res["accuracy"].items():
        line, = ax.plot(res["lengths"], acc, marker="o", label=task)
        base = [c["baseline"]["accuracy"] for c in res["cells"] if c["task"] == task
                and "baseline" in c]
        if len(base) == len(acc):  # the no-retrieval rule on the same documents
            ax.plot(res["lengths"], base, ls="--", color=line.get_color(), lw=0.8,
                    label=f"{task}: no retrieval")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.03, 1.03)
    _mark_L(ax, res.get("model", {}).get("train_length"))
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("accuracy (every answer token)")
    ax.legend(fontsize=7)
    ax.set_title("task-format retrieval")
    return save_figure(fig, path)


def plot_entropy(summary: dict, path: str) -> str:
    """One panel per layer (heads thin, layer mean bold), plus the all-heads mean, log-x axis."""
    plt = pyplot()
    per_head = np.asarray(summary["per_head"])  # [layers, heads, bins]
    n_layers = per_head.shape[0]
    cols = min(4, n_layers + 1)
    rows = math.ceil((n_layers + 1) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    x = np.asarray(summary["positions"]) + 1
    ub = summary["upper_bound"]
    L = summary.get("train_length")
    for li in range(n_layers):
        ax = axes[li // cols][li % cols]
        for h in per_head[li]:
            ax.plot(x, h, lw=0.6, alpha=0.5)
        ax.plot(x, per_head[li].mean(0), "k", lw=1.5)
        ax.plot(x, ub, "k--", lw=0.8)
        _mark_L(ax, L)
        ax.set_xscale("log")
        ax.set_title(f"layer {li}", fontsize=9)
    ax = axes[n_layers // cols][n_layers % cols]
    ax.plot(x, summary["mean"], "b", lw=1.5, label="mean over heads")
    ax.plot(x, ub, "k--", lw=0.8, label="ln(visible keys)")
    _mark_L(ax, L)
    ax.set_xscale("log")
    ax.set_title("all layers", fontsize=9)
    ax.legend(fontsize=7)
    for k in range(n_layers + 1, rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.suptitle(f"attention entropy (nats), {summary['samples']} samples")
    return save_figure(fig, path)


def plot_scale_sweep(res: dict, path: str) -> str:
    """Left: best c per position bin and the fit c(s) = 1 + a ln s. Right: loss by c."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    s = np.asarray([b["s"] for b in res["bins"]])
    c = [b["best_c"] for b in res["bins"]]
    a1.plot(s, c, "o", label="best c per bin")
    fit = res["fit"]
    if fit.get("a") is not None:
        xs = np.geomspace(1, max(s.max(), 1.0001), 50)
        r2 = f", R2={fit['r2']:.3f}" if fit.get("r2") is not None else ""
        a1.plot(xs, 1 + fit["a"] * np.log(xs), "r-", label=f"1 + {fit['a']:.3f} ln s{r2}")
    a1.set_xscale("log")
    a1.set_xlabel("s = (position + 1) / L")
    a1.set_ylabel("best uniform c")
    a1.legend(fontsize=8)
    grid = res["grid"]
    mean = np.asarray(res["loss_mean_by_c"])
    a2.plot(grid, mean - mean.min(), "k", lw=1.5, label="all positions")
    for b in res["bins"][:: max(1, len(res["bins"]) // 6)]:
        x = np.asarray(b["loss_by_c"])
        a2.plot(grid, x - x.min(), lw=0.8, label=f"s~{b['s']:.2f}")
    a2.set_xlabel("c")
    a2.set_ylabel("mean loss - its minimum over c")
    a2.legend(fontsize=7)
    fig.suptitle(f"uniform scale sweep at N={res['length']} (L={res['train_length']})")
    return save_figure(fig, path)
