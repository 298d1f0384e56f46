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
    # a full study's records are published (the published ones; nope_length's were written
    # before Plan.interval existed: a field a record lacks ran at its default)
    full = study.HERE / "results"
    study.publish(full, tmp_path / "again", names, full=study.full_plan())
    assert all((tmp_path / "again" / n).read_bytes() == (full / n).read_bytes() for n in names)
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
