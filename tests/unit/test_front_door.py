"""`lenext prep|train|convert|eval|report|extend` (issue 35): each command is the package's own
(the scripts of a checkout are aliases of them); `lenext train --nproc N` starts DeepSpeed's
launcher with SIGUSR1 ignored, and trains in its own process for N = 1; the HeadScale search of
`lenext extend` is launched by the same command."""
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from lenext_dist import cli
from lenext_dist.train import cli as train_cli
from lenext_dist.train import launch


class Exec(Exception):
    pass


@pytest.fixture
def execve(monkeypatch):
    """The launcher's start (subprocess.Popen in launch.py) recorded instead of run; the signal
    dispositions run_launcher sets restored after the test."""
    calls = []

    def fake(argv, env=None, start_new_session=False, **_):
        calls.append((argv[0], list(argv), signal.getsignal(signal.SIGUSR1), start_new_session,
                      signal.getsignal(signal.SIGTERM)))
        raise Exec

    sigs = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    old = {s: signal.getsignal(s) for s in sigs}
    monkeypatch.setattr(launch.subprocess, "Popen", fake)
    yield calls
    for s in sigs:
        signal.signal(s, old[s])


def test_lenext_lists_every_stage():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == ["prep", "train", "convert", "eval", "report", "extend"]


def test_lenext_train_nproc_n_starts_the_runner_with_sigusr1_ignored(execve, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {steps: 5}\n")
    with pytest.raises(Exec):
        cli.main(["train", "--nproc", "2", "--port", "29611", "--config", str(cfg),
                  "--optim.lr=3e-4", "--train.steps", "100"])
    (path, argv, usr1, session, term), = execve
    assert path == sys.executable and usr1 == signal.SIG_IGN and session  # its own session
    assert term not in (signal.SIG_DFL, signal.SIG_IGN)  # passed on, not fatal
    assert argv == launch.launch_command(cfg, 2, 29611, ["--optim.lr=3e-4", "--train.steps", "100"])
    assert "[lenext train] " in capsys.readouterr().out  # the command, printed before the start


def test_lenext_train_refuses_a_bad_override_before_launching(execve, tmp_path, capsys):
    assert cli.main(["train", "--nproc", "2", "--train.stepz=3"]) == 2
    assert execve == []
    assert "train.stepz: unknown key" in capsys.readouterr().err


def test_lenext_train_one_rank_runs_in_this_process(monkeypatch, execve):
    seen = []
    monkeypatch.setattr(train_cli, "train_or_dry_run", lambda *a, **k: seen.append((a, k)))
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert cli.main(["train", "--config", "c.yaml", "--port", "29612", "--a.b=1"]) == 0
    assert seen == [(("c.yaml", ["--a.b=1"], False), {"world": 1})] and execve == []
    assert os.environ.pop("MASTER_PORT") == "29612"
    seen.clear()
    assert cli.main(["train", "--nproc", "8", "--dry-run"]) == 0  # the dry run: this process, world 8
    assert seen == [((None, [], True), {"world": 8})] and execve == []


def test_other_commands_still_refuse_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--runs", "x", "--out", "y", "--train.steps=3"])
    assert e.value.code == 2 and "unrecognized arguments: --train.steps=3" in capsys.readouterr().err


def test_lenext_prep_is_the_shard_command(monkeypatch):
    from lenext_dist.prep import cli as prep_cli

    seen = []
    monkeypatch.setattr(prep_cli, "shard_main", lambda argv, prog: seen.append((argv, prog)) or 5)
    assert cli.main(["prep", "merge", "--out", "o", "--name", "n"]) == 5
    assert seen == [(["merge", "--out", "o", "--name", "n"], "lenext prep")]


def test_lenext_convert_is_the_convert_command(monkeypatch):
    from lenext_dist.convert import cli as convert_cli

    seen = []
    monkeypatch.setattr(convert_cli, "run", lambda a: seen.append(a) or 1)
    assert cli.main(["convert", "--checkpoint", "ck", "--out", "o", "--verify"]) == 1
    assert seen[0].checkpoint == "ck" and seen[0].verify and seen[0].dtype == "fp32"


def test_the_headscale_search_is_launched_like_lenext_train(monkeypatch, tmp_path):
    from lenext_dist.config import load_config
    from lenext_dist.extend import search

    from lenext_dist.checkpoint.layout import COMPLETE, LATEST, tag_for
    from lenext_dist.errors import UserError

    runs, trains = [], []

    def launcher(cmd, stdout=None):  # the launch recorded; `trains` says which step the ranks reach
        runs.append(cmd)
        for step in trains:
            d = Path(cfg.checkpoint.dir) / tag_for(step)
            d.mkdir(parents=True)
            (d / COMPLETE).write_text(f"{step}\n")
            (d.parent / LATEST).write_text(tag_for(step) + "\n")
        return 0

    monkeypatch.setattr(search, "launcher_status", launcher)
    cfg = load_config(None, [f"run_dir={tmp_path / 'hs-256'}", "train.steps=8"])
    # a search stopped short (its ranks saved and exited 0 on a signal) is not exported
    trains[:] = [4]
    with pytest.raises(UserError, match="stopped at step_0000004 of 8 steps .* rerun lenext extend"):
        search.launch(cfg, 256, 2, 29531)
    trains[:] = [8]
    search.launch(cfg, 256, 2, 29531)
    conf = tmp_path / "hs-256" / "search.yaml"
    assert conf.is_file() and runs == [launch.launch_command(conf, 2, 29531)] * 2


def test_gpu_check_zero2_launches_like_lenext_train(monkeypatch, tmp_path):
    """The GPU check's --launch ZeRO-2 case: its config from the working directory (no path into a
    checkout), its data checked first, then the one launch command."""
    from lenext_dist.gpu import launch_case as gpu_check
    from lenext_dist.cluster import run_state

    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: 2)
    monkeypatch.chdir(tmp_path)
    r = gpu_check.check_zero2(tmp_path / "z", "missing.yaml")
    assert not r["ok"] and "--launch missing.yaml not found" in r["error"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {tokenizer: nowhere.model}\n")
    r = gpu_check.check_zero2(tmp_path / "z", str(cfg))
    assert not r["ok"] and "data.tokenizer: nowhere.model not found" in r["error"]
    assert "make shards" in r["error"]

    runs = []
    monkeypatch.setattr(run_state, "preflight", lambda c: [])
    monkeypatch.setattr(gpu_check, "launch", lambda cmd, env: runs.append((cmd, env)) or (0, ""))
    assert gpu_check.check_zero2(tmp_path / "z", str(cfg))["ok"]
    (cmd, env), = runs
    port = cmd[cmd.index("--master_port") + 1]
    assert cmd[:len(cmd) - 11] == launch.launch_command(cfg, 2, int(port))
    assert "--parallel.zero_stage=2" in cmd and "--train.global_batch_size=16" in cmd


def test_gpu_check_runs_one_rank_as_a_task_shown_only_its_own_gpu(monkeypatch, tmp_path):
    """launch/gpu-per-task: `python -m lenext_dist.train` alone, as local rank 3 of 4 that sees one
    GPU (Slurm's --gpus-per-task=1), where DeepSpeed set cuda:3; a launcher's rank variables of the
    check's own process are not passed on."""
    from lenext_dist.gpu import launch_case as gpu_check
    from lenext_dist.cluster import run_state

    monkeypatch.chdir(tmp_path)
    assert "not found" in gpu_check.check_gpu_per_task(tmp_path / "t", "missing.yaml")["error"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {tokenizer: nowhere.model}\n")
    runs = []
    monkeypatch.setattr(run_state, "preflight", lambda c: [])
    monkeypatch.setattr(gpu_check, "launch", lambda cmd, env: runs.append((cmd, env)) or (0, ""))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    monkeypatch.setenv("RANK", "7")
    assert gpu_check.check_gpu_per_task(tmp_path / "t", str(cfg))["ok"]
    (cmd, env), = runs
    assert cmd[1:5] == ["-m", launch.MODULE, "--config", str(cfg)] and "--parallel.backend=nccl" in cmd
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "1", "3", "5")


def test_launcher_status_returns_and_restores_the_signal_handlers():
    """`lenext extend` launches each HeadScale search through launcher_status and goes on: the
    status comes back (a signal's as 128 + N) and this process's handlers are its own again."""
    sigs = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in sigs}
    assert launch.launcher_status([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert launch.launcher_status([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]) == 137
    assert {s: signal.getsignal(s) for s in sigs} == before


def test_a_stop_before_the_ranks_handler_reaches_the_rank_through_the_stop_file(tmp_path):
    """SIGTERM to `lenext train` while its ranks still start up (SIGUSR1 ignored until their
    handler is in place): the signal it passed on was lost and the run trained to its end. The
    stop is written to the file the ranks read when they install the handler; the file goes with
    the launch."""
    import threading

    child = ("import os, time; time.sleep(1.5); from lenext_dist.train.signals import STOP_FILE_ENV, "
             "StopSignal; print(StopSignal().name, os.environ[STOP_FILE_ENV], flush=True)")
    out = tmp_path / "out.txt"
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with open(out, "w") as f:
        assert launch.launcher_status([sys.executable, "-c", child], stdout=f.fileno()) == 0
    name, stop_file = out.read_text().split()[-2:]
    assert name == "SIGTERM" and not os.path.exists(os.path.dirname(stop_file))


def test_a_stop_is_passed_on_when_stdout_is_a_closed_pipe(tmp_path, monkeypatch):
    """`lenext train ... | tee log` and a group SIGTERM that ends tee too: printing the notice
    raised BrokenPipeError in the handler, out of the wait: the launcher was never told and
    `lenext train` exited 1 with a traceback, its ranks running on in their own session."""
    import threading

    class Closed:
        def write(self, _):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    child = ("import time; from lenext_dist.train.signals import StopSignal; s = StopSignal()\n"
             "while s.name is None: time.sleep(0.05)\nprint(s.name, flush=True)")
    out = tmp_path / "out.txt"

    def tee_dies_then_term():
        monkeypatch.setattr(sys, "stdout", Closed())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Timer(1.5, tee_dies_then_term).start()
    with open(out, "w") as f:
        assert launch.launcher_status([sys.executable, "-c", child], stdout=f.fileno()) == 0
    assert out.read_text().split()[-1] == "SIGUSR1"


def test_gpu_check_launch_cases_are_bounded_and_kill_the_whole_launch(monkeypatch, tmp_path):
    """A hung rank (a collective waiting on a dead peer) held `--launch` until DeepSpeed's own
    10 minutes, and subprocess.run's timeout would kill the launcher alone: the ranks live on."""
    from lenext_dist.gpu import launch_case as gpu_check

    monkeypatch.setattr(gpu_check, "LAUNCH_BOUND_S", 1.0)
    pid_file = tmp_path / "rank.pid"
    hang = ("import subprocess, sys; r = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(r.pid)); r.wait()")
    out = gpu_check._run([sys.executable, "-c", hang], dict(os.environ), tmp_path / "run")
    assert not out["ok"] and "not done within 1 s" in out["error"]
    rank = int(pid_file.read_text())
    for _ in range(100):  # reaped by init once killed
        if not os.path.exists(f"/proc/{rank}") or open(f"/proc/{rank}/stat").read().split(")")[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        os.kill(rank, signal.SIGKILL)
        raise AssertionError("the launch's child outlived the bound")
