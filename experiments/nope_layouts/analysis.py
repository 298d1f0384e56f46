"""The layout study's table and verdicts (results.json -> summary.json -> LAYOUTS.md).

Rules fixed here before the runs. Accuracy is whole answers right of the test documents at the
chosen checkpoint (the first at the gate, >= 0.9 at L); a layout's number is the mean over its
seeds that reached the gate (min..max shown), never over a seed that did not.
- A layout gets verdicts only with >= MIN_SEEDS seeds at the gate; the others are reported (seeds
  trained, seeds at the gate, their gate steps) with no verdict.
- Which layout extends furthest: the highest mean accuracy, averaged over 2L and 4L, with no
  schedule (ties within GAP are reported as ties), among the layouts with verdicts.
- A schedule helps a layout: its mean accuracy at 4L or at 8L is at least GAP above no schedule
  there, and above the no-retrieval baseline.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from experiments.nope_length.analysis import scored_with

GAP = 0.1
"""A difference in mean whole-answer accuracy that counts (three seeds of 128 documents each: the
sampling sd of a mean is <= 0.026)."""
MIN_SEEDS = 3
"""Seeds at the gate a layout needs before any verdict is drawn from it (issue 43, item 3)."""


def _acc(cells: list, length: int, key: str = "accuracy") -> Optional[float]:
    return next((c.get(key) for c in cells if c["length"] == length), None)


def _mean(xs: list) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": float(np.mean(xs)), "min": float(min(xs)), "max": float(max(xs)), "n": len(xs)}


def summarize(plan: dict, results: list) -> dict:
    """results: one dict per model: {model, layout, rule, rows: [{schedule, cells}]}."""
    lengths = [k * plan["L"] for k in plan["multiples"]]
    layouts = list(dict.fromkeys(r["layout"] for r in results))
    table, baseline = [], {}
    trained = {lay: sum(1 for r in results if r["layout"] == lay) for lay in layouts}
    for layout in layouts:
        runs = [r for r in results if r["layout"] == layout and r["rule"]["chosen"]]
        if not runs:  # no seed at the gate: a row that says so, no numbers
            table.append({"layout": layout, "schedule": "none", "seeds": trained[layout], "at_gate": 0,
                          "accuracy": {str(n): _mean([]) for n in lengths},
                          "answer_nll": {str(n): _mean([]) for n in lengths}})
        for sched in dict.fromkeys(row["schedule"] for r in runs for row in r["rows"]):
            cells = [row["cells"] for r in runs for row in r["rows"] if row["schedule"] == sched]
            table.append({"layout": layout, "schedule": sched, "seeds": trained[layout],
                          "at_gate": len(cells),
                          "accuracy": {str(n): _mean([_acc(c, n) for c in cells]) for n in lengths},
                          "answer_nll": {str(n): _mean([_acc(c, n, "answer_nll") for c in cells])
                                         for n in lengths}})
            for c in cells:  # the no-retrieval rule on the same documents (the highest seen)
                for n in lengths:
                    b = (_acc(c, n, "baseline") or {}).get("accuracy")
                    if b is not None:
                        baseline[str(n)] = max(baseline.get(str(n), 0.0), b)

    def mean(layout, sched, n):
        row = next((t for t in table if t["layout"] == layout and t["schedule"] == sched), None)
        return None if row is None else row["accuracy"][str(n)]["mean"]

    at_gate = {lay: sum(1 for r in results if r["layout"] == lay and r["rule"]["chosen"])
               for lay in layouts}
    judged = [lay for lay in layouts if at_gate[lay] >= MIN_SEEDS]
    reach = {lay: float(np.mean([mean(lay, "none", n) or 0.0 for n in lengths[1:3]]))
             for lay in judged}
    best = max(reach.values()) if reach else None
    verdicts = {"furthest": {
        "rule": f"highest mean accuracy over {lengths[1:3]} with no schedule (ties within {GAP}), "
                f"layouts with >= {MIN_SEEDS} seeds at the gate",
        "reach": reach, "layouts": [lay for lay, v in reach.items() if best - v < GAP]},
        "no_verdict": {lay: f"{at_gate[lay]} of {trained[lay]} seeds at the gate"
                       for lay in layouts if lay not in judged}}
    helps = []
    for t in table:
        if t["schedule"] == "none" or t["layout"] not in judged:
            continue
        for n in lengths[2:]:
            base, got = mean(t["layout"], "none", n), t["accuracy"][str(n)]["mean"]
            if None in (base, got):
                continue
            helps.append({"layout": t["layout"], "schedule": t["schedule"], "length": n,
                          "none": base, "with": got, "gain": got - base,
                          "helps": got - base >= GAP and got > baseline.get(str(n), 0.0)})
    verdicts["schedules"] = {"rule": f"mean accuracy at 4L or 8L >= no schedule + {GAP}, above "
                                     "the baseline", "cells": helps}
    return {"plan": plan, "lengths": lengths, "table": table, "baseline": baseline,
            "verdicts": verdicts, "models": results}


def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def render(summary: dict) -> str:
    """LAYOUTS.md: the table, the baseline row and the verdicts, generated from summary.json."""
    lengths, L = summary["lengths"], summary["plan"]["L"]
    head = " | ".join(f"{n // L}L" for n in lengths)
    out = ["# NoPE inside hybrid layouts: retrieval past the training length", "",
           "Generated from summary.json by experiments/nope_layouts (see its study.py for the "
           "design, analysis.py for the rules). Whole-answer accuracy of the kv task at the "
           f"chosen checkpoint, L = {L}, mean (min..max) over seeds; schedules act on the NoPE "
           "layers only; only seeds that reached the gate count (seeds: trained (at the gate)). "
           + scored_with(summary),
           "", f"| layout | schedule | seeds | {head} |",
           "|---|---|---|" + "---|" * len(lengths)]
    for t in summary["table"]:
        cells = " | ".join(
            f"{_f(a['mean'])} ({_f(a['min'])}..{_f(a['max'])})" if a["n"] > 1 else _f(a["mean"])
            for a in (t["accuracy"][str(n)] for n in lengths))
        out.append(f"| {t['layout']} | {t['schedule']} | {t['seeds']} ({t['at_gate']}) | {cells} |")
    out.append("| no retrieval (baseline) | - | - | " + " | ".join(
        _f(summary["baseline"].get(str(n))) for n in lengths) + " |")
    v = summary["verdicts"]
    out += ["", "## Verdicts", "",
            f"- **Furthest** ({v['furthest']['rule']}): " + (
                f"{', '.join(v['furthest']['layouts'])} (" + ", ".join(
                    f"{k} {_f(x)}" for k, x in v["furthest"]["reach"].items()) + ")."
                if v["furthest"]["layouts"] else "no layout has the seeds for a verdict.")]
    helped = [c for c in v["schedules"]["cells"] if c["helps"]]
    out.append(f"- **Schedules** ({v['schedules']['rule']}): " + (
        "; ".join(f"{c['schedule']} helps {c['layout']} at {c['length'] // L}L "
                  f"({_f(c['none'])} -> {_f(c['with'])})" for c in helped)
        if helped else "none helps any layout by the rule") + ".")
    if v.get("no_verdict"):
        out.append(f"- **No verdict** (< {MIN_SEEDS} seeds at the gate): " + ", ".join(
            f"{lay} ({why})" for lay, why in v["no_verdict"].items()) + ".")
    models = summary["models"]
    out += ["", "## Checkpoints (the rule: the first >= 0.9 at L, validation documents; training "
                "stops at the first segment end after it, or at the budget)", "",
            "| model | gate step (chosen) | stopped at |", "|---|---|---|"]
    out += [f"| {m['model']['name']} | {m['rule']['chosen'] or 'none (gate not reached)'} | "
            f"{m['rule']['final']} |" for m in models]
    return "\n".join(out) + "\n"
