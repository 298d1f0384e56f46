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
    assert {n: t for n, t in sets.items() if t} == {f"{lay}-s{s}": ("tail=0:16",) for s in (0, 1, 2)
                                                    for lay in ("irope", "irope_2g")}
    assert len(sets) == 18 and (plan.steps, plan.interval, layouts.SEGMENT) == (7500, 125, 500)
    from lenext_dist.attention.layout import LAYOUTS, Options

    flags = dict(o.split("=") for o in layouts.LAYOUTS["irope_2g"][1])
    every = Options(int(flags["--attention.layout.every"]), [], [])
    layers = LAYOUTS[flags["--attention.layout.kind"]](4, "rope", every)
    assert layers == [("rope", True), ("nope", False), ("rope", True), ("nope", False)]
