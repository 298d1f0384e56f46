"""launch/pretrain.py under the real deepspeed launcher, on one run_dir: a second training is
refused while the first (2 ranks: one training never refuses itself) runs; SIGUSR1 to the
launcher's whole process group stops it cleanly when the launcher ignores SIGUSR1 (as
lenext_dist/train/signals.py says to start it); checkpoint.resume=false on the finished run is
refused and changes nothing; checkpoint.start_over=true moves it aside and starts again."""
import json
import os
import shlex
import signal

import pytest

from helpers import free_port, losses, pretrain_cmd, run, start, wait_for, write_config

pytestmark = pytest.mark.e2e


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "lock" and "data_cache" not in p.parts}


def test_run_dir_in_use_refused_then_resume_false_refused_then_start_over(sample_shards, tmp_path):
    # steps far beyond what the test waits for: the first run must still hold the run_dir when
    # the second starts, however slow the machine (it is stopped by SIGUSR1 below)
    cfg = write_config(tmp_path, sample_shards, "busy", train={"steps": 20000, "eval_interval": 0},
                       checkpoint={"interval": 0})
    run_dir = tmp_path / "busy"
    metrics = run_dir / "metrics.jsonl"
    # SIGUSR1 ignored by the launcher (inherited); the ranks install their own handler
    cmd = ["bash", "-c", "trap '' USR1; exec " + shlex.join(pretrain_cmd(cfg, "deepspeed", 2,
                                                                         free_port()))]
    first = start(cmd, tmp_path / "first.log")
    try:
        assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2,
                        timeout=300), (tmp_path / "first.log").read_text()[-3000:]
        second = run(pretrain_cmd(cfg, "deepspeed", 1, free_port()), check=False)
        assert second.returncode != 0
        assert f"error: {run_dir} is in use by another training (pid " in second.stderr
        assert "Traceback" not in second.stderr
        os.killpg(first.pid, signal.SIGUSR1)  # the launcher and both ranks
        assert first.wait(timeout=180) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    log = (tmp_path / "first.log").read_text()
    assert "SIGUSR1 received" in log
    stopped = int(log.split("stopped at step ")[1].split(";")[0])
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{stopped:07d}"

    before = snapshot(run_dir)
    p = run(pretrain_cmd(cfg, "deepspeed", 1, free_port(), "--checkpoint.resume=false"), check=False)
    assert p.returncode == 2 and f"error: {run_dir} holds an earlier run" in p.stderr
    assert "checkpoint.start_over=true" in p.stderr and "Traceback" not in p.stderr
    assert snapshot(run_dir) == before  # nothing truncated, overwritten or moved

    p = run(pretrain_cmd(cfg, "deepspeed", 1, free_port(), "--checkpoint.start_over=true",
                         "--train.steps=2"))
    old = tmp_path / "busy.old-1"
    assert f"moved to {old}" in p.stdout and "done at step 2" in p.stdout
    assert snapshot(old) == before
    assert sorted(losses(run_dir)) == [1, 2]
    assert json.loads(metrics.read_text().splitlines()[0])["step"] == 1
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_0000002"
