"""The size study's rules (experiments/sizes/analysis.py) on hand-made results: the slope verdict
needs every seed of the largest size above (or below) every seed of the smallest, >= 3 seeds at
the gate per size and >= 3 such sizes; an ablation of HeadScale differs only when every seed is
on one side and the mean difference is >= GAP. Each condition is pinned here."""
import math

import pytest

from experiments.sizes.analysis import (GAP, MIN_SEEDS, MIN_SIZES, PAPER_A, plot, render,
                                        slope_verdict, summarize)

L = 64
MULT = [1, 2, 4, 8, 16]
GRID = [1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0]
PLAN = {"L": L, "multiples": MULT}


def model(size, seed, best, gated=True):
    """best: k -> the c that retrieves best at kL (0.9 there, 0.1 for the others)."""
    rows = [{"checkpoint": "chosen", "method": "uniform", "c": c,
             "cells": [{"length": k * L, "accuracy": 0.9 if best.get(k, 1.0) == c else 0.1,
                        "answer_nll": 0.1} for k in MULT]} for c in GRID]
    return {"model": {"name": f"{size}-s{seed}"}, "size": size, "rows": rows,
            "rule": {"chosen": "step_0000500" if gated else None, "final": "step_0001000"}}


def a_of(best):  # the least-squares slope through the origin of (ln k, c - 1)
    return sum(math.log(k) * (c - 1) for k, c in best.items()) / sum(math.log(k) ** 2 for k in best)


SMALL = [{2: 1.1, 4: 1.2, 8: 1.3, 16: 1.3}, {2: 1.1, 4: 1.2, 8: 1.2, 16: 1.3}, {2: 1.0, 4: 1.2, 8: 1.3, 16: 1.5}]
LARGE = [{2: 1.2, 4: 1.5, 8: 1.75, 16: 2.0}, {2: 1.3, 4: 1.5, 8: 1.75, 16: 2.0}, {2: 1.2, 4: 1.5, 8: 1.5, 16: 2.0}]
PARAMS = {"small": 100, "mid": 200, "large": 800}


def results(large=LARGE, gated_large=(True, True, True)):
    out = [model("small", i, b) for i, b in enumerate(SMALL)]
    out += [model("mid", i, b) for i, b in enumerate(SMALL)]
    out += [model("large", i, b, g) for i, (b, g) in enumerate(zip(large, gated_large))]
    return out


def test_the_fit_per_seed_and_per_size_and_a_slope_that_grows(tmp_path):
    s = summarize(PLAN, results(), [], PARAMS)
    large = next(r for r in s["sizes"] if r["size"] == "large")
    assert large["a_seeds"]["large-s0"] == pytest.approx(a_of(LARGE[0]))
    assert large["best_c"]["large-s1"] == {"2L": 1.3, "4L": 1.5, "8L": 1.75, "16L": 2.0}
    assert s["slope"]["verdict"] == "grows" and s["slope"]["largest"] == "large"
    assert s["slope"]["in_paper_range"] == (PAPER_A[0] <= large["a"] <= PAPER_A[1])
    md = render(s)
    assert "**Does a grow with size?** grows (small -> large" in md and "| large | 800 | 3 (3) |" in md
    assert plot(s, tmp_path / "a.png") and (tmp_path / "a.png").stat().st_size > 0


def test_the_figure_is_drawn_with_no_size_fitted(tmp_path):
    s = summarize(PLAN, [model("small", 0, {}, gated=False)], [], {"small": 100})
    plot(s, tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 0


def test_overlapping_seeds_are_no_trend_and_the_reverse_shrinks():
    overlap = [SMALL[0], LARGE[1], LARGE[2]]  # one large seed as low as the small ones
    assert summarize(PLAN, results(large=overlap), [], PARAMS)["slope"]["verdict"] == \
        "no trend beyond the seeds' spread"
    shrink = summarize(PLAN, results(), [], {"small": 800, "mid": 200, "large": 100})
    assert shrink["slope"]["verdict"] == "shrinks"  # ordered by parameters, not by name


def test_a_seed_off_the_gate_leaves_its_size_unjudged_and_too_few_sizes_no_verdict():
    s = summarize(PLAN, results(gated_large=(True, True, False)), [], PARAMS)
    large = next(r for r in s["sizes"] if r["size"] == "large")
    assert large["at_gate"] == 2 and not large["judged"] and "large-s2" not in large["a_seeds"]
    assert s["slope"]["verdict"].startswith("not judged: 2 size(s) with >= 3 seeds at the gate")
    assert MIN_SEEDS == 3 and MIN_SIZES == 3
    assert slope_verdict([])["verdict"].startswith("not judged: 0 size(s)")


def hs(seed, variant, acc, target=2):
    return {"model": f"large-s{seed}", "target": target, "T": target * L, "variant": variant,
            "cells": [{"length": target * L, "accuracy": acc}, {"length": L, "accuracy": 1.0}]}


def test_an_ablation_differs_only_on_one_side_for_every_seed_and_by_gap():
    runs = [hs(i, "full", a) for i, a in enumerate((0.5, 0.6, 0.7))]
    runs += [hs(i, "no bound", a) for i, a in enumerate((0.2, 0.3, 0.4))]  # -0.3 on every seed
    runs += [hs(i, "init 1", a) for i, a in enumerate((0.9, 0.2, 0.95))]  # sides disagree
    s = summarize(PLAN, results(), runs, PARAMS)
    ab = s["headscale"]["2L"]["ablations"]
    assert ab["no bound"]["differs"] and ab["no bound"]["mean_difference"] == pytest.approx(-0.3)
    assert not ab["init 1"]["differs"]
    assert s["headscale_verdict"] == "differs from the search: 2L no bound"
    small = [hs(i, "no bound", a - GAP / 2) for i, a in enumerate((0.5, 0.6, 0.7))]
    s = summarize(PLAN, results(), runs[:3] + small, PARAMS)  # one side, but less than GAP
    assert s["headscale_verdict"] == "the search and its ablations cannot be told apart"
    assert GAP == 0.2
    two = summarize(PLAN, results(), runs[:2] + [hs(i, "no bound", a) for i, a in enumerate((0.1, 0.2))],
                    PARAMS)  # -0.4 on both seeds, but two seeds are not enough
    assert not two["headscale"]["2L"]["ablations"]["no bound"]["differs"]
    assert two["headscale_verdict"] == "not judged: fewer than 3 seeds run both ways"
    md = render(s)
    # beside them, c = 1 on the same models: the room any temperature has (no verdict reads it)
    assert "| 2L | 0.60 (0.50..0.70) | 0.50 (0.40..0.60) | - | 0.90 (0.90..0.90) | 0.10 (0.10..0.10) |" in md
    assert set(s["headscale"]["2L"]["ablations"]) == {"no bound"}
