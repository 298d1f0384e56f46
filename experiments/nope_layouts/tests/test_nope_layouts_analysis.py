"""The layout study's rules (experiments/nope_layouts/analysis.py) on hand-made results: the mean
over seeds, the furthest layout, a schedule that helps by the pre-registered gap and one that does
not, the baseline row, and the generated table."""
from experiments.nope_layouts.analysis import GAP, render, summarize

L = 64
PLAN = {"L": L, "multiples": [1, 2, 4, 8]}


def cells(accs, base=0.0):
    return [{"length": k * L, "accuracy": a, "answer_nll": 1.0 - a, "baseline": {"accuracy": base}}
            for k, a in zip(PLAN["multiples"], accs)]


def model(layout, seed, rows, chosen="step_0000250"):
    return {"model": {"name": f"{layout}-s{seed}"}, "layout": layout, "tag": chosen,
            "rule": {"chosen": chosen, "final": "step_0002500"},
            "rows": [{"schedule": s, "cells": cells(a)} for s, a in rows.items()]}


def test_rules_on_hand_made_results():
    results = [
        model("nope", 0, {"none": [1, .8, .1, 0], "llama4": [1, .8, .5, .1]}),
        model("nope", 1, {"none": [1, .6, .1, 0], "llama4": [1, .6, .1, 0]}),
        model("rope", 0, {"none": [1, 0, 0, 0]}),
        model("rope", 1, {"none": [.2, 0, 0, 0]}, chosen=None),  # never reached the gate
    ]
    s = summarize(PLAN, results)
    nope = next(t for t in s["table"] if (t["layout"], t["schedule"]) == ("nope", "llama4"))
    assert nope["seeds"] == 2 and nope["accuracy"]["256"] == {"mean": 0.3, "min": 0.1, "max": 0.5,
                                                               "n": 2}
    assert s["verdicts"]["furthest"]["layouts"] == ["nope"]
    helps = {(c["length"], c["helps"]) for c in s["verdicts"]["schedules"]["cells"]}
    assert helps == {(256, True), (512, False)}  # +0.2 at 4L counts, +0.05 at 8L does not (< GAP)
    assert GAP == 0.1
    md = render(s)
    assert "| nope | llama4 | 2 (2) | 1.00 (1.00..1.00) | 0.70 (0.60..0.80) | 0.30 (0.10..0.50) |" in md
    assert "| no retrieval (baseline) | - | - | 0.00 | 0.00 | 0.00 | 0.00 |" in md
    assert "llama4 helps nope at 4L (0.10 -> 0.30)" in md
    assert "| rope | none | 2 (1) | 0.60 (0.20..1.00) |" in md
    assert "| rope-s1 | none (gate not reached) | step_0002500 |" in md
