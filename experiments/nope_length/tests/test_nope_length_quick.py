"""The kv study's smoke run end to end (`python -m experiments.nope_length --quick`, ~2 minutes on
2 cores): the real launcher trains NoPE and RoPE, the checkpoint rule scans every checkpoint, the
records are written and sane. Never checks a scientific outcome (60 steps learn nothing)."""
import json
import subprocess
import sys

import pytest

from helpers import REPO, env

pytestmark = pytest.mark.e2e


def test_quick_study_writes_its_records(tmp_path):
    out = tmp_path / "study"
    p = subprocess.run([sys.executable, "-m", "experiments.nope_length", "--quick", "--out", str(out)],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    s = json.loads((out / "summary.json").read_text())
    assert set(s["models"]) == {"nope-s0", "rope-s0"}
    for name, m in s["models"].items():
        # 60 steps, a checkpoint every 5: the rule scanned them in order until one passed the gate
        tags = [x["tag"] for x in m["rule"]["scanned"]]
        assert tags == sorted(tags) and tags[0] == "step_0000005", name
        assert m["rule"]["final"] == "step_0000060"
        assert (m["rule"]["chosen"] is None) == all(x["score"] < 0.9 for x in m["rule"]["scanned"])
    rows = json.loads((out / "results.json").read_text())
    cells = [c for r in rows for row in r["rows"] for c in row["cells"]]
    assert cells and all(0 <= c["accuracy"] <= 1 and c["baseline"]["accuracy"] <= 1 for c in cells)
    md = (out / "STUDY.md").read_text()
    assert "| no retrieval (baseline) |" in md and "## Claims" in md
    # the quick records are never published over the full study's (whatever --out names them)
    p = subprocess.run([sys.executable, "-m", "experiments.nope_length", "--quick", "--publish",
                        "--out", str(out)], cwd=REPO, env=env(), capture_output=True, text=True)
    assert p.returncode != 0 and "not the full study's" in p.stderr and "Traceback" not in p.stderr


def test_a_work_folder_holds_one_plan(tmp_path):
    """Resuming in a folder of another plan would go on from its checkpoints under new settings
    (the layout study's budget and interval changed under an earlier folder): refused."""
    from dataclasses import replace

    from experiments.nope_length.study import Study, quick_plan

    plan = quick_plan()
    Study(plan, tmp_path / "a")
    Study(replace(plan, nproc=1), tmp_path / "a")  # the ranks are no part of the plan
    with pytest.raises(SystemExit, match=r"a holds the runs of another plan \(steps differ\)"):
        Study(replace(plan, steps=61), tmp_path / "a")
    # a plan that adds a model, or changes one with no run yet, resumes; one that changes a model
    # that ran does not (its checkpoints would go on under the new model)
    more = replace(plan, models=(*plan.models, replace(plan.models[0], name="extra-s0")))
    Study(more, tmp_path / "a")
    Study(replace(more, models=(*plan.models, replace(plan.models[0], name="extra-s0", seed=7))), tmp_path / "a")
    (tmp_path / "a" / "runs" / "extra-s0").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"a holds the runs of another plan \(model extra-s0 differ\)"):
        Study(replace(more, models=(*plan.models, replace(plan.models[0], name="extra-s0", seed=8))), tmp_path / "a")
    (tmp_path / "b" / "runs").mkdir(parents=True)  # made before plan.json was written
    with pytest.raises(SystemExit, match="b holds runs of a plan it has no record of"):
        Study(plan, tmp_path / "b")


def test_segments_off_the_checkpoint_grid_are_refused_before_any_training(tmp_path):
    """The rule reads only the checkpoints on the interval's grid: a segment end off it would be
    a stop the rule never sees."""
    from dataclasses import replace

    from experiments.nope_length.study import Study, quick_plan

    study = Study(replace(quick_plan(), steps=7500, interval=125), tmp_path)
    with pytest.raises(SystemExit, match="segments of 300 and a budget of 7500 steps must be multiples "
                                         "of the checkpoint interval 125"):
        study.train_to_gate(study.plan.models[0], 300)
    assert not (tmp_path / "runs").exists()


def test_a_resumed_step_s_time_is_the_sum_of_its_runs(tmp_path):
    """timings.json: a rerun that finds a step's outputs adds its ~0 s, not overwrites the cost."""
    import time

    from experiments.nope_length.study import Study, quick_plan

    Study(quick_plan(), tmp_path)._timed("eval m", lambda: time.sleep(0.3))
    again = Study(quick_plan(), tmp_path)  # a resumed study reads timings.json
    again._timed("eval m", lambda: None)
    assert 0.3 <= json.loads((tmp_path / "timings.json").read_text())["eval m"] < 1.0


def test_a_resumed_segment_reads_only_its_own_checkpoints(tmp_path, monkeypatch):
    """A study interrupted inside its second segment left checkpoints 60-80 behind; resumed, the
    first segment's rule must not read them (a straight run's rule after step 50 could not): the
    record is the straight run's (gate at 70, stopped at the end of the segment that holds it).
    Training and scoring are stand-ins here: what is tested is the segment loop's bookkeeping."""
    from dataclasses import replace

    from experiments.nope_length import study as s
    from lenext_dist.checkpoint.layout import COMPLETE

    study = s.Study(replace(s.quick_plan(), steps=100, interval=10), tmp_path)
    ckpt = tmp_path / "runs" / "nope-s0" / "checkpoints"
    trained = []

    def save(n):
        (ckpt / f"step_{n:07d}").mkdir(parents=True, exist_ok=True)
        (ckpt / f"step_{n:07d}" / COMPLETE).write_text(f"{n}\n")

    def train(m, exit_at=0):
        trained.append(exit_at)
        for n in range(10, exit_at + 1, 10):
            save(n)
        return ckpt

    for n in (60, 70, 80):  # the interrupted second segment's
        save(n)
    monkeypatch.setattr(study, "train", train)
    monkeypatch.setattr(study, "export", lambda ckpt, tag, name: tag)
    monkeypatch.setattr(study, "evaluate", lambda tag, out, lengths, **kw: {
        "cells": [{"accuracy": 1.0 if int(tag[5:]) >= 70 else 0.0}]})
    rule = study.train_to_gate(study.plan.models[0], 50)
    assert (rule["chosen"], rule["final"], trained) == ("step_0000070", "step_0000100", [50, 100])


def test_a_partial_save_at_the_last_step_is_not_a_trained_model(tmp_path, monkeypatch):
    """A run killed mid-save leaves step_N without its COMPLETE marker: train() resumes it (and
    refuses it if the run stops again), it does not take it as done."""
    from experiments.nope_length import study as s
    from lenext_dist.checkpoint.layout import COMPLETE

    study = s.Study(s.quick_plan(), tmp_path)
    m, launched = study.plan.models[0], []
    last = tmp_path / "runs" / m.name / "checkpoints" / f"step_{study.plan.steps:07d}"
    last.mkdir(parents=True)
    monkeypatch.setattr(study, "shards", lambda length, train_set=(): tmp_path)
    monkeypatch.setattr(study, "_launch", lambda *a: launched.append(a))
    with pytest.raises(SystemExit, match="stopped before step"):
        study.train(m)
    (last / COMPLETE).write_text("1\n")
    assert study.train(m) == last.parent and len(launched) == 1


def test_a_models_training_set_makes_its_own_shards(tmp_path, monkeypatch):
    """Model.train_set (the layout study's iRoPE: tail=0:16) goes into its own shards' documents
    and the run trains on those; a model without one on the regime's; a recorded plan written
    before the field was its default."""
    from dataclasses import asdict

    from experiments.nope_length import study as s
    from lenext_dist.prep import runner

    jobs, launched = [], []
    monkeypatch.setattr(runner, "run_shard", lambda job: jobs.append(job))
    study = s.Study(s.quick_plan(), tmp_path)
    monkeypatch.setattr(study, "_launch", lambda cfg, run_dir, overrides: launched.append(overrides))
    for m in (s.Model("irope-s0", "rope", 0, (), ("tail=0:16",)), s.Model("nope-s0", "nope")):
        with pytest.raises(SystemExit, match="stopped before step 60"):  # the stand-in saves nothing
            study.train(m)
    assert [j.tasks["generators"][0]["params"].get("tail") for j in jobs] == ["0:16", "0"]
    assert [j.out for j in jobs] == [str(tmp_path / "shards" / n) for n in ("kv64-tail0-16", "kv64")]
    assert [next(o for o in ov if o.startswith("--data.blend")) for ov in launched] == [
        f"--data.blend=[{{prefix: {tmp_path / 'shards' / n / 'kv_train'}, weight: 1.0}}]"
        for n in ("kv64-tail0-16", "kv64")]
    old = json.loads(json.dumps(asdict(s.quick_plan())))  # as plan.json holds it
    old["models"] = [{k: v for k, v in m.items() if k != "train_set"} for m in old["models"]]
    assert s.plan_differs(old, s.quick_plan()) == []
    old["models"][0]["train_set"] = ["tail=0:16"]
    assert s.plan_differs(old, s.quick_plan()) == ["models"]
