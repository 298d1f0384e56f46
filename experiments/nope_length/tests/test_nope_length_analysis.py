"""The kv study's judgement (experiments/nope_length/analysis.py): the log fit is the paper's form,
the best c is chosen by accuracy then NLL, and each verdict follows its pre-registered threshold
from the numbers (a made-up result set where NoPE extends and RoPE does not, and its reverse)."""
import json
import math
from pathlib import Path

from experiments.nope_length.analysis import ENTROPY_RISE, FIT_R2, GAP, best_c, fit_log, render, summarize

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


def test_a_results_page_names_the_eval_protocol_that_scored_it(tmp_path):
    """Study.record() puts the current `lenext eval tasks` protocol in summary.json and every
    study's page says it; a summary from before it was recorded is version 0, said with what
    differs (the published pages of nope_length, layouts, sizes and stage2)."""
    import importlib

    from experiments.nope_length.study import Plan, Study
    from lenext_dist.eval.jobs import TasksJob

    rec = Study(Plan(models=(), steps=10), tmp_path).record()
    assert rec["tasks_protocol_version"] == TasksJob.protocol_version >= 1 and "timings_s" in rec
    now = {**summarize(PLAN, [_model("nope-s0", "nope", {1.0: [1, 0.5, 0, 0]})], []), **rec}
    old = {k: v for k, v in now.items() if k != "tasks_protocol_version"}
    assert f"protocol version {TasksJob.protocol_version}." in render(now)
    assert "protocol version 0: a cell's documents seeded by its place" in render(old)
    for exp, page in (("nope_length", "STUDY.md"), ("nope_layouts", "LAYOUTS.md"), ("sizes", "SIZES.md"),
                      ("stage2", "STAGE2.md")):
        results = Path(__file__).parents[2] / exp / "results"
        summary = json.loads((results / "summary.json").read_text())
        md = importlib.import_module(f"experiments.{exp}.analysis").render(summary)
        assert md == (results / page).read_text(), f"{exp}/results/{page} is not render(summary.json)"
        assert f"protocol version {summary.get('tasks_protocol_version', 0)}" in md


# Each claim's condition pinned (issue 43): a change of any threshold, or of "every seed" into
# "the best seed" (or a mean), turns one of these verdicts. Cells: accuracy at 1, 2, 4, 8 L.
def _verdict(claim, nope, rope=()):
    return summarize(PLAN, list(nope) + list(rope), [])["claims"][claim]["verdict"]


def _rope(at2=0.0):
    return _model("rope-s0", "rope", {1.0: [1.0, at2, 0.0, 0.0]})


def test_the_gate_is_0_9_at_L_on_every_seed():
    seeds = [_model(f"nope-s{s}", "nope", {1.0: [a, 0.5, 0.1, 0.0]}) for s, a in enumerate((0.9, 1.0, 1.0))]
    assert _verdict("retrieval_at_L", seeds, [_rope()]) == "holds"  # 0.9 itself passes
    seeds[0] = _model("nope-s0", "nope", {1.0: [0.89, 0.5, 0.1, 0.0]})  # one seed under it
    assert _verdict("retrieval_at_L", seeds, [_rope()]) == "fails"
    assert _verdict("retrieval_at_L", seeds[1:], [_model("rope-s0", "rope", {1.0: [0.85, 0, 0, 0]})]) == "fails"


def test_nope_beats_rope_at_2L_by_gap_on_every_seed_not_the_best():
    def world(nope_at2, rope_at2):
        nope = [_model(f"nope-s{s}", "nope", {1.0: [1.0, a, 0.1, 0.0]}) for s, a in enumerate(nope_at2)]
        rope = [_model(f"rope-s{s}", "rope", {1.0: [1.0, a, 0.0, 0.0]}) for s, a in enumerate(rope_at2)]
        return _verdict("nope_extends_further", nope, rope)

    assert world((0.75, 0.5), (0.25, 0.0)) == "holds"  # worst NoPE 0.5 - best RoPE 0.25 = 0.25
    assert world((0.75, 0.4), (0.25, 0.0)) == "fails"  # 0.15 < GAP: the best seed alone would pass
    assert world((0.9, 0.9), (0.8, 0.0)) == "fails"  # one RoPE seed close: the mean would pass


def test_uniform_c_restores_needs_gap_at_both_far_lengths_on_every_seed():
    def world(gains):
        return _verdict("uniform_c_restores", [
            _model(f"nope-s{s}", "nope", {1.0: [1.0, 0.8, 0.1, 0.0], 1.5: [0.9, 0.8, 0.1 + g4, g8]})
            for s, (g4, g8) in enumerate(gains)])

    assert world([(0.25, 0.25), (0.5, 0.5)]) == "holds"
    assert world([(0.25, 0.15), (0.5, 0.5)]) == "fails"  # one seed under GAP at 8L
    assert world([(0.15, 0.5), (0.5, 0.5)]) == "fails"  # at 4L too


def test_best_c_fit_needs_a_positive_slope_and_r2_at_least_0_5():
    def world(c_at):  # the c that retrieves best at 2, 4, 8 L (its accuracy 1, the others 0.5)
        grid = {c: [1.0] + [1.0 if c == c_at[k] else 0.5 for k in range(3)]
                for c in sorted(set(c_at) | {1.0})}
        return summarize(PLAN, [_model("nope-s0", "nope", grid)], [])["claims"]["best_c_fit"]

    assert world((1.1, 1.2, 1.3))["verdict"] == "holds"  # exactly 1 + 0.144 ln s
    assert world((1.0, 1.0, 1.0))["verdict"] == "fails"  # a = 0
    noisy = world((1.5, 1.0, 1.25))  # a > 0, but the points do not follow ln s
    assert noisy["numbers"]["a"] > 0 and noisy["numbers"]["r2"] < 0.5 and noisy["verdict"] == "fails"
    # either side of FIT_R2 (a change of the threshold, or of >= into >, turns one of them)
    above, below = world((1.0, 1.05, 1.6)), world((1.0, 1.2, 1.15))
    assert 0.5 <= above["numbers"]["r2"] < 0.53 and above["verdict"] == "holds"
    assert 0.47 < below["numbers"]["r2"] < 0.5 and below["numbers"]["a"] > 0 and below["verdict"] == "fails"
    assert FIT_R2 == 0.5


def test_entropy_mechanism_holds_only_if_every_seed_spreads_and_sharpens():
    good = _model("nope-s0", "nope", {1.0: [1.0, 0.5, 0.2, 0.0], 1.5: [0.9, 0.8, 0.7, 0.6]})
    assert _verdict("entropy_mechanism", [good]) == "holds"
    flat = _model("nope-s1", "nope", {1.0: [1.0, 0.5, 0.2, 0.9], 1.5: [0.9, 0.8, 0.7, 0.6]})
    # seed 1 keeps 0.9 at 8L: entropy 0.36 vs 0.3 at L, a rise of 0.06 < ENTROPY_RISE
    assert _verdict("entropy_mechanism", [good, flat]) == "fails"
    # either side of ENTROPY_RISE: entropy 0.9 - 0.6 x accuracy (c = 1), so 1.0 -> 0.81 at 8L
    # rises 0.114 and 1.0 -> 0.85 rises 0.09; c = 1.5 retrieves more at 8L (sharper) in both
    def rise(at8):
        return _verdict("entropy_mechanism", [_model("nope-s0", "nope", {1.0: [1.0, 0.5, 0.2, at8],
                                                                          1.5: [0.9, 0.8, 0.7, 0.95]})])

    assert rise(0.81) == "holds" and rise(0.85) == "fails" and ENTROPY_RISE == 0.1


def test_checkpoint_dependence_is_one_cell_moving_by_gap():
    def world(final_at8):
        return _verdict("checkpoint_dependence", [_model(
            "nope-s0", "nope", {1.0: [1.0, 0.8, 0.3, 0.5], 1.5: [0.9, 0.8, 0.7, 0.5]},
            final={1.0: [1.0, 0.8, 0.3, final_at8], 1.5: [0.9, 0.8, 0.7, 0.5]})])

    assert world(0.25) == "holds" and world(0.35) == "fails"  # moves of 0.25 and 0.15


def test_checkpoint_dependence_without_a_second_checkpoint_is_not_measured():
    one = _model("nope-s0", "nope", {1.0: [1.0, 0.8, 0.3, 0.5], 1.5: [0.9, 0.8, 0.7, 0.5]})
    one["rows"] = [r for r in one["rows"] if r["checkpoint"] == "chosen"]  # the kv regime's rule
    one["rule"]["final"] = None
    summary = summarize(PLAN, [one], [])
    assert summary["claims"]["checkpoint_dependence"]["verdict"] == "not measured"
    md = render(summary, "Another intro.")
    assert "Another intro." in md and "Chosen vs final" not in md
