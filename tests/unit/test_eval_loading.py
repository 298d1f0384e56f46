"""`lenext eval` loads a stock export (convert's provenance in its config.json) as plain
transformers: no code from the folder runs. `lenext report` on a result JSON that is not what its
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


def test_custom_export_still_loads_its_shipped_code(tmp_path):
    out = save_tiny_lenext(str(tmp_path / "custom"), layers=1)
    assert type(load_model(out, device="cpu")).__name__ == "LenextForCausalLM"


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
