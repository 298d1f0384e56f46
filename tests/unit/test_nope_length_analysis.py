"""The kv study's judgement (experiments/nope_length/analysis.py): the log fit is the paper's form,
the best c is chosen by accuracy then NLL, and each verdict follows its pre-registered threshold
from the numbers (a made-up result set where NoPE extends and RoPE does not, and its reverse)."""
import math

from experiments.nope_length.analysis import GAP, best_c, fit_log, render, summarize

L = 64
MULT = (1, 2, 4, 8)


def _cells(accs, nll=0.1):
    # entropy at the answer queries rises where the accuracy falls (the mechanism's shape)
    return [{"length": k * L, "accuracy": a, "answer_nll": nll, "token_accuracy": a,
             "baseline": {"accuracy": 0.0, "token_accuracy": 0.2},
             "entropy": {"answers_mean": 0.9 - 0.6 * a}} for k, a in zip(MULT, accs)]


def _model(name, position, by_c, final=None):
    rows = [{"checkpoint": "chosen", "tag": "step_0000500", "method": "uniform", "c": c,
             "cells": _cells(a)} for c, a in by_c.items()]
    rows += [{"checkpoint": "final", "tag": "step_0003000", "method": "uniform", "c": c,
              "cells": _cells(a)} for c, a in (final or by_c).items()]
    return {"model": {"name": name, "position": position, "seed": 0, "overrides": []},
            "rule": {"chosen": "step_0000500", "final": "step_0003000", "gate": 0.9,
                     "scanned": [{"tag": "step_0000500", "score": 0.95}]}, "rows": rows}


PLAN = {"L": L, "multiples": list(MULT), "steps": 3000, "docs": 128}


def test_fit_log_recovers_a_and_r2():
    pts = [(s, 1 + 0.2 * math.log(s)) for s in (2, 4, 8, 16)]
    fit = fit_log(pts)
    assert abs(fit["a"] - 0.2) < 1e-9 and abs(fit["r2"] - 1) < 1e-9
    assert fit_log(pts[:1])["a"] is None


def test_best_c_takes_accuracy_then_the_lower_nll():
    m = _model("n", "nope", {1.0: [1, 0.5, 0.1, 0], 1.5: [0.9, 0.5, 0.6, 0.7]})
    assert best_c(m, 4 * L)["c"] == 1.5 and best_c(m, L)["c"] == 1.0
    m["rows"][1]["cells"][1]["answer_nll"] = 0.05  # a tie at 2L: the lower NLL wins
    assert best_c(m, 2 * L)["c"] == 1.5


def test_verdicts_follow_the_numbers():
    nope = [_model(f"nope-s{s}", "nope", {1.0: [0.97, 0.85, 0.1, 0.0], 1.2: [0.95, 0.9, 0.7, 0.3],
                                           1.5: [0.6, 0.65, 0.65, 0.7]},
                   final={1.0: [1, 0.9, 0.2, 0.0], 1.5: [0.1, 0.1, 0.1, 0.1]}) for s in (0, 1)]
    rope = [_model(f"rope-s{s}", "rope", {1.0: [1.0, 0.0, 0.0, 0.0], 1.5: [1.0, 0.0, 0.0, 0.0]})
            for s in (0, 1)]
    claims = summarize(PLAN, nope + rope, [])["claims"]
    assert claims["retrieval_at_L"]["verdict"] == "holds"
    assert claims["nope_extends_further"]["verdict"] == "holds"
    assert claims["uniform_c_restores"]["verdict"] == "holds"  # +0.6 and +0.7 at 4L, 8L >= GAP
    fit = claims["best_c_fit"]
    assert fit["numbers"]["a"] > 0 and fit["verdict"] in ("holds", "fails")
    assert claims["checkpoint_dependence"]["verdict"] == "holds"  # c=1.5 at 8L: 0.7 -> 0.1
    assert claims["headscale_vs_uniform"]["verdict"] == "not measured"
    assert claims["entropy_mechanism"]["verdict"] == "holds"  # 0.9 at 8L (c = 1), 0.48 at c = 1.5
    # the reverse world: RoPE extends, NoPE does not, no c helps, one seed below the gate
    flat = [_model("nope-s0", "nope", {1.0: [0.8, 0.0, 0.0, 0.0], 1.5: [0.5, 0.0, 0.0, 0.0]})]
    far = [_model("rope-s0", "rope", {1.0: [1.0, 0.9, 0.9, 0.9]})]
    claims = summarize(PLAN, flat + far, [])["claims"]
    for k in ("retrieval_at_L", "nope_extends_further", "uniform_c_restores", "best_c_fit",
              "checkpoint_dependence", "entropy_mechanism"):
        assert claims[k]["verdict"] == "fails", k
    assert GAP == 0.2


def test_render_shows_every_claim_and_the_baseline():
    summary = summarize(PLAN, [_model("nope-s0", "nope", {1.0: [1, 0.5, 0, 0], 1.5: [0.9] * 4})], [])
    md = render(summary)
    assert all(c["claim"] in md for c in summary["claims"].values())
    assert "| no retrieval (baseline) | - | - | 0.00 | 0.00 | 0.00 | 0.00 |" in md
