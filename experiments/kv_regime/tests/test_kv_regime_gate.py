"""The kv regime's gate (experiments/kv_regime/analysis.py), pinned before its runs: every seed on
every format (not the best seed), the threshold, the margin over the no-retrieval baseline, the
number of seeds."""
from experiments.kv_regime.analysis import FORMATS, GATE, MARGIN, MIN_SEEDS, gate, passes


def all_formats(acc=1.0, base=0.0):
    return {f: (acc, base) for f, _, _ in FORMATS}


def test_constants_as_registered():
    assert (GATE, MARGIN, MIN_SEEDS) == (0.9, 0.1, 3)
    assert len(FORMATS) == 7 and {f for _, _, f in FORMATS} == {"uniform", "zipf"}


def test_every_seed_must_pass_not_the_best():
    scores = {f"nope-s{s}": all_formats() for s in range(3)}
    assert gate(scores)["nope"]["verdict"] == "passes"
    scores["nope-s2"] = {**all_formats(), "2 distractors": (0.5, 0.0)}  # one seed, one format
    g = gate(scores)["nope"]
    assert g["verdict"] == "fails" and g["failures"] == [("nope-s2", "2 distractors", 0.5, 0.0)]


def test_threshold_and_margin():
    assert passes(GATE, 0.0) and not passes(GATE - 0.01, 0.0)
    assert not passes(1.0, 1.0) and not passes(0.95, 0.9) and passes(1.0, 0.9)


def test_a_missing_format_fails_and_few_seeds_give_no_pass():
    scores = {f"rope-s{s}": all_formats() for s in range(2)}
    assert gate(scores)["rope"]["verdict"].startswith("too few seeds")
    scores["rope-s2"] = {k: v for k, v in all_formats().items() if k != "skewed filler"}
    assert gate(scores)["rope"]["verdict"] == "fails"
