"""The stage-2 study's pre-registered rules (experiments/stage2/analysis.py, study.py) on hand-made
results: the best zero-shot method, the per-seed verdicts with the gap and the baseline, gated
bases only, what stage 2 costs at L, the stage-2 run's settings, and --publish refusing a
partial or quick study."""
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from experiments.stage2 import study
from experiments.stage2.analysis import GAP, MIN_SEEDS, STAGE2, best_zero_shot, render, summarize

L = 64
PLAN = {"L": L, "multiples": [1, 4, 8, 16], "verdict_multiples": [4, 8, 16], "stage2_steps": 300,
        "stage2_factor": 4, "theta_factor": 16.0}


def cells(accs, base=0.0):
    return [{"length": k * L, "accuracy": a, "baseline": {"accuracy": base}}
            for k, a in zip(PLAN["multiples"], accs) if a is not None]


def model(layout, seed, rows, gated=True, base=0.0):
    tag = "step_0001000" if gated else None
    return {"model": {"name": f"{layout}-s{seed}"}, "layout": layout, "seed": seed,
            "rule": {"chosen": tag, "final": "step_0002500"}, "gated": gated,
            "base_tag": tag or "step_0002500", "stage1_steps": 2500,
            "stage2": {"tag": "step_0000300", "rope_base": None if layout == "nope" else (1e4, 1.6e5)},
            "rows": [{"method": m, "cells": cells(a, base)} for m, a in rows.items()]}


def verdict(s, layout, k):
    return next(v for v in s["verdicts"] if v["layout"] == layout and v.get("length") == k * L)


def test_best_zero_shot_is_the_highest_mean_over_gated_seeds_ties_to_the_first():
    rs = [model("nope", 0, {"none": [1, .25, 0, 0], "llama4": [1, .25, 0, 0], "log": [1, .75, 0, 0]}),
          model("nope", 1, {"none": [1, .25, 0, 0], "llama4": [1, .75, 0, 0], "log": [1, .25, 0, 0]})]
    both = [0, 1]
    assert best_zero_shot(rs, "nope", ["none", "llama4", "log"], 4 * L, both) == "llama4"  # tie: first
    assert best_zero_shot(rs, "nope", ["none", "log", "llama4"], 4 * L, both) == "log"
    assert best_zero_shot(rs, "nope", ["none", "llama4", "log"], 4 * L, [0]) == "log"  # gated seeds only
    assert best_zero_shot(rs, "nope", ["none", "llama4", "log"], 8 * L, both) == "none"
    assert best_zero_shot(rs, "nope", ["none", "yarn"], 8 * L, both) == "none"  # yarn not scored


def test_verdicts_per_seed_with_the_gap_and_the_baseline():
    rs = [
        # nope: stage 2 beats the best (llama4) at 4L on both seeds by >= GAP; at 8L on one seed
        # only; at 16L zero-shot wins on both
        model("nope", 0, {"none": [.9, .2, 0, .5], "llama4": [.9, .5, .3, .6],
                          STAGE2: [.9, .7, .5, .1]}),
        model("nope", 1, {"none": [.9, .2, 0, .5], "llama4": [.9, .5, .3, .6],
                          STAGE2: [.5, .62, .35, .2]}),
        # rope: one base not gated -> no verdict at all, whatever the numbers
        model("rope", 0, {"none": [1, 0, 0, 0], STAGE2: [1, 1, 1, 1]}),
        model("rope", 1, {"none": [.1, 0, 0, 0], STAGE2: [1, 1, 1, 1]}, gated=False),
    ]
    s = summarize(PLAN, rs, expected=4)
    assert not s["partial"] and GAP == 0.1 and MIN_SEEDS == 2
    v4 = verdict(s, "nope", 4)
    assert v4["best_zero_shot"] == "llama4" and v4["verdict"] == "stage 2 wins"
    assert v4["stage2"] == [.7, .62] and v4["zero_shot"] == [.5, .5]
    assert verdict(s, "nope", 8)["verdict"] == "no clear difference"  # +0.2 and +0.05
    assert verdict(s, "nope", 16)["verdict"] == "zero-shot wins"
    assert verdict(s, "nope", 1)["verdict"] == "mixed"  # seed 0 keeps L, seed 1 loses 0.4
    rope = [v for v in s["verdicts"] if v["layout"] == "rope"]
    assert rope == [{"layout": "rope", "seeds": [0], "verdict": None,
                     "why": "1 of 2 bases gated (< 2)"}]
    row = next(t for t in s["table"] if (t["layout"], t["method"]) == ("rope", STAGE2))
    assert row["seeds"] == 2 and row["gated"] == 1  # the not-gated seed is in the table
    md = render(s)
    assert "| nope | base, llama4 | 2 (2) | 0.90 (0.90..0.90) | 0.50 (0.50..0.50) |" in md
    assert "| nope | stage 2 | 2 (2) | 0.70 (0.50..0.90) | 0.66 (0.62..0.70) |" in md
    assert "- nope at 4L: **stage 2 wins** (stage 2 0.70, 0.62 vs best zero-shot `llama4` 0.50, 0.50" in md
    assert "- rope: no verdict (1 of 2 bases gated (< 2))." in md
    assert "| rope-s1 | 2500 | not gated (final step_0002500) | step_0000300 | 10000 -> 160000 |" in md
    assert "Partial" not in md


def test_a_win_needs_more_than_the_no_retrieval_baseline_and_partial_is_marked():
    rows = {"none": [.9, .0, 0, 0], STAGE2: [.9, .3, 0, 0]}
    high = summarize(PLAN, [model("nope", s, rows, base=.35) for s in (0, 1)], expected=4)
    assert verdict(high, "nope", 4)["verdict"] == "no clear difference"  # 0.3 <= baseline 0.35
    low = summarize(PLAN, [model("nope", s, rows, base=.2) for s in (0, 1)], expected=4)
    assert verdict(low, "nope", 4)["verdict"] == "stage 2 wins"
    assert low["partial"] and "**Partial: 2 of the plan's models done**" in render(low)
    assert verdict(low, "nope", 1)["verdict"] == "keeps L"


def test_stage2_runs_settings(tmp_path):
    p = study.full_plan()
    assert {m.name for m in p.models} == {f"{x}-s{s}" for x in ("nope", "rope", "interleave", "irope")
                                          for s in (0, 1)}
    by = {m.name: m for m in p.models}
    assert study.stage1_steps(p, by["nope-s0"]) == 2500 and study.stage1_steps(p, by["irope-s1"]) == 5000
    args = study.stage2_overrides(p, by["interleave-s1"], tmp_path / "base", tmp_path / "sh", tmp_path / "t")
    assert "--model.seq_length=256" in args and "--model.train_length=64" in args  # L stays L
    assert "--train.global_batch_size=16" in args  # 16 x 256 = stage 1's 64 x 64 tokens a step
    assert "--train.steps=300" in args and f"--checkpoint.init_from={tmp_path / 'base'}" in args
    assert args[-1] == "--attention.rope.base=160000"  # after the layout's own overrides
    assert "--attention.layout.kind=nope_every" in args
    nope = study.stage2_overrides(p, by["nope-s0"], tmp_path, tmp_path, tmp_path)
    assert not any("rope.base" in a for a in nope)


def test_publish_refuses_a_partial_or_quick_study(tmp_path, monkeypatch):
    monkeypatch.setattr(study, "HERE", tmp_path / "pkg")
    out = tmp_path / "out"
    out.mkdir()
    (out / "STAGE2.md").write_text("x\n")
    (out / "summary.json").write_text(json.dumps({"plan": asdict(study.full_plan()), "partial": True}))
    with pytest.raises(SystemExit, match="summary.json is partial"):
        study.main(["--publish", "--out", str(out)])
    (out / "summary.json").write_text(json.dumps({"plan": asdict(study.quick_plan()), "partial": False}))
    with pytest.raises(SystemExit, match="not the full study's"):
        study.main(["--publish", "--out", str(out)])
    (out / "summary.json").write_text(json.dumps({"plan": asdict(study.full_plan()), "partial": False}))
    assert study.main(["--publish", "--out", str(out)]) == 0
    assert Path(tmp_path / "pkg" / "results" / "STAGE2.md").read_text() == "x\n"
