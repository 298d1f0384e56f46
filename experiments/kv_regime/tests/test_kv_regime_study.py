"""The length study in the kv regime (experiments/kv_regime/study.py): a model folder says what it
is (position, window, checkpoint, training shards) and a folder that does not is one error line;
the plan is nope_length's at the regime's L and 1-16 L, without formats or HeadScale; the models'
folders stand for the export step; and the whole study once end to end on random exports."""
import json

import pytest

from experiments.kv_regime import data, exports, grids, study
from experiments.nope_length.study import Model


def _provenance(f, tag="step_0006000", shards="kvmix"):
    """What `lenext convert` records of a run in its export: the checkpoint's tag (config.json)
    and the run's config (its training shards)."""
    cfg = json.loads((f / "config.json").read_text())
    (f / "config.json").write_text(json.dumps({**cfg, "lenext_source": {"tag": tag}}))
    (f / "lenext_run_config.yaml").write_text(f"data:\n  blend:\n  - prefix: /tmp/sh/{shards}_train\n")
    return f


def _export(root, name, position, window=None, tag="step_0006000", shards="kvmix"):
    f = root / name
    f.mkdir(parents=True)
    (f / "config.json").write_text(json.dumps({"position": position, "attention_options": {"window": window}}))
    return _provenance(f, tag, shards)


def test_a_model_folder_names_its_position_seed_window_and_checkpoint(tmp_path):
    assert exports.model_of(_export(tmp_path, "rope-s2", "rope")) == (Model("rope-s2", "rope", 2), "step_0006000")
    m, tag = exports.model_of(_export(tmp_path, "window-s0", "nope", window=grids.L, tag="step_0005500"))
    assert m == Model("window-s0", "nope", 0, (f"--attention.window={grids.L}",)) and tag == "step_0005500"


@pytest.mark.parametrize("name, cfg", [("rope", {"position": "rope", "lenext_source": {"tag": "t"}}),
                                       ("rope-s0", {"lenext_source": {"tag": "t"}}),
                                       ("rope-s0", {"position": "rope"})])
def test_a_folder_that_is_no_grid_export_is_one_error_line(tmp_path, name, cfg):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SystemExit, match=r"^error: .*" + name):
        exports.model_of(tmp_path / name)


def test_a_run_of_the_grid_is_its_position_window_mixture_and_last_step():
    window, trained = grids.OTHERS["window-s0"], f"{exports.shard_name(grids.DISTRACT_MIX)}_train"
    m, last = Model("window-s0", "nope", 0, (f"--attention.window={grids.L}",)), "step_0006000"
    assert exports.is_run(m, trained, last, window)
    assert not exports.is_run(m, trained, "step_0005500", window)  # a run cut short
    assert not exports.is_run(Model("window-s0", "nope", 0), trained, last, window)  # no window
    assert not exports.is_run(Model("window-s0", "nope", 0, ("--attention.window=48",)), trained, last, window)
    assert not exports.is_run(m, "kvmix_train", last, window)  # another mixture
    nope = Model("nope-s0", "nope")
    assert not exports.is_run(nope, trained, last, None)  # no run of that name
    assert exports.is_run(nope, trained, last, grids.DISTRACT["nope-s0"])
    assert not exports.is_run(Model("nope-s0", "rope"), trained, last, grids.DISTRACT["nope-s0"])
    with_bos = f"{exports.shard_name(grids.DISTRACT_MIX, True)}_train"
    assert exports.is_run(nope, with_bos, last, grids.DISTRACT_BOS["nope-s0"])
    assert not exports.is_run(nope, trained, last, grids.DISTRACT_BOS["nope-s0"])
    # the long grid shares the distract grid's data: its last step tells them apart
    assert exports.is_run(nope, trained, "step_0012000", grids.DISTRACT_LONG["nope-s0"])
    assert not exports.is_run(nope, trained, last, grids.DISTRACT_LONG["nope-s0"])
    # a warm run's export records its first stage's shards (the short documents)
    short = f"{exports.shard_name(grids.WARM.mix, False, grids.WARM.length)}_train"
    assert exports.is_run(nope, short, last, grids.DISTRACT_WARM["nope-s0"])
    assert not exports.is_run(nope, trained, last, grids.DISTRACT_WARM["nope-s0"])
    # the lm grids share the distract grid's kv shards: the text beside them tells them apart
    lm_all = grids.DISTRACT_LM_ALL["nope-s0"]
    with_text = exports.trained_on([(trained, 0.95), ("skipgram_all_train", 0.05)])
    assert with_text == f"{trained} (0.95) + skipgram_all_train (0.05)"
    assert exports.is_run(nope, with_text, last, lm_all)
    assert not exports.is_run(nope, trained, last, lm_all)
    assert not exports.is_run(nope, with_text, last, grids.DISTRACT["nope-s0"])
    assert not exports.is_run(nope, with_text, last, grids.DISTRACT_LM["nope-s0"])  # the filler's text
    assert not exports.is_run(nope, with_text.replace("0.05", "0.1"), last, lm_all)  # another weight


def test_an_exports_training_data_is_its_first_stages_whole_blend(tmp_path):
    """What `lenext convert` writes (lenext_run_config.yaml's data.blend): every shard and weight."""
    f = _export(tmp_path, "nope-s0", "nope")
    (f / "lenext_run_config.yaml").write_text(
        "data:\n  blend:\n  - {prefix: /s/kv_a_train, weight: 0.95, text: false}\n"
        "  - {prefix: /s/skipgram_all_train, weight: 0.05, text: false}\n")
    assert exports.trained_blend(f) == "kv_a_train (0.95) + skipgram_all_train (0.05)"
    (f / "lenext_run_config.yaml").write_text("data:\n  blend: []\n")
    with pytest.raises(SystemExit, match=r"^error: .*names no training data"):
        exports.trained_blend(f)


def test_the_plan_is_nope_lengths_at_the_regimes_length(tmp_path):
    p = study.plan((Model("nope-s0", "nope"),), 12000)
    assert (p.L, p.multiples, p.steps) == (grids.L, (1, 2, 4, 8, 16), 12000)
    assert p.variants == () and p.headscale_targets == ()
    assert 1.5 in p.final_scales and p.scales[0] == 1.0


def test_the_grid_study_reads_the_exports_and_scores_the_training_mixture(tmp_path, monkeypatch):
    s = study.GridStudy(study.plan((Model("nope-s0", "nope"),), grids.STEPS), tmp_path / "work", tmp_path / "models",
                        grids.DISTRACT_MIX)
    assert s.export(tmp_path / "unused", "step_0006000", "nope-s0") == tmp_path / "models" / "nope-s0"
    assert (s.data / "heldout" / "filler.jsonl").is_file()  # what sweep.score reads
    seen = {}
    monkeypatch.setattr(study.Study, "evaluate", lambda self, hf, out, lengths, **kw: seen.update(kw))
    s.evaluate(tmp_path / "m", tmp_path / "e", [96], seed=0, docs=2, c=1.5)
    assert seen["task_set"] == ["kv.values=2:8", "kv.distractors=1:3"] and seen["c"] == 1.5


def test_no_exported_model_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: .* holds no exported model"):
        study.run(tmp_path, tmp_path / "out")


def test_models_must_be_runs_of_the_grids_with_one_mixture(tmp_path):
    _export(tmp_path, "nope-s0", "nope")
    _export(tmp_path, "alibi-s0", "alibi")
    with pytest.raises(SystemExit,
                       match=r"^error: .*alibi-s0 \(alibi, trained on kvmix_train, checkpoint step_0006000\) "
                             r"is no finished run of the grids seeds \(no run named alibi-s0\): "
                             r"pass --grids, or finish the run"):
        study.run(tmp_path, tmp_path / "out", ("seeds",))
    _export(tmp_path / "other", "window-s0", "rope")  # the name of a run, another position
    with pytest.raises(SystemExit, match=r"^error: .*window-s0 \(rope, .*\) is no finished run of the grids others"):
        study.run(tmp_path / "other", tmp_path / "out", ("others",))
    _export(tmp_path / "nowindow", "window-s0", "nope", shards=exports.shard_name(grids.DISTRACT_MIX))
    with pytest.raises(SystemExit, match=r"^error: .*window-s0 \(nope, trained on .*\) is no finished run of the gr"):
        study.run(tmp_path / "nowindow", tmp_path / "out", ("others",))  # the run's name, no window
    _provenance(tmp_path / "alibi-s0", shards=exports.shard_name(grids.DISTRACT_MIX))  # others' alibi
    with pytest.raises(SystemExit, match=r"^error: the models .* different mixtures"):
        study.run(tmp_path, tmp_path / "out", ("seeds", "others"), partial=True)  # nope-s0 of seeds, alibi of others
    with pytest.raises(SystemExit, match=r"^error: .*nope-s0 \(nope, trained on kvmix_train, .*\) is no finished run"):
        study.run(tmp_path, tmp_path / "out", ("distract", "others"))  # a seeds-grid model by the same name
    (tmp_path / "nope-s0" / "lenext_run_config.yaml").write_text("model: {}\n")
    with pytest.raises(SystemExit, match=r"^error: .*nope-s0/lenext_run_config.yaml names no training data"):
        study.run(tmp_path, tmp_path / "out", ("distract", "others"))


@pytest.mark.e2e
def test_the_study_runs_end_to_end_on_exported_models(tmp_path, monkeypatch):
    """Two random lenext exports named as seeds-grid runs (the kv tokenizer, 2 documents a cell,
    1-2 L): every measurement of the plan runs through `lenext eval tasks` and STUDY.md carries
    each claim. Never checks an outcome (random models retrieve nothing)."""
    monkeypatch.setattr(study, "MULTIPLES", (1, 2))
    from tiny_models import save_tiny_lenext

    from experiments.kv_regime.analysis import TRAIN_MIX

    models = tmp_path / "models"
    for name, position in (("nope-s0", "nope"), ("rope-s0", "rope")):
        save_tiny_lenext(str(models / name), tokenizer=str(data.kv_data() / "tokenizer.model"),
                         position=position, vocab_size=128, train_length=grids.L)
        _provenance(models / name, f"step_{grids.STEPS:07d}", exports.shard_name(TRAIN_MIX))
    with pytest.raises(SystemExit, match=r"^error: .* lacks runs of the grids seeds: nope-s1, nope-s2, "
                                         r"rope-s1, rope-s2; the claims are over every seed"):
        study.run(models, tmp_path / "work", ("seeds",), docs=2)
    summary = study.run(models, tmp_path / "work", ("seeds",), docs=2, partial=True)
    md = (tmp_path / "work" / "STUDY.md").read_text()
    assert md.count("**Partial (--partial): runs nope-s1, nope-s2, rope-s1, rope-s2 of the grids are "
                    "missing") == 1 and summary["missing_runs"] == ["nope-s1", "nope-s2", "rope-s1", "rope-s2"]
    assert "(kv values=2:8, distractors=0:3; shards kvmix_train)" in md
    assert all(c["claim"] in md for c in summary["claims"].values())
    assert f"{grids.STEPS} steps of 256 documents" in md  # the seeds grid's runs' own schedule
    assert summary["documents"] == [f"kv.{p}" for p in TRAIN_MIX]
    rows = {r["model"]["name"]: r["rows"] for r in summary["results"]}
    assert len([r for r in rows["nope-s0"] if r["method"] == "uniform"]) == 7  # the c grid
    assert {r["method"] for r in rows["rope-s0"]} == {"uniform", "pi", "ntk", "yarn"}
    assert [c["length"] for c in rows["nope-s0"][0]["cells"]] == [grids.L * k for k in study.MULTIPLES]
