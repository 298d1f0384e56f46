"""Kill -9 and resume: the loss curve continues bitwise; a kill mid-save keeps the old checkpoint."""
import json
import random
import time
from pathlib import Path

import pytest

from helpers import LAUNCHER, free_port, kill9, losses, pretrain_cmd, run, start, wait_for, write_config

pytestmark = pytest.mark.distributed

STEPS = 8


def _complete(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.glob("step_*") if (p / "COMPLETE").exists())


def test_kill9_at_random_step_then_resume_is_bitwise(sample_shards, tmp_path):
    train = {"steps": STEPS, "eval_interval": 0}
    ref = write_config(tmp_path, sample_shards, "ref", train=train, checkpoint={"interval": 0})
    run(pretrain_cmd(ref, LAUNCHER, 2, free_port()))
    expected = losses(tmp_path / "ref")

    cfg = write_config(tmp_path, sample_shards, "kill", train=train, checkpoint={"interval": 2})
    kill_after = random.Random().randint(3, STEPS - 2)  # past the first checkpoint, before the end
    proc = start(pretrain_cmd(cfg, LAUNCHER, 2, free_port()), tmp_path / "kill.log")
    metrics = tmp_path / "kill" / "metrics.jsonl"
    assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= kill_after,
                    timeout=240), (tmp_path / "kill.log").read_text()[-3000:]
    kill9(proc)
    assert (tmp_path / "kill" / "checkpoints" / "latest").exists()

    p = run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
    assert "resumed from" in p.stdout
    got = losses(tmp_path / "kill")
    assert got == expected  # float equality: bitwise identical curve
    # the steps the killed run logged past its checkpoint were run again, and are logged once
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    assert logged == list(range(1, STEPS + 1))
    # keep_last = 2: only the two newest complete checkpoints survive
    assert _complete(tmp_path / "kill" / "checkpoints") == ["step_0000006", "step_0000008"]


def test_kill9_during_checkpoint_write_keeps_previous(sample_shards, tmp_path):
    """Kill the job while step_N is on disk but not yet marked COMPLETE; `latest` must still name
    the previous complete checkpoint, and resuming from it must finish the run."""
    cfg = write_config(tmp_path, sample_shards, "mid", train={"steps": STEPS, "eval_interval": 0},
                       checkpoint={"interval": 1, "keep_last": 0})
    ckpt = tmp_path / "mid" / "checkpoints"
    caught = None
    for _attempt in range(3):  # the window is short; try a few times before giving up
        proc = start(pretrain_cmd(cfg, LAUNCHER, 2, free_port()), tmp_path / "mid.log")

        def partial():
            for d in ckpt.glob("step_*"):
                if d.name >= "step_0000002" and not (d / "COMPLETE").exists() and any(d.iterdir()):
                    return d
            return None

        wait_for(lambda: partial() is not None or proc.poll() is not None, timeout=240, every=0.002)
        d = partial()
        kill9(proc)
        if d is not None and not (d / "COMPLETE").exists():
            caught = d
            break
        time.sleep(0.5)
    if caught is None:
        pytest.skip("could not catch a checkpoint write in progress in 3 tries")
    latest = (ckpt / "latest").read_text().strip()
    assert latest < caught.name and latest in _complete(ckpt)

    p = run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
    assert f"resumed from {ckpt}/{latest}" in p.stdout
    assert (ckpt / "latest").read_text().strip() == f"step_{STEPS:07d}"


def test_sigusr1_to_one_rank_checkpoints_and_exits_cleanly(sample_shards, tmp_path):
    """Slurm's `--signal=USR1@T` reaches the ranks; even if only one rank gets it, all ranks agree
    to stop at the same step, save, and exit 0; the next run resumes there."""
    import os
    import signal

    import psutil

    cfg = write_config(tmp_path, sample_shards, "sig", train={"steps": 40, "eval_interval": 0},
                       checkpoint={"interval": 0})
    proc = start(pretrain_cmd(cfg, "deepspeed", 2, free_port()), tmp_path / "sig.log")
    metrics = tmp_path / "sig" / "metrics.jsonl"
    assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, timeout=240)
    ranks = [c for c in psutil.Process(proc.pid).children(recursive=True)
             if any(a.startswith("--local_rank=") for a in c.cmdline())]
    assert len(ranks) == 2
    os.kill(ranks[1].pid, signal.SIGUSR1)
    assert proc.wait(timeout=120) == 0
    log = (tmp_path / "sig.log").read_text()
    assert "SIGUSR1 received" in log and "stopped at step" in log
    stopped = int(log.split("stopped at step ")[1].split(";")[0])
    assert 3 <= stopped < 40
    assert (tmp_path / "sig" / "checkpoints" / "latest").read_text().strip() == f"step_{stopped:07d}"
    p = run(pretrain_cmd(cfg, "deepspeed", 2, free_port(), "--train.steps=%d" % (stopped + 2)))
    assert f"step {stopped}, " in p.stdout and "done at step %d" % (stopped + 2) in p.stdout


def _rewind(ckpt: Path, tag: str) -> None:
    """Leave `ckpt` as a kill after step `tag` would: later steps gone, `latest` on `tag`."""
    import shutil

    for d in ckpt.glob("step_*"):
        if d.name > tag:
            shutil.rmtree(d)
    (ckpt / "latest").write_text(tag + "\n")


def test_resume_at_another_data_parallel_size_continues_the_curve(sample_shards, tmp_path):
    """ZeRO-2, global batch 4: a 2-rank run resumed on 1 rank and a 1-rank run resumed on 2 go on
    with the loss curve of the uninterrupted run (float tolerance: the ranks sum in another order);
    their fp32 masters and Adam moments are cut again for the new size (train/reshard.py)."""
    common = dict(train={"steps": 6, "eval_interval": 0}, parallel={"zero_stage": 2},
                  checkpoint={"interval": 3, "keep_last": 0})
    cfg = {n: write_config(tmp_path, sample_shards, f"dp{n}", **common) for n in (1, 2)}
    for n in (1, 2):
        run(pretrain_cmd(cfg[n], LAUNCHER, n, free_port()))
    ref = losses(tmp_path / "dp1")
    assert sorted(ref) == list(range(1, 7))
    assert losses(tmp_path / "dp2") == pytest.approx(ref, rel=1e-5)  # same global batch, same curve
    for saved, now in ((2, 1), (1, 2)):
        _rewind(tmp_path / f"dp{saved}" / "checkpoints", "step_0000003")
        p = run(pretrain_cmd(cfg[saved], LAUNCHER, now, free_port()))
        assert f"ZeRO partitions of {saved} ranks resharded to {now}" in p.stdout
        got = losses(tmp_path / f"dp{saved}")
        assert got == pytest.approx(ref, rel=1e-5), (saved, now, got, ref)


def test_resume_of_zero3_at_another_size_is_refused_before_any_work(sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, "z3", train={"steps": 2, "eval_interval": 0},
                       parallel={"zero_stage": 3}, checkpoint={"interval": 0})
    run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
    # the user's entry point: torchrun prints a traceback of its own for any rank's exit 1
    p = run(pretrain_cmd(cfg, "deepspeed", 1, free_port(), "--train.steps=3"), check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "holds ZeRO-3 optimizer partitions of 2 ranks; this run has 1" in p.stderr
    assert "step 3" not in p.stdout  # refused before training
