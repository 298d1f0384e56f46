"""The length study in the kv regime (experiments/kv_regime/study.py) without scoring: a model
folder says what it is (position, window, checkpoint) and a folder that does not is one error
line; the plan is nope_length's at the regime's L and 1-16 L, without formats or HeadScale; the
models' folders stand for the export step."""
import json

import pytest

from experiments.kv_regime import study, sweep
from experiments.nope_length.study import Model


def _export(root, name, position, window=None, tag="step_0006000"):
    f = root / name
    f.mkdir(parents=True)
    (f / "config.json").write_text(json.dumps({
        "position": position, "attention_options": {"window": window},
        "lenext_source": {"tag": tag}}))
    return f


def test_a_model_folder_names_its_position_seed_window_and_checkpoint(tmp_path):
    assert study.model_of(_export(tmp_path, "rope-s2", "rope")) == (Model("rope-s2", "rope", 2), "step_0006000")
    m, tag = study.model_of(_export(tmp_path, "window-s0", "nope", window=sweep.L, tag="step_0005500"))
    assert m == Model("window-s0", "nope", 0, (f"--attention.window={sweep.L}",)) and tag == "step_0005500"


@pytest.mark.parametrize("name, cfg", [("rope", {"position": "rope", "lenext_source": {"tag": "t"}}),
                                       ("rope-s0", {"lenext_source": {"tag": "t"}}),
                                       ("rope-s0", {"position": "rope"})])
def test_a_folder_that_is_no_grid_export_is_one_error_line(tmp_path, name, cfg):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SystemExit, match=r"^error: .*" + name):
        study.model_of(tmp_path / name)


def test_the_plan_is_nope_lengths_at_the_regimes_length(tmp_path):
    p = study.plan((Model("nope-s0", "nope"),))
    assert (p.L, p.multiples, p.steps) == (sweep.L, (1, 2, 4, 8, 16), sweep.STEPS)
    assert p.variants == () and p.headscale_targets == ()
    assert 1.5 in p.final_scales and p.scales[0] == 1.0


def test_the_grid_study_reads_the_exports_and_the_repositorys_held_out_filler(tmp_path):
    s = study.GridStudy(study.plan((Model("nope-s0", "nope"),)), tmp_path / "work", tmp_path / "models")
    assert s.export(tmp_path / "unused", "step_0006000", "nope-s0") == tmp_path / "models" / "nope-s0"
    assert (s.data / "heldout" / "filler.jsonl").is_file()  # what sweep.score reads


def test_no_exported_model_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: .* holds no exported model"):
        study.run(tmp_path, tmp_path / "out")
