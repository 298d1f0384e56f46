"""The layout study's rules (experiments/nope_layouts/analysis.py) on hand-made results: the mean
over seeds, the furthest layout, a schedule that helps by the pre-registered gap and one that does
not, the baseline row, and the generated table."""
import pytest

from experiments.nope_layouts.analysis import GAP, MIN_SEEDS, render, summarize

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
        model("nope", 2, {"none": [1, .7, .1, 0], "llama4": [1, .7, .3, .05]}),
        model("nope", 3, {"none": [.1, 0, 0, 0], "llama4": [.1, 0, 0, 0]}, chosen=None),
        model("rope", 0, {"none": [1, 0, 0, 0]}),
        model("rope", 1, {"none": [1, 1, 1, 1]}),  # 2 seeds at the gate: no verdict, however far
        model("rope", 2, {"none": [.2, 0, 0, 0]}, chosen=None),  # never reached the gate
        model("irope", 0, {"none": [.1, 0, 0, 0]}, chosen=None),
    ]
    s = summarize(PLAN, results)
    nope = next(t for t in s["table"] if (t["layout"], t["schedule"]) == ("nope", "llama4"))
    assert nope["seeds"] == 4 and nope["at_gate"] == 3  # the seed off the gate counts nowhere
    assert nope["accuracy"]["256"] == {"mean": pytest.approx(0.3), "min": 0.1, "max": 0.5, "n": 3}
    assert s["verdicts"]["furthest"]["layouts"] == ["nope"]  # rope's 1.0 at 2-4L is no verdict
    assert s["verdicts"]["no_verdict"] == {"rope": "2 of 3 seeds at the gate",
                                           "irope": "0 of 1 seeds at the gate"}
    helps = {(c["layout"], c["length"], c["helps"]) for c in s["verdicts"]["schedules"]["cells"]}
    assert helps == {("nope", 256, True), ("nope", 512, False)}  # +0.2 at 4L counts, +0.05 (< GAP) not
    assert GAP == 0.1 and MIN_SEEDS == 3
    md = render(s)
    assert "| nope | llama4 | 4 (3) | 1.00 (1.00..1.00) | 0.70 (0.60..0.80) | 0.30 (0.10..0.50) |" in md
    assert "| no retrieval (baseline) | - | - | 0.00 | 0.00 | 0.00 | 0.00 |" in md
    assert "llama4 helps nope at 4L (0.10 -> 0.30)" in md
    assert "| rope | none | 3 (2) | 1.00 (1.00..1.00) | 0.50 (0.00..1.00) |" in md
    assert "| irope | none | 1 (0) | - | - | - | - |" in md
    assert "**No verdict** (< 3 seeds at the gate): rope (2 of 3 seeds at the gate), irope" in md
    assert "| irope-s0 | none (gate not reached) | step_0002500 |" in md
