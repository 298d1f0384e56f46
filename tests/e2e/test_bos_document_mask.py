"""data.bos + data.document_mask end to end with the real commands (issue 17 parts 2-3): shards
made without BOS -> a training run (launch/pretrain.py, 1 rank, 2 steps) whose batches get BOS
before every document and document-masked attention -> export (`python -m lenext_dist.convert
--verify`: HF logits equal megatron's) recording both -> `lenext eval ppl` / `passkey` defaulting
to BOS as trained. One short run (62 s of CPU here; minutes of wall time on a loaded box)."""
import json
import os
import subprocess
import sys

import pytest

from helpers import LAUNCHER, REPO, env, free_port, pretrain_cmd, run, write_config

pytestmark = pytest.mark.e2e
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def lenext(*args):
    p = subprocess.run([sys.executable, "-m", "lenext_dist", *map(str, args)], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise AssertionError(f"{args[:2]} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def test_bos_and_document_mask_from_shards_to_eval(sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, "bos", train={"steps": 2, "eval_interval": 0},
                       checkpoint={"interval": 0}, data={"bos": True, "document_mask": True},
                       attention={"position": "rope"})
    out = run(pretrain_cmd(cfg, LAUNCHER, 1, free_port()))
    assert "done at step 2" in out.stdout
    hf = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "lenext_dist.convert", "--checkpoint",
                        str(tmp_path / "bos" / "checkpoints"), "--out", str(hf), "--verify"],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    config = json.loads((hf / "config.json").read_text())
    assert config["bos_at_document_start"] is True and config["document_mask"] is True
    assert json.loads((hf / "tokenizer_config.json").read_text())["add_bos_token"] is True
    gen = json.loads((hf / "generation_config.json").read_text())
    assert gen["bos_token_id"] == config["bos_token_id"] == 1

    # the evaluation defaults to BOS as trained (each evaluation and --no-bos: unit tests,
    # tests/unit/test_data_bos.py)
    data = REPO / "data/sample/heldout/books.jsonl.zst"
    lenext("eval", "ppl", "--model", hf, "--no-progress", "--max-docs", "1", "--data", data,
           "--lengths", "32", "--protocol", "full", "--budget-tokens", "64", "--no-penalty",
           "--out", tmp_path / "r")
    res = json.loads((tmp_path / "r" / "ppl_full.json").read_text())
    assert res["args"]["bos"] is True and res["data"]["bos"] is True
