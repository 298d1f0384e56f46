"""Several trainings at once on one data cache and one run folder (issue 40, item 4): two runs with
their own run folders share `data.cache_dir` and start together (two rank-0s writing the same cache
files, the other ranks loading them); a third start on the first run's folder while it trains is
refused in one line; the first run is killed -9 mid-way and resumed. Nothing is refused wrongly
and nothing is lost: the killed-and-resumed run logs every step once and its curve is bitwise the
untouched run's (same config, same shared cache). Real launcher, 2 gloo ranks per run; the runs are
long and stopped by SIGUSR1 (a save and exit 0) once they are past the steps compared."""
import json
import os
import shlex
import signal

import pytest

from helpers import free_port, kill9, losses, pretrain_cmd, run, start, wait_for, write_config

pytestmark = pytest.mark.distributed

COMPARED = 8  # steps both curves must have


def _logged(run_dir) -> list[int]:
    f = run_dir / "metrics.jsonl"
    lines = f.read_text().splitlines() if f.exists() else []
    return [json.loads(line)["step"] for line in lines if '"loss"' in line]


def _start(cfg, log):
    # SIGUSR1 ignored by the launcher (inherited); the ranks install their own handler
    return start(["bash", "-c", "trap '' USR1; exec " + shlex.join(pretrain_cmd(cfg, "deepspeed", 2,
                                                                                 free_port()))], log)


def _stop(proc, log):
    os.killpg(proc.pid, signal.SIGUSR1)
    assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]


def test_shared_cache_concurrent_starts_kill_and_resume_lose_nothing(sample_shards, tmp_path):
    data = {"tokenizer": sample_shards["tokenizer"], "blend": sample_shards["blend"],
            "valid_blend": sample_shards["valid_blend"], "cache_dir": str(tmp_path / "shared_cache")}
    common = dict(train={"steps": 20000, "eval_interval": 0}, checkpoint={"interval": 2}, data=data)
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = write_config(tmp_path, sample_shards, "a", **common)
    b = write_config(tmp_path, sample_shards, "b", **common)
    procs = {"a": _start(a, tmp_path / "a.log"), "b": _start(b, tmp_path / "b.log")}
    try:
        assert wait_for(lambda: len(_logged(a_dir)) >= 1, timeout=300), (tmp_path / "a.log").read_text()[-3000:]
        third = run(pretrain_cmd(a, "deepspeed", 1, free_port()), check=False)
        assert third.returncode != 0 and f"error: {a_dir} is in use by another training" in third.stderr
        assert "Traceback" not in third.stderr
        assert wait_for(lambda: len(_logged(a_dir)) >= 5, timeout=300)
        kill9(procs["a"])
        killed_at = max(_logged(a_dir))
        procs["a"] = _start(a, tmp_path / "a2.log")
        # past a step of its own: the ranks handle SIGUSR1 only once they have started
        assert wait_for(lambda: max(_logged(a_dir)) > killed_at + 1, timeout=300), \
            (tmp_path / "a2.log").read_text()[-3000:]
        assert wait_for(lambda: len(_logged(b_dir)) >= COMPARED, timeout=300)
        _stop(procs["a"], tmp_path / "a2.log")
        _stop(procs["b"], tmp_path / "b.log")
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill9(p)
    logs = "".join((tmp_path / f).read_text() for f in ("a.log", "a2.log", "b.log"))
    assert "resumed from" in (tmp_path / "a2.log").read_text()
    assert "refused" not in logs and "not a plain numpy array" not in logs and "Traceback" not in logs
    la, lb = losses(a_dir), losses(b_dir)
    common_steps = sorted(la.keys() & lb.keys())
    assert len(common_steps) >= COMPARED and common_steps[0] == 1
    assert [la[s] for s in common_steps] == [lb[s] for s in common_steps]  # bitwise
    steps = _logged(a_dir)  # steps run again after the kill are logged once
    assert steps == list(range(1, len(steps) + 1))
