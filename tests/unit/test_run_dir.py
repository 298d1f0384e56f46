"""One training per run_dir (a flock held by rank 0), and an earlier run's outputs are never
overwritten: checkpoint.resume=false on them is refused, checkpoint.start_over=true moves them
aside. (The real launcher, two trainings at once: tests/e2e/test_run_dir_cli.py.)"""
import os
import subprocess
import sys

import pytest

from lenext_dist.config import load_config
from lenext_dist.checkpoint.layout import COMPLETE, tag_for
from lenext_dist.errors import CheckpointError
from lenext_dist.train.run_dir import claim


def cfg(run, *overrides):
    return load_config(None, [f"run_dir={run}", *overrides])


def earlier_run(run, steps=(2, 4), lines=10):
    """What a finished training leaves: metrics, config, checkpoints with `latest`."""
    ckpt = run / "checkpoints"
    for s in steps:
        (ckpt / tag_for(s)).mkdir(parents=True)
        (ckpt / tag_for(s) / COMPLETE).write_text(f"{s}\n")
    (ckpt / "latest").write_text(tag_for(steps[-1]) + "\n")
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {i + 1}}}\n' for i in range(lines)))
    (run / "config.yaml").write_text("name: old\n")
    (run / "data_cache").mkdir()
    (run / "data_cache" / "index.npy").write_bytes(b"cache")


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*")) if p.name != "lock"}


def test_second_claim_is_refused_while_the_first_holds_the_run_dir(tmp_path):
    run = tmp_path / "run"
    first = claim(cfg(run), rank=0)
    with pytest.raises(CheckpointError, match=rf"{run} is in use by another training \(pid \d+ on "):
        claim(cfg(run), rank=0)
    # another process (a second training), too
    code = (f"from lenext_dist.config import load_config; from lenext_dist.train.run_dir import claim;"
            f"claim(load_config(None, ['run_dir={run}']), 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 1 and "is in use by another training" in p.stderr
    first.release()
    claim(cfg(run), rank=0).release()  # free again once the first is done


def test_a_busy_run_dir_is_refused_before_the_rendezvous_binds_its_port(tmp_path):
    """A second launch on a busy run_dir failed on its master port (taken meanwhile: EADDRINUSE)
    instead of with the message (a CI flake): the lock is probed before the process group, and
    with the port held here the refusal still names the folder."""
    import socket

    from lenext_dist.train.run_dir import refuse_if_busy

    run = tmp_path / "run"
    refuse_if_busy(cfg(run))  # a fresh folder: nothing to probe, nothing created
    assert not run.exists()
    first = claim(cfg(run), rank=0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(taken.getsockname()[1]),
               "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
        code = (f"from lenext_dist.config import load_config; from lenext_dist.train.loop import train;"
                f"train(load_config(None, ['run_dir={run}', 'parallel.backend=gloo']))")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=120)
    assert p.returncode == 1 and f"{run} is in use by another training (pid {os.getpid()} " in p.stderr
    first.release()
    refuse_if_busy(cfg(run))  # free again


def test_resume_false_on_an_earlier_run_is_refused_and_changes_nothing(tmp_path):
    run = tmp_path / "run"
    earlier_run(run)
    before = snapshot(run)
    with pytest.raises(CheckpointError) as e:
        claim(cfg(run, "checkpoint.resume=false"), rank=0)
    msg = str(e.value)
    assert "metrics.jsonl (10 lines)" in msg and "up to step_0000004" in msg
    assert "checkpoint.start_over=true" in msg and f"{run}.old-N" in msg
    assert snapshot(run) == before
    claim(cfg(run), rank=0).release()  # refused, it released the lock; resuming is allowed
    assert snapshot(run) == before


def test_start_over_moves_the_earlier_run_aside_and_keeps_the_cache(tmp_path):
    run = tmp_path / "run"
    earlier_run(run)
    before = snapshot(run)
    c = cfg(run, "checkpoint.start_over=true", f"checkpoint.init_from={run}/checkpoints/step_0000002")
    lock = claim(c, rank=0)
    old = tmp_path / "run.old-1"
    assert snapshot(old) == {k: v for k, v in before.items() if not k.startswith("data_cache")}
    # the cache comes back; the fresh checkpoints folder holds its lock only
    assert snapshot(run) == {**{k: v for k, v in before.items() if k.startswith("data_cache")},
                             "checkpoints": None}
    assert c.checkpoint.init_from == str(old / "checkpoints" / "step_0000002")
    with pytest.raises(CheckpointError, match="in use"):  # the new run_dir is locked too
        claim(cfg(run), rank=0)
    lock.release()
    earlier_run(tmp_path / "again")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    claim(cfg(run, "checkpoint.start_over=true"), rank=0).release()
    assert (tmp_path / "run.old-2" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (tmp_path / "run.old-1" / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]


def test_checkpoint_dir_elsewhere_is_locked_and_moved_as_well(tmp_path):
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    (ckpt / tag_for(2)).mkdir(parents=True)
    (ckpt / "latest").write_text(tag_for(2) + "\n")
    c = cfg(run, f"checkpoint.dir={ckpt}", "checkpoint.resume=false")
    with pytest.raises(CheckpointError, match=f"{ckpt} holds an earlier run"):
        claim(c, rank=0)
    c.checkpoint.start_over = True
    lock = claim(c, rank=0)
    assert (tmp_path / "ckpt.old-1" / "latest").is_file() and not (tmp_path / "run.old-1").exists()
    with pytest.raises(CheckpointError, match=f"{ckpt} is in use"):
        claim(cfg(tmp_path / "other", f"checkpoint.dir={ckpt}"), rank=0)
    lock.release()


def test_an_empty_or_cache_only_run_dir_is_no_earlier_run(tmp_path):
    run = tmp_path / "run"
    (run / "data_cache").mkdir(parents=True)
    claim(cfg(run, "checkpoint.resume=false"), rank=0).release()
    claim(cfg(run, "checkpoint.start_over=true"), rank=0).release()
    assert not (tmp_path / "run.old-1").exists()


@pytest.mark.parametrize("link", ["lock", "deepspeed.json", "checkpoints/zero_to_fp32.py",
                                  "checkpoints/step_0000006", "checkpoints/step_0000004/COMPLETE",
                                  "data_cache/x-sample_index.npy"])
def test_a_symlink_in_a_copied_run_folder_is_refused_and_its_target_untouched(tmp_path, link):
    """A run folder copied with links in it: training would write through each of them (the lock
    note truncates, deepspeed.json and zero_to_fp32.py overwrite, a step folder receives a
    checkpoint). Refused in one line naming the link; the target keeps its bytes."""
    run = tmp_path / "run"
    earlier_run(run)
    target = tmp_path / "victim"
    target.mkdir() if link.startswith("checkpoints/step_0000006") else target.write_text("precious\n")
    path = run / link
    if path.exists():
        path.unlink()
    path.symlink_to(target)
    with pytest.raises(CheckpointError) as e:
        claim(cfg(run), rank=0)
    assert str(e.value).startswith(f"{path} is a symbolic link (to {target}): training writes into ")
    assert "\n" not in str(e.value)
    assert list(target.iterdir()) == [] if target.is_dir() else target.read_text() == "precious\n"
    path.unlink()
    claim(cfg(run), rank=0).release()  # the link gone, the run resumes
    # the run folder itself may be a link (a run_dir on another disk)
    (tmp_path / "elsewhere").symlink_to(run)
    claim(cfg(tmp_path / "elsewhere"), rank=0).release()


def test_the_lock_is_opened_without_following_a_link(tmp_path):
    """try_lock (shared with shard.py's --out lock) refuses a link even if one appears after the
    folder was checked: O_NOFOLLOW."""
    import errno

    from lenext_dist.prep.lock import try_lock

    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / "lock").symlink_to(target)
    with pytest.raises(OSError) as e:
        try_lock(str(tmp_path / "lock"))
    assert e.value.errno == errno.ELOOP and target.read_text() == "precious\n"


def test_checkpoint_dir_inside_another_live_run_is_refused(tmp_path):
    """A checkpoint.dir pointed into another training's run_dir (its checkpoints inside it, the
    default) would have both write the same step folders: the checkpoint folder is locked too."""
    a, b = tmp_path / "a", tmp_path / "b"
    first = claim(cfg(a), rank=0)
    with pytest.raises(CheckpointError, match=rf"{a}/checkpoints is in use by another training"):
        claim(cfg(b, f"checkpoint.dir={a}/checkpoints"), rank=0)
    with pytest.raises(CheckpointError, match=rf"{a} is in use by another training"):
        claim(cfg(b, f"checkpoint.dir={a}"), rank=0)
    first.release()
    claim(cfg(b, f"checkpoint.dir={a}/checkpoints"), rank=0).release()


def test_a_resume_never_truncates_metrics_it_moves_the_records_past_the_resume_step_aside(tmp_path, capsys):
    """checkpoint.dir changed (no checkpoint there: the resume starts at 0) in a run_dir whose
    metrics.jsonl holds an earlier run's 10 records: they are moved aside, not deleted."""
    from lenext_dist.train.metrics import Metrics

    run = tmp_path / "run"
    earlier_run(run)
    log = (run / "metrics.jsonl").read_text()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "lo')  # the line a kill cut short
    m = Metrics(str(run), 20, 1, 1.0, 1.0, 1, tensorboard=False, enabled=True, start_step=3)
    m.close()
    lines = log.splitlines(keepends=True)
    assert (run / "metrics.jsonl").read_text() == "".join(lines[:3])
    assert (run / "metrics.dropped-1.jsonl").read_text() == "".join(lines[3:]) + '{"step": 11, "lo\n'
    assert f"8 lines of {run / 'metrics.jsonl'} past it (run again now) moved to " in capsys.readouterr().out
    Metrics(str(run), 20, 1, 1.0, 1.0, 1, tensorboard=False, enabled=True, start_step=0).close()
    assert (run / "metrics.jsonl").read_text() == ""
    assert (run / "metrics.dropped-2.jsonl").read_text() == "".join(lines[:3])
