"""The stage-2 table and its verdicts (results/<model>.json -> summary.json -> STAGE2.md).

Rules fixed here before any run (tests/unit/test_stage2_analysis.py pins each):
- A number is the whole-answer accuracy of the kv task on the test documents (the same documents,
  one generator seed, for every model and method at a length). A layout's row is the mean over
  its seeds (min..max shown); the verdicts compare seed by seed.
- The base of a seed is its stage-1 checkpoint chosen by the rule (the first >= 0.9 at L on
  validation documents); a seed whose stage 1 never reached the gate is scored at its final
  checkpoint, reported "not gated", and left out of every verdict.
- The stage-2 model is the last checkpoint of its short stage at 4L (no selection).
- The best zero-shot method of a layout at a length: the base's method (`none`, a temperature
  schedule on the NoPE layers, YaRN on the RoPE layers) with the highest mean accuracy over the
  gated seeds there (ties: the first in the plan's order) - the one a user would pick.
- Stage 2 vs zero-shot at 4L, 8L and 16L, per layout, only with >= MIN_SEEDS gated seeds:
  "stage 2 wins" if on every gated seed stage 2 - best zero-shot >= GAP and the stage-2 mean is
  above the no-retrieval baseline; "zero-shot wins" if on every gated seed best zero-shot -
  stage 2 >= GAP and the zero-shot mean is above the baseline; otherwise "no clear difference".
- What stage 2 costs at L: "keeps L" if on every gated seed stage 2 >= base (no schedule) - GAP
  at L; "costs L" if on every gated seed it is below that; otherwise "mixed".
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from experiments.nope_length.analysis import scored_with

GAP = 0.1
"""A difference in whole-answer accuracy that counts, per seed (128 test documents a cell: the
sampling sd of one accuracy is <= 0.044, of a difference <= 0.063, less on shared documents)."""
MIN_SEEDS = 2
"""Gated seeds a layout needs for a verdict."""
STAGE2 = "stage 2"
"""The stage-2 model's method label (scored with no schedule)."""


def _acc(cells: list, length: int) -> Optional[float]:
    return next((c.get("accuracy") for c in cells if c["length"] == length), None)


def _stats(xs: list) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": float(np.mean(xs)), "min": float(min(xs)), "max": float(max(xs)), "n": len(xs)}


def per_seed(results: list, layout: str, method: str, length: int) -> dict:
    """{seed: accuracy} of one layout's rows with this method at this length (None: not scored)."""
    out = {}
    for r in results:
        if r["layout"] != layout:
            continue
        for row in r["rows"]:
            if row["method"] == method:
                out[r["seed"]] = _acc(row["cells"], length)
    return out


def best_zero_shot(results: list, layout: str, methods: list, length: int,
                   seeds: list) -> Optional[str]:
    """The base method with the highest mean accuracy over `seeds` at `length` (ties: the first
    of `methods`); None when none was scored there."""
    best, best_mean = None, None
    for meth in methods:
        got = per_seed(results, layout, meth, length)
        xs = [got.get(s) for s in seeds]
        if not xs or any(x is None for x in xs):
            continue
        m = float(np.mean(xs))
        if best_mean is None or m > best_mean:
            best, best_mean = meth, m
    return best


def compare(stage2: list, zero: list, baseline: float) -> str:
    """The verdict of paired per-seed accuracies (the rules in the module docstring)."""
    diffs = [a - b for a, b in zip(stage2, zero)]
    if all(d >= GAP for d in diffs) and float(np.mean(stage2)) > baseline:
        return "stage 2 wins"
    if all(-d >= GAP for d in diffs) and float(np.mean(zero)) > baseline:
        return "zero-shot wins"
    return "no clear difference"


def keeps_L(stage2: list, base: list) -> str:
    ok = [a >= b - GAP for a, b in zip(stage2, base)]
    return "keeps L" if all(ok) else "costs L" if not any(ok) else "mixed"


def summarize(plan: dict, results: list, expected: Optional[int] = None) -> dict:
    """results: one dict per model (study.measure): {model, layout, seed, rule, gated, base_tag,
    stage2, rows: [{stage, method, cells}]}; expected: the plan's model count (fewer: partial)."""
    L = plan["L"]
    lengths = [k * L for k in plan["multiples"]]
    layouts = list(dict.fromkeys(r["layout"] for r in results))
    baseline: dict = {}
    for r in results:  # the no-retrieval rule on the same documents (the highest seen)
        for row in r["rows"]:
            for c in row["cells"]:
                b = (c.get("baseline") or {}).get("accuracy")
                if b is not None:
                    baseline[str(c["length"])] = max(baseline.get(str(c["length"]), 0.0), b)
    table = []
    for layout in layouts:
        runs = [r for r in results if r["layout"] == layout]
        methods = list(dict.fromkeys(row["method"] for r in runs for row in r["rows"]))
        for meth in methods:
            table.append({"layout": layout, "method": meth,
                          "seeds": sum(1 for r in runs if any(w["method"] == meth for w in r["rows"])),
                          "gated": sum(1 for r in runs if r["gated"]),
                          "accuracy": {str(n): _stats(list(per_seed(results, layout, meth, n).values()))
                                       for n in lengths}})
    verdicts = []
    for layout in layouts:
        runs = [r for r in results if r["layout"] == layout]
        seeds = sorted(r["seed"] for r in runs if r["gated"])
        zero = [m for m in dict.fromkeys(row["method"] for r in runs for row in r["rows"]) if m != STAGE2]
        if len(seeds) < MIN_SEEDS:
            verdicts.append({"layout": layout, "seeds": seeds, "verdict": None,
                             "why": f"{len(seeds)} of {len(runs)} bases gated (< {MIN_SEEDS})"})
            continue
        s2 = {n: per_seed(results, layout, STAGE2, n) for n in lengths}
        for n in lengths[1:]:
            if n not in [k * L for k in plan["verdict_multiples"]]:
                continue
            best = best_zero_shot(results, layout, zero, n, seeds)
            a = [s2[n].get(s) for s in seeds]
            if best is None or any(x is None for x in a):
                verdicts.append({"layout": layout, "length": n, "seeds": seeds, "verdict": None,
                                 "why": "not scored"})
                continue
            b = per_seed(results, layout, best, n)
            z = [b[s] for s in seeds]
            verdicts.append({"layout": layout, "length": n, "seeds": seeds, "best_zero_shot": best,
                             "stage2": a, "zero_shot": z, "baseline": baseline.get(str(n), 0.0),
                             "verdict": compare(a, z, baseline.get(str(n), 0.0))})
        base_L = per_seed(results, layout, "none", L)
        a, b = [s2[L].get(s) for s in seeds], [base_L.get(s) for s in seeds]
        if None not in a + b:
            verdicts.append({"layout": layout, "length": L, "seeds": seeds, "stage2": a, "base": b,
                             "verdict": keeps_L(a, b)})
    return {"plan": plan, "lengths": lengths, "table": table, "baseline": baseline,
            "verdicts": verdicts, "partial": expected is not None and len(results) < expected,
            "models": results}


def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def render(summary: dict) -> str:
    """STAGE2.md: the table, the baseline row, the verdicts and the checkpoints, from summary.json."""
    p, lengths = summary["plan"], summary["lengths"]
    L = p["L"]
    head = " | ".join(f"{n // L}L" for n in lengths)
    out = ["# What stage 2 buys: a short stage at 4L vs zero-shot temperatures", ""]
    if summary["partial"]:
        out += [f"**Partial: {len(summary['models'])} of the plan's models done** (the study is "
                "still running; no verdict below is final).", ""]
    out += ["Generated from summary.json by experiments/stage2 (design: its README.md and "
            "study.py; rules: analysis.py, written before the runs). Whole-answer accuracy of the "
            f"kv task, L = {L}, on the same held-out test documents at each length, mean "
            "(min..max) over seeds; seeds: all (gated). Base rows: the stage-1 checkpoint chosen "
            "by the rule, with each zero-shot method (temperature schedules on the NoPE layers, "
            "YaRN at s = length / L on the RoPE layers). `stage 2`: the base continued "
            f"{p['stage2_steps']} steps at {p['stage2_factor']}L (RoPE theta x{p['theta_factor']:g} "
            "where the layout has RoPE layers), scored with no schedule. " + scored_with(summary), "",
            f"| layout | model | seeds | {head} |", "|---|---|---|" + "---|" * len(lengths)]
    for t in summary["table"]:
        who = t["method"] if t["method"] == STAGE2 else f"base, {t['method']}"
        cells = " | ".join(
            f"{_f(a['mean'])} ({_f(a['min'])}..{_f(a['max'])})" if a["n"] > 1 else _f(a["mean"])
            for a in (t["accuracy"][str(n)] for n in lengths))
        out.append(f"| {t['layout']} | {who} | {t['seeds']} ({t['gated']}) | {cells} |")
    out.append("| no retrieval (baseline) | - | - | " + " | ".join(
        _f(summary["baseline"].get(str(n))) for n in lengths) + " |")
    out += ["", f"## Verdicts (per seed, gap {GAP}; gated bases only, >= {MIN_SEEDS} seeds)", ""]
    for v in summary["verdicts"]:
        if v["verdict"] is None:
            where = f" at {v['length'] // L}L" if "length" in v else ""
            out.append(f"- {v['layout']}{where}: no verdict ({v['why']}).")
        elif "base" in v:
            out.append(f"- {v['layout']} at 1L: **{v['verdict']}** (stage 2 "
                       f"{', '.join(_f(x) for x in v['stage2'])} vs base "
                       f"{', '.join(_f(x) for x in v['base'])}; seeds {v['seeds']}).")
        else:
            out.append(f"- {v['layout']} at {v['length'] // L}L: **{v['verdict']}** (stage 2 "
                       f"{', '.join(_f(x) for x in v['stage2'])} vs best zero-shot "
                       f"`{v['best_zero_shot']}` {', '.join(_f(x) for x in v['zero_shot'])}; "
                       f"seeds {v['seeds']}).")
    out += ["", "## Checkpoints (base: the first >= 0.9 at L on validation documents; stage 2: "
            "its last)", "", "| model | stage-1 steps | base | stage 2 | RoPE theta (stage 1 -> 2) |",
            "|---|---|---|---|---|"]
    for m in summary["models"]:
        base = m["rule"]["chosen"] or f"not gated (final {m['rule']['final']})"
        s2 = m["stage2"]
        theta = ("- (no RoPE layer)" if s2["rope_base"] is None
                 else f"{s2['rope_base'][0]:g} -> {s2['rope_base'][1]:g}")
        out.append(f"| {m['model']['name']} | {m['stage1_steps']} | {base} | {s2['tag']} | {theta} |")
    return "\n".join(out) + "\n"
