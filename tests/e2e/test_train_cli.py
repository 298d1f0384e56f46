"""`lenext train`, the front door of training (issue 35): `--nproc 2` starts DeepSpeed's launcher
of `python -m lenext_dist.train` on 2 gloo ranks; SIGUSR1 to the whole process group (as Slurm's
--signal=USR1 sends it), or SIGTERM to the command, makes both ranks save and the command exit 0
(the launchers ignore USR1 instead of dying with 138, and never see the TERM); the same command
with --nproc 1 resumes that run in its own process.
About a minute on 2 cores."""
import contextlib
import os
import signal
import sys

import pytest

from helpers import free_port, losses, run, start, wait_for, write_config

pytestmark = pytest.mark.e2e
LENEXT = [sys.executable, "-m", "lenext_dist", "train"]


@pytest.mark.parametrize("send,sig,at", [(os.killpg, signal.SIGUSR1, "steps"), (os.kill, signal.SIGTERM, "steps"),
                                         (os.kill, signal.SIGTERM, "start")],
                         ids=["usr1-to-group", "term-to-lenext", "term-at-start"])
def test_lenext_train_two_ranks_stop_on_a_signal_then_resume_in_one_process(sample_shards, tmp_path,
                                                                           send, sig, at):
    """SIGUSR1 to the whole group (Slurm), or SIGTERM to `lenext train` (issue 40: it returned
    143 at once while DeepSpeed's launcher SIGKILLed the ranks 30 s later): both save, exit 0.
    The group's signal also reaches each rank's batch worker (data.loader_workers, the default on
    a GPU), which goes on building batches: the rank's next step still gets one. At start-up (the
    launcher just started, the ranks still importing, SIGUSR1 ignored) the stop was lost and the
    run trained to its end: it is passed on again until the ranks take it."""
    cfg = write_config(tmp_path, sample_shards, "front", train={"steps": 400, "eval_interval": 0},
                       checkpoint={"interval": 0}, data={"loader_workers": int(send is os.killpg)})
    run_dir = tmp_path / "front"
    metrics = run_dir / "metrics.jsonl"
    log = tmp_path / "train.log"
    first = start([*LENEXT, "--nproc", "2", "--port", str(free_port()), "--config", str(cfg)], log)
    try:
        if at == "start":
            assert wait_for(lambda: "launcher pid" in log.read_text(), timeout=120), log.read_text()[-3000:]
            assert not metrics.exists()
        else:
            assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2,
                            timeout=300), log.read_text()[-3000:]
        send(first.pid, sig)  # `lenext train` (and its group); it passes it on to the ranks
        assert first.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        launcher = [int(x.split()[0]) for x in log.read_text().split("launcher pid ")[1:]]
        for pid in launcher:  # in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    text = log.read_text()
    assert "[lenext train] " in text and "deepspeed.launcher.runner" in text
    assert "--module lenext_dist.train" in text and "world 2" in text
    # at start-up a rank reads the stop (SIGTERM) from launch.py's file, not from a signal
    assert ("SIGUSR1 received" in text or at == "start" and "SIGTERM received" in text), text[-3000:]
    assert ("passed on to the ranks" in text) == (sig == signal.SIGTERM)
    stopped = int(text.split("stopped at step ")[1].split(";")[0])
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{stopped:07d}"

    p = run([*LENEXT, "--config", str(cfg), f"--train.steps={stopped + 2}"])
    assert "world 1" in p.stdout and f"done at step {stopped + 2}" in p.stdout
    assert {stopped + 1, stopped + 2} <= set(losses(run_dir))
