"""The size study's rules (results.json -> summary.json -> SIZES.md), fixed here before its runs.

Only seeds at the gate count (the checkpoint rule's first checkpoint >= 0.9 at L); a size with
fewer than MIN_SEEDS of them gets no fit verdict, and fewer than MIN_SIZES judged sizes give no
slope verdict.

- **The fit at a size**: the best uniform c of the grid at each s = 2, 4, 8, 16 (by accuracy, then
  answer NLL; experiments/nope_length's `best_c`), points only where that c retrieves something;
  c(s) = 1 + a ln s by least squares through the origin (`fit_log`), once per seed (the spread)
  and once over the seeds' points together (the size's a, R^2).
- **Does a grow with size**: "grows" when every seed's a at the largest judged size is above every
  seed's a at the smallest; "shrinks" the reverse; otherwise "no trend beyond the seeds' spread".
  Beside it, whether the largest size's a lies in the paper's 0.30-0.40 (1B models).
- **HeadScale vs its ablations** (the paper's Table 2 rows: the search, without the bound m_h >= 1,
  initialised at 1 instead of the fit): at a target s, over >= MIN_SEEDS seeds run both ways, an
  ablation differs from the search when its accuracy at T = sL is on the same side of the search's
  on every seed and the mean difference is >= GAP; otherwise they cannot be told apart there
  (fewer seeds: not judged). The best uniform c at T is shown beside.
"""
from __future__ import annotations

from typing import Optional

from experiments.nope_length.analysis import GAP, _acc, _spread, best_c, fit_log, scored_with

MIN_SEEDS = 3
MIN_SIZES = 3
PAPER_A = (0.30, 0.40)
"""The paper's fitted a on its 1B models (Wang, Ji et al. 2024, section 4)."""
ABLATIONS = ("no bound", "init 1")


def seed_points(res: dict, L: int, multiples: list[int]) -> list[tuple[float, float]]:
    """(s, best c at sL) for s > 1 where the best c retrieves something."""
    pts = []
    for k in multiples:
        b = best_c(res, k * L) if k > 1 else None
        if b is not None and b["accuracy"] > 0:
            pts.append((float(k), b["c"]))
    return pts


def _size_row(size: str, params: int, runs: list, L: int, multiples: list[int]) -> dict:
    gated = [r for r in runs if r["rule"]["chosen"]]
    per_seed = {r["model"]["name"]: seed_points(r, L, multiples) for r in gated}
    fits = {n: fit_log(p) for n, p in per_seed.items()}
    pooled = fit_log([p for pts in per_seed.values() for p in pts])
    return {"size": size, "params": params, "seeds": len(runs), "at_gate": len(gated),
            "gate_steps": {r["model"]["name"]: r["rule"]["chosen"] for r in runs},
            "a": pooled["a"], "r2": pooled["r2"], "points": pooled["points"],
            "a_seeds": {n: f["a"] for n, f in fits.items()},
            "best_c": {n: {f"{int(s)}L": c for s, c in p} for n, p in per_seed.items()},
            "judged": len(gated) >= MIN_SEEDS and all(f["a"] is not None for f in fits.values())}


def slope_verdict(rows: list[dict]) -> dict:
    judged = sorted((r for r in rows if r["judged"]), key=lambda r: r["params"])
    if len(judged) < MIN_SIZES:
        return {"verdict": f"not judged: {len(judged)} size(s) with >= {MIN_SEEDS} seeds at the gate "
                           f"(needs {MIN_SIZES})", "sizes": [r["size"] for r in judged]}
    small, large = (list(r["a_seeds"].values()) for r in (judged[0], judged[-1]))
    verdict = ("grows" if min(large) > max(small) else "shrinks" if max(large) < min(small)
               else "no trend beyond the seeds' spread")
    a = judged[-1]["a"]
    return {"verdict": verdict, "sizes": [r["size"] for r in judged],
            "smallest": judged[0]["size"], "largest": judged[-1]["size"],
            "largest_a": a, "in_paper_range": PAPER_A[0] <= a <= PAPER_A[1]}


def headscale_table(headscale: list[dict], results: list[dict]) -> dict:
    """target -> {variant: spread of accuracy at T over seeds, "best uniform": the same for the
    grid's best c at T, "no temperature": for c = 1 (what any temperature has room to add: no
    verdict reads it), "ablations": {variant: difference verdict}}."""
    by_model = {r["model"]["name"]: r for r in results}
    out: dict = {}
    for t in sorted({h["target"] for h in headscale}):
        hs = [h for h in headscale if h["target"] == t]
        T = hs[0]["T"]
        at_T = {v: {h["model"]: _acc(h["cells"], T) for h in hs if h["variant"] == v}
                for v in dict.fromkeys(h["variant"] for h in hs)}
        uni = {m: (best_c(by_model[m], T) or {}).get("accuracy") for m in at_T.get("full", {})
               if m in by_model}
        row = {v: {**_spread(list(x.values())), "seeds": x} for v, x in at_T.items()}
        row["best uniform"] = {**_spread(list(uni.values())), "seeds": uni}
        none = {m: next((_acc(r["cells"], T) for r in by_model[m]["rows"]
                         if r.get("method") == "uniform" and r.get("c") == 1.0), None)
                for m in uni}
        row["no temperature"] = {**_spread(list(none.values())), "seeds": none}
        row["ablations"] = {v: ablation_differs(at_T.get("full", {}), at_T.get(v, {}))
                            for v in ABLATIONS if v in at_T}
        out[f"{t}L"] = row
    return out


def ablation_differs(full: dict, ablation: dict) -> dict:
    """Judged on >= MIN_SEEDS seeds run both ways (fewer: not judged, never "differs")."""
    seeds = sorted(set(full) & set(ablation))
    d = [ablation[s] - full[s] for s in seeds if None not in (ablation[s], full[s])]
    mean = sum(d) / len(d) if d else None
    same_side = bool(d) and (all(x > 0 for x in d) or all(x < 0 for x in d))
    differs = len(d) >= MIN_SEEDS and same_side and abs(mean) >= GAP
    return {"mean_difference": mean, "seeds": len(d), "judged": len(d) >= MIN_SEEDS, "differs": differs}


def summarize(plan: dict, results: list, headscale: list, params: dict[str, int]) -> dict:
    L, mult = plan["L"], plan["multiples"]
    rows = [_size_row(s, params[s], [r for r in results if r["size"] == s], L, mult) for s in params]
    hs = headscale_table(headscale, results) if headscale else {}
    told = [f"{t} {v}" for t, row in hs.items() for v, a in row["ablations"].items() if a["differs"]]
    judged = any(a["judged"] for row in hs.values() for a in row["ablations"].values())
    return {"plan": plan, "sizes": rows, "slope": slope_verdict(rows), "headscale": hs,
            "headscale_verdict": ("not measured" if not hs else
                                  f"differs from the search: {', '.join(told)}" if told else
                                  "the search and its ablations cannot be told apart" if judged else
                                  f"not judged: fewer than {MIN_SEEDS} seeds run both ways"),
            "models": results, "headscale_runs": headscale}


def _f(x: Optional[float], nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _sp(s: dict) -> str:
    return "-" if not s.get("n") else (f"{_f(s['mean'])} ({_f(s['min'])}..{_f(s['max'])})"
                                       if s["n"] > 1 else _f(s["mean"]))


def render(summary: dict) -> str:
    p = summary["plan"]
    out = ["# The fitted slope a across model sizes; HeadScale against its ablations", "",
           "Generated from summary.json by experiments/sizes (study.py: the design; analysis.py: "
           f"the rules, fixed before the runs). NoPE in the kv regime, L = {p['L']}, head dimension "
           "16 at every size; only seeds at the gate count. Fit: c(s) = 1 + a ln s through the "
           "best uniform c at s = 2..16 (where it retrieves). " + scored_with(summary), "",
           "| size | params (non-embedding) | seeds (at the gate) | a (all seeds) | R^2 | a per seed | gate steps |",
           "|---|---|---|---|---|---|---|"]
    for r in summary["sizes"]:
        seeds = ", ".join(_f(a, 3) for a in r["a_seeds"].values()) or "-"
        steps = ", ".join((t or "none").replace("step_", "").lstrip("0") or "0"
                          for t in r["gate_steps"].values())
        out.append(f"| {r['size']} | {r['params']:,} | {r['seeds']} ({r['at_gate']}) | {_f(r['a'], 3)} | "
                   f"{_f(r['r2'])} | {seeds} | {steps} |")
    s = summary["slope"]
    out += ["", "![a by size](a_by_size.png)", "", f"**Does a grow with size?** {s['verdict']}" + (
        f" ({s['smallest']} -> {s['largest']}; the largest's a = {_f(s['largest_a'], 3)}, "
        f"{'inside' if s['in_paper_range'] else 'outside'} the paper's "
        f"{PAPER_A[0]:.2f}-{PAPER_A[1]:.2f})." if "largest" in s else ".")]
    if summary["headscale"]:
        out += ["", "## HeadScale vs its ablations (the paper's Table 2 rows), accuracy at T, mean "
                    "(min..max) over seeds", "", "| target | full | no bound | init 1 | best uniform c | "
                    "no temperature (c = 1) |", "|---|---|---|---|---|---|"]
        for t, row in summary["headscale"].items():
            out.append(f"| {t} | " + " | ".join(_sp(row.get(v, {})) for v in
                                                 ("full", *ABLATIONS, "best uniform", "no temperature")) + " |")
        out += ["", f"**Verdict** (an ablation differs when every seed is on one side and the mean "
                    f"difference is >= {GAP}): {summary['headscale_verdict']}."]
    return "\n".join(out) + "\n"


def plot(summary: dict, path) -> str:
    """a against parameters: each seed's fit (dots) and the size's fit over its seeds (line)."""
    from lenext_dist.plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    rows = sorted(summary["sizes"], key=lambda r: r["params"])
    for r in rows:
        ys = [a for a in r["a_seeds"].values() if a is not None]
        ax.scatter([r["params"]] * len(ys), ys, color="tab:blue", alpha=0.6, s=18)
    xs = [r["params"] for r in rows if r["a"] is not None]
    ax.plot(xs, [r["a"] for r in rows if r["a"] is not None], "o-", color="tab:blue",
            label="a (all seeds of a size)")
    ax.axhspan(*PAPER_A, color="tab:orange", alpha=0.2, label="paper, 1B models")
    ax.set_xscale("log")
    ax.set_xlim(rows[0]["params"] / 1.5, rows[-1]["params"] * 1.5)  # the sizes, fitted or not
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("a in c(s) = 1 + a ln s")
    ax.set_title(f"best-c slope by size: {summary['slope']['verdict']}", fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
