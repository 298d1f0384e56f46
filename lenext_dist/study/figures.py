"""The study's figures (PNG, from the result files; each caption in STUDY.md names its JSON):

  fig1_loss_entropy.png   Figure 1 analogue: per-position loss and mean attention entropy of NoPE,
                          RoPE and NoPE with uniform scales, inflection points marked
  table2_ppl.png          PPL against evaluation length, one line per method (seed mean, min..max bar)
  retrieval.png           task-format retrieval against length, one line per method (seed mean;
                          per-length methods at the largest s), documents right and answer
                          tokens right, per task generator
  passkey.png             LongLoRA passkey heatmaps (length x depth), one per method (first seed)
  scale_fit.png           best uniform c per position bin and c(s) = 1 + a ln s, per NoPE seed
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from lenext_dist.eval.plots import pyplot, save_figure

from .analysis import smooth


def fig1(summary: dict, out: Path) -> str:
    plt = pyplot()
    L = summary["L"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, rec) in enumerate(sorted(summary["inflection"].items())):
        col = colors[i % len(colors)]
        if "loss" in rec:
            j = __import__("json").loads((out / rec["loss"]["source"]).read_text())
            y = np.array([np.nan if v is None else v for v in j["results"][0]["position_curve"]["loss"]])
            x = (np.arange(len(y)) + 1) / L
            a1.plot(x, smooth(y), color=col, lw=1.2, label=name)
            s = rec["loss"]["s"]
            if s is not None:
                a1.axvline(s, color=col, ls="--", lw=0.8)
                a1.plot([s], [smooth(y)[rec["loss"]["position"]]], "o", color=col)
        if "entropy" in rec:
            e = np.load(out / rec["entropy"]["source"])["entropy"].mean((0, 1))
            x = (np.arange(len(e)) + 1) / L
            a2.plot(x, e, color=col, lw=1.2, label=name)
            s = rec["entropy"]["s"]
            if s is not None:
                a2.axvline(s, color=col, ls="--", lw=0.8)
                a2.plot([s], [e[rec["entropy"]["position"]]], "o", color=col)
    for ax, t in ((a1, "smoothed per-position loss (nats)"), (a2, "mean attention entropy (nats)")):
        ax.axvline(1.0, color="k", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("s = (position + 1) / L")
        ax.set_title(t + "; dashed: inflection")
        ax.legend(fontsize=7)
    return save_figure(fig, out / "fig1_loss_entropy.png")


def table2(summary: dict, out: Path) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    Ws = summary["lengths"]
    rows = [r for r in summary["table"] if r["factor"] is None] + \
           [{"method": m["method"], "stats": m["cols"]} for m in summary["matched"]]
    for r in rows:
        xs, ys, lo, hi = [], [], [], []
        for W in Ws:
            st = r["stats"].get(str(W))
            if st and st.get("mean") is not None:
                xs.append(W), ys.append(st["mean"])
                lo.append(st["mean"] - st["min"]), hi.append(st["max"] - st["mean"])
        if xs:
            ls = "--" if "s = T/L" in r["method"] else "-"
            ax.errorbar(xs, ys, yerr=[lo, hi], ls=ls, marker="o", ms=3, capsize=2, label=r["method"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length W (tokens)")
    ax.set_ylabel("PPL (last-stride, seed mean; bars min..max)")
    ax.axvline(summary["L"], color="k", ls=":", lw=1)
    ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, out / "table2_ppl.png")


def retrieval(summary: dict, out: Path) -> str:
    plt = pyplot()
    tasks = [t for t, rows in summary.get("retrieval", {}).items() if rows]
    if not tasks:
        return ""
    fig, axes = plt.subplots(2, len(tasks), figsize=(5.5 * len(tasks), 8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    # per-length methods at their largest factor only (the tables hold every factor)
    s_max = f"(s={max(summary['plan']['factors'])})"
    for j, t in enumerate(tasks):
        rows = [r for r in summary["retrieval"][t] if "(s=" not in r["method"] or s_max in r["method"]]
        for i, r in enumerate(rows):
            style = dict(color=colors[i % len(colors)], ls=styles[(i // len(colors)) % len(styles)],
                         marker="o", ms=3, lw=1)
            for row, kind in ((0, "exact"), (1, "tokens")):
                ys = [st["mean"] for st in r[kind]]
                axes[row][j].plot(r["lengths"], ys, label=r["method"], **style)
        for row, what in ((0, "documents with every answer token right"), (1, "answer tokens right")):
            ax = axes[row][j]
            ax.set_xscale("log", base=2)
            ax.set_ylim(-0.02, 1.02)
            ax.axvline(summary["L"], color="k", ls=":", lw=1)
            ax.set_title(f"{t}: {what}", fontsize=9)
            ax.set_xlabel("document length (tokens)")
    axes[1][-1].legend(fontsize=5, ncol=2)
    return save_figure(fig, out / "retrieval.png")


def passkey(summary: dict, out: Path) -> str:
    plt = pyplot()
    first = {}
    for name, p in summary["passkey"].items():
        first.setdefault(p["method"], (name, p))  # one cell per method: the first seed's
    items = list(first.values())
    if not items:
        return ""
    cols = min(5, len(items))
    rows = -(-len(items) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.9 * rows), squeeze=False)
    for ax in axes.flat[len(items):]:
        ax.axis("off")
    for ax, (name, p) in zip(axes.flat, items):
        acc = np.asarray(p["accuracy"])
        ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(acc.shape[1]), [f"{d:.2f}" for d in p["depths"]], fontsize=6)
        ax.set_yticks(range(acc.shape[0]), [str(x) for x in p["lengths"]], fontsize=6)
        for i in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                ax.text(j, i, f"{acc[i, j]:.1f}", ha="center", va="center", fontsize=5)
        ax.set_title(f"{p['method']}\n{name}: mean {p['mean']:.2f}", fontsize=7)
        ax.set_xlabel("depth", fontsize=6)
        ax.set_ylabel("prompt length", fontsize=6)
    return save_figure(fig, out / "passkey.png")


def scale_fit(summary: dict, out: Path) -> str:
    plt = pyplot()
    if not summary["fit"]:
        return ""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, f in summary["fit"].items():
        s = np.array([b["s"] for b in f["bins"]])
        c = np.array([b["best_c"] for b in f["bins"]])
        pts = ax.plot(s, c, "o", ms=4, label=f"{name}: best c per bin")
        if f.get("a") is not None:
            xs = np.geomspace(1, max(s.max(), 1.01), 50)
            ax.plot(xs, 1 + f["a"] * np.log(xs), color=pts[0].get_color(),
                    label=f"1 + {f['a']:.3f} ln s (R2 {f['r2'] if f['r2'] is None else round(f['r2'], 3)})")
    xs = np.geomspace(1, 8, 50)
    ax.fill_between(xs, 1 + 0.30 * np.log(xs), 1 + 0.40 * np.log(xs), color="grey", alpha=0.2,
                    label="paper: a = 0.30-0.40")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("s = (position + 1) / L")
    ax.set_ylabel("best uniform c")
    ax.legend(fontsize=7)
    return save_figure(fig, out / "scale_fit.png")


def all_figures(summary: dict, out: Path) -> dict:
    return {"fig1": fig1(summary, out), "table2": table2(summary, out),
            "retrieval": retrieval(summary, out), "passkey": passkey(summary, out),
            "scale_fit": scale_fit(summary, out)}
