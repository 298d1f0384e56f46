"""`--publish` of the studies copies only a full study's records (issue 40: `nope_layouts --quick
--publish` overwrote the published 65-minute study, and `nope_length --publish --out <a quick
folder>` passed its own --quick refusal): the plan in summary.json decides, not the flags."""
import json
import shutil
from dataclasses import asdict

import pytest

from experiments.nope_layouts import study as layouts
from experiments.nope_length import study as length

STUDIES = [(length, ("summary.json", "STUDY.md")), (layouts, ("summary.json", "LAYOUTS.md"))]


@pytest.mark.parametrize("study,names", STUDIES, ids=["nope_length", "nope_layouts"])
def test_only_the_full_study_is_published(study, names, tmp_path, monkeypatch):
    # a full study's records are published, the published ones too (nope_length's were written
    # before Plan.interval and Model.train_set existed: a field a record lacks ran at its default)
    full = tmp_path / "full"
    full.mkdir()
    (full / "summary.json").write_text(json.dumps({"plan": asdict(study.full_plan())}))
    (full / names[1]).write_text("the full study\n")
    for records in (full, study.HERE / "results"):
        study.publish(records, tmp_path / "again", names, full=study.full_plan())
        assert all((tmp_path / "again" / n).read_bytes() == (records / n).read_bytes() for n in names)
    # a quick run's records, in the default quick folder or any --out
    quick = tmp_path / "quick"
    quick.mkdir()
    (quick / "summary.json").write_text(json.dumps({"plan": asdict(study.quick_plan())}))
    (quick / names[1]).write_text("a smoke run\n")
    dest = tmp_path / "dest"
    monkeypatch.setattr(study, "HERE", tmp_path / "pkg")  # where --publish would copy to
    for argv in (["--publish", "--out", str(quick)], ["--quick", "--publish", "--out", str(quick)]):
        with pytest.raises(SystemExit, match=r"summary.json is not the full study's \(steps 60, .*a --quick "
                                             r"run\?\): --publish takes the full study's results only"):
            study.main(argv)
    with pytest.raises(SystemExit, match="not the full study's"):
        study.publish(quick, dest, names, full=study.full_plan())
    assert not dest.exists() and not (tmp_path / "pkg").exists()
    shutil.rmtree(tmp_path / "again")


def test_the_chunked_layouts_train_with_the_question_anywhere_in_a_chunk():
    """The plans written before the iRoPE retrain and before irope_2g: 0-16 filler tokens after
    the answer (the evaluation documents' span below L) for the chunked layouts' three seeds each,
    the regime's documents for the rest; the budget, segments and checkpoints as for every layout;
    irope_2g's global layers are 2 and 4."""
    plan = layouts.full_plan()
    sets = {m.name: m.train_set for m in plan.models}
    chunked = {f"irope-s{s}" for s in range(9)} | {f"irope_2g-s{s}" for s in (0, 1, 2)}
    assert {n: t for n, t in sets.items() if t} == {n: ("tail=0:16",) for n in chunked}
    assert len(sets) == 24 and (plan.steps, plan.interval, layouts.SEGMENT) == (7500, 125, 500)
    from lenext_dist.attention.layout import LAYOUTS, Options

    flags = dict(o.split("=") for o in layouts.LAYOUTS["irope_2g"][1])
    every = Options(int(flags["--attention.layout.every"]), [], [])
    layers = LAYOUTS[flags["--attention.layout.kind"]](4, "rope", every)
    assert layers == [("rope", True), ("nope", False), ("rope", True), ("nope", False)]


def test_irope_trains_more_seeds_only_until_three_are_at_the_gate():
    """The plan written before iRoPE's seeds 3-8: in order after 0-2, each only while fewer than
    MIN_SEEDS (3) of the layout's earlier seeds reached the gate; other layouts keep three seeds."""
    plan = layouts.full_plan()
    assert layouts.MORE_SEEDS == {"irope": (3, 4, 5, 6, 7, 8)} and layouts.MIN_SEEDS == 3
    names = [m.name for m in plan.models]
    assert names.index("irope-s3") == names.index("irope-s2") + 1  # trained after the first three
    by = {m.name: m for m in plan.models}
    gate, off = {"chosen": "step_0001000"}, {"chosen": None}
    rules = {"irope-s0": gate, "irope-s1": off, "irope-s2": off, "irope_2g-s0": gate,
             "irope_2g-s1": gate, "irope_2g-s2": gate, "nope-s0": gate}  # other layouts do not count
    assert layouts.next_seed_needed(by["irope-s3"], rules)
    assert layouts.next_seed_needed(by["irope-s4"], {**rules, "irope-s3": gate})
    assert not layouts.next_seed_needed(by["irope-s5"], {**rules, "irope-s3": gate, "irope-s4": gate})
    assert layouts.next_seed_needed(by["irope-s5"], {**rules, "irope-s3": gate, "irope-s4": off})
    assert layouts.next_seed_needed(by["irope-s0"], {"irope-s9": gate, "irope-s8": gate, "irope-s7": gate})
