"""`lenext eval` runs no code from a model folder: a stock export loads as plain transformers, a
custom one with this package's classes. `lenext report` on a result JSON that is not what its
`kind` says: one error line naming the file, exit 2."""
import json

import pytest

from lenext_dist.cli import main
from lenext_dist.convert.stock import PROVENANCE
from lenext_dist.eval.model_io import load_model
from tiny_models import save_tiny_lenext, save_tiny_model

PLANTED = '''import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import LlamaForCausalLM as Planted
'''


def test_stock_export_loads_without_running_the_folders_code(tmp_path):
    out = save_tiny_model(str(tmp_path / "stock"), layers=1)
    cfg = json.loads((tmp_path / "stock" / "config.json").read_text())
    cfg[PROVENANCE] = {"position": "rope", "source": {}}  # what convert --format stock records
    cfg["auto_map"] = {"AutoModelForCausalLM": "planted.Planted"}  # code that must not run
    (tmp_path / "stock" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "stock" / "planted.py").write_text(PLANTED.format(marker=str(tmp_path / "RAN")))
    model = load_model(out, device="cpu")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not (tmp_path / "RAN").exists()


def test_custom_export_loads_with_the_package_classes_not_its_shipped_copy(tmp_path):
    """A custom export's modeling files are copies anyone who had the folder could have changed:
    evaluation runs lenext_dist.hf's classes (trust_remote_code ran the folder's)."""
    from lenext_dist.errors import UserError
    from lenext_dist.hf.modeling_lenext import LenextForCausalLM

    out = save_tiny_lenext(str(tmp_path / "custom"), layers=1)
    shipped = tmp_path / "custom" / "modeling_lenext.py"  # the export's copy: trust_remote_code ran it
    shipped.write_text(PLANTED.format(marker=str(tmp_path / "RAN")) + shipped.read_text())
    assert type(load_model(out, device="cpu")) is LenextForCausalLM
    assert not (tmp_path / "RAN").exists()
    # a model type transformers does not know, with code of its own: refused, its code not run
    cfg = json.loads((tmp_path / "custom" / "config.json").read_text())
    (tmp_path / "custom" / "config.json").write_text(json.dumps({**cfg, "model_type": "planted"}))
    with pytest.raises(UserError, match="cannot load the model") as e:
        load_model(out, device="cpu")
    assert "\n" not in str(e.value) and not (tmp_path / "RAN").exists()


def test_no_progress_silences_transformers_loading_bar_and_only_that_load(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    out = save_tiny_lenext(str(tmp_path / "custom"), layers=1)
    load_model(out, device="cpu", progress=False)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # the global switch is left as it was
    load_model(out, device="cpu")
    assert "Loading weights" in capfd.readouterr().err


@pytest.mark.parametrize("text", [
    '{"kind": "ppl", "protocol": "last-stride"}',  # no results
    '{"kind": "passkey", "lengths": [64], "accuracy_by_length": 3}',  # not a list
    '{"kind": "scale_sweep", "length": 64, "train_length": 32, "grid": [], "fit": {}}',
    '{"kind": "ruler", "lengths": [1024], "tasks": ["vt"], "cells": [{"task": "vt"}]}',  # no length
])
def test_report_on_a_malformed_result_names_the_file(tmp_path, capsys, text):
    (tmp_path / "r").mkdir()
    bad = tmp_path / "r" / "result.json"
    bad.write_text(text)
    (tmp_path / "r" / "notes.json").write_text('"a kind of string, not a result"')
    assert main(["report", "--runs", str(tmp_path / "r"), "--out", str(tmp_path / "rep.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a `lenext eval` result of kind ") and err.count("\n") == 1
    assert not (tmp_path / "rep.md").exists()


PASSKEY = {"kind": "passkey", "lengths": [256], "accuracy_by_length": [1.0], "depths": [0.5],
           "keys": [12345], "mean_accuracy": 1.0}  # a result the report reads


def test_report_out_a_name_too_long_is_one_line(tmp_path, capsys):
    """A 300-character --out was an OSError traceback (File name too long)."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "passkey.json").write_text(json.dumps(PASSKEY))
    out = str(tmp_path / ("x" * 300 + ".md"))
    assert main(["report", "--runs", str(tmp_path / "r"), "--out", out]) == 2
    assert capsys.readouterr().err == (f"error: --out {out}: cannot write the report (File name "
                                       "too long); choose another --out\n")


def test_report_replaces_a_previous_report_and_nothing_else(tmp_path, capsys):
    """--out naming a result JSON of --runs, or a config, replaced it with markdown (exit 0)."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "passkey.json").write_text(json.dumps(PASSKEY))
    (tmp_path / "config.yaml").write_text("model:\n  num_layers: 2\n")
    for victim in (run / "passkey.json", tmp_path / "config.yaml"):
        before = victim.read_text()
        assert main(["report", "--runs", str(run), "--out", str(victim)]) == 2
        assert capsys.readouterr().err == (f"error: --out {victim}: an existing file that is not a "
                                           "`lenext report` report; choose another --out, or move "
                                           "the file away\n")
        assert victim.read_text() == before
    rep = tmp_path / "report.md"
    assert main(["report", "--runs", str(run), "--out", str(rep)]) == 0
    assert main(["report", "--runs", str(run), "--out", str(rep), "--title", "again"]) == 0  # a rerun
    assert "# again" in rep.read_text()
    # a report written before the marker (an extend run resumed across the change rewrites it)
    old = "\n".join(rep.read_text().split("\n")[1:])
    rep.write_text(old)
    assert main(["report", "--runs", str(run), "--out", str(rep)]) == 0
    notes = tmp_path / "notes.md"  # a markdown file of the user's own is not one
    notes.write_text("# my notes\n\nRuns went well.\n")
    assert main(["report", "--runs", str(run), "--out", str(notes)]) == 2


def _unreadable(f):
    """Make file `f` one this process cannot open: chmod 000, or, as root (who reads through any
    mode), a link to a sysctl that root cannot read either (its mode is write-only)."""
    import os

    os.chmod(f, 0)
    try:
        open(f, "rb").close()
    except PermissionError:
        return
    sysctl = "/proc/sys/vm/compact_memory"
    try:
        open(sysctl, "rb").close()
        pytest.skip("no file here that this process cannot read")
    except PermissionError:
        os.remove(f)
        os.symlink(sysctl, f)
    except OSError:
        pytest.skip("no file here that this process cannot read")


def test_an_unreadable_weights_file_is_named_with_the_real_cause(tmp_path):
    """safetensors calls a weights file it may not read "No such file or directory"; the
    message named that, not the permission."""
    from lenext_dist.errors import UserError

    out = save_tiny_model(str(tmp_path / "m"), layers=1)
    weights = tmp_path / "m" / "model.safetensors"
    _unreadable(weights)
    with pytest.raises(UserError) as e:
        load_model(out, device="cpu", progress=False)
    assert str(e.value) == (f"{weights}: cannot read (Permission denied); make it readable "
                            "(chmod) or copy the model")


def test_default_dtype_is_bf16_on_cuda_fp32_on_cpu(tmp_path):
    """`lenext eval` without --dtype: bfloat16 on CUDA, float32 on CPU (the model loads so)."""
    import torch

    from lenext_dist.eval.jobs import PplJob
    from lenext_dist.eval.model_io import default_dtype

    assert default_dtype("cuda") == default_dtype("cuda:1") == "bfloat16"
    assert default_dtype("cpu") == "float32"
    assert PplJob(model="m", data=["d"], lengths=[8]).dtype is None  # resolved when it runs
    out = save_tiny_lenext(str(tmp_path / "custom"), layers=1)
    assert {p.dtype for p in load_model(out, device="cpu").parameters()} == {torch.float32}
