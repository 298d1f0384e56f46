"""`lenext extend` end to end on a tiny NoPE run: sweep, HeadScale search on 2 ranks, export, eval."""
import json
import subprocess
import sys

import pytest

from helpers import LAUNCHER, REPO, env, free_port, pretrain_cmd, run, write_config

pytestmark = pytest.mark.e2e


def test_extend_workflow_on_a_tiny_nope_run(sample_shards, tmp_path):
    base = write_config(tmp_path, sample_shards, "base", train={"steps": 6, "eval_interval": 0},
                        checkpoint={"interval": 0})
    run(pretrain_cmd(base, LAUNCHER, 2, free_port()))
    out = tmp_path / "ext"
    cmd = [sys.executable, "-m", "lenext_dist", "extend", "--base", str(tmp_path / "base"),
           "--targets", "64", "--out", str(out), "--steps", "3", "--global-batch", "4", "--warmup", "1",
           "--nproc", "2", "--port", str(free_port()), "--eval-factors", "1,2", "--stride", "16",
           "--budget-tokens", "256", "--c-step", "0.2",
           "--passkey-keys", "1", "--passkey-lengths", "96", "--passkey-depths", "2",
           "--entropy-samples", "1", "--threads", "1", "--data", str(REPO / "data/sample/heldout/books.jsonl.zst")]
    p = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]

    # the search ran at L' = ceil(64 x 1.125 / 8) x 8 = 72 and wrote its head scales
    search = json.loads((out / "hs-64" / "head_scales.json").read_text())["head_scales"]
    assert len(search) == 2 and all(len(r) == 4 and min(r) >= 1.0 for r in search)
    assert "seq_length: 72" in (out / "hs-64" / "config.yaml").read_text()
    hf_cfg = json.loads((out / "hf" / "hs-64" / "config.json").read_text())
    assert hf_cfg["position"] == "nope"
    for name in ("base", "uniform-64", "headscale-64"):
        res = json.loads(next((out / "eval" / name).glob("ppl_*.json")).read_text())
        assert [r["length"] for r in res["results"]] == [32, 64]
        assert all(r["ppl"] > 1 for r in res["results"])
        assert list((out / "eval" / name).glob("passkey*.json")) and list((out / "eval" / name).glob("entropy*.json"))
    report = (out / "report.md").read_text()
    assert "## The paper's claims on this run" in report and "HeadScale PPL" in report

    # rerunning skips every finished step (resumable workflow)
    p2 = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0 and "HeadScale search for T=64" not in p2.stdout
