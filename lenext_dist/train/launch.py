"""The one place that builds the launch of a training run on N local ranks: DeepSpeed's runner
starting `python -m lenext_dist.train` on each rank (its `--module` form, so an installed package
needs no script of the checkout). `lenext train`, `lenext extend`'s HeadScale search and the GPU
check all launch through `launch_command`.

SIGUSR1 (lenext_dist/train/signals.py): the ranks save and exit 0 on it; DeepSpeed's launchers
have no handler for it and would die of it (exit 138) when it reaches their process group, and
their SIGTERM handler terminates the ranks and SIGKILLs them 30 s later. `run_launcher` starts the
runner with SIGUSR1 ignored (its launcher inherits that; each rank replaces it with its own
handler) in a session of its own, and passes SIGTERM / SIGUSR1 on to it as SIGUSR1.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn, Optional, Sequence, Union

from lenext_dist.train.signals import STOP_FILE_ENV

MODULE = "lenext_dist.train"
"""The module every rank runs (`python -m lenext_dist.train`)."""


def free_port() -> int:
    """A TCP port free on this host now (several runs may share a machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(config: Union[str, Path, None], nproc: int, port: Optional[int] = None,
                   overrides: Sequence[str] = ()) -> list[str]:
    """The command that trains `config` (with `--a.b=value` overrides) on `nproc` local ranks
    through DeepSpeed's runner, rendezvous on `port` (default: a free one); on the devices
    CUDA_VISIBLE_DEVICES names when it names some (device.launcher_devices)."""
    from lenext_dist.train.device import launcher_devices

    devices = launcher_devices(int(nproc))
    where = (["--num_gpus", str(int(nproc))] if devices is None
             else ["--include", "localhost:" + ",".join(map(str, devices))])
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", *where,
           "--master_port", str(port or free_port()), "--module", MODULE]
    if config is not None:
        cmd += ["--config", str(config)]
    return cmd + [str(a) for a in overrides]


def ignore_stop_signal() -> None:
    """Ignore SIGUSR1 in this process; an ignored signal stays ignored in the processes it starts
    (fork and exec), so the launcher survives it while the ranks install their own handler."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def run_launcher(cmd: Sequence[str], env: Optional[dict] = None) -> NoReturn:
    """launcher_status, then exit with the launcher's status (`lenext train`)."""
    sys.exit(launcher_status(cmd, env))


def launcher_status(cmd: Sequence[str], env: Optional[dict] = None, stdout: Optional[int] = None) -> int:
    """Run the launcher of `cmd` as a child in a session of its own (SIGUSR1 ignored) and return
    its exit status (a signal's as 128 + N); this process's signal handlers are restored after
    (`lenext extend` launches its searches through here and goes on); `stdout`: a file descriptor
    for the launcher's stdout and stderr (default: this process's). SIGTERM or SIGUSR1 to this
    process, or to its process group, reaches the launcher's group as SIGUSR1: the ranks save at
    the next step boundary and exit 0, the launchers ignore it; a rank still starting up (it
    ignores the signal until its handler is in place) finds the stop in the file STOP_FILE_ENV
    names. DeepSpeed's launch.py never sees a SIGTERM: its handler would terminate the ranks and
    SIGKILL them 30 s later, losing a step + save that takes longer. SIGINT and SIGHUP are passed
    on as they are (Ctrl-C stops the run). A kill -9 of this process leaves the launcher running:
    signal its group (the pid it prints)."""
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    before = {s: signal.getsignal(s) for s in handled}
    ignore_stop_signal()  # inherited by the launcher (fork and exec); its ranks install theirs
    print(f"[lenext train] {shlex.join(cmd)}", flush=True)
    sys.stderr.flush()
    child: list = []
    stop_dir = tempfile.mkdtemp(prefix="lenext-stop-")
    env = {**(os.environ if env is None else env), STOP_FILE_ENV: os.path.join(stop_dir, "stop")}

    def send(sig) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child[0].pid, sig)

    def forward(signum, _frame):
        if signum not in (signal.SIGTERM, signal.SIGUSR1):
            return send(signum)
        # the file first: a rank whose handler is not in place yet ignores the signal, and reads
        # the file when it installs the handler (signals.StopSignal)
        with contextlib.suppress(OSError), open(env[STOP_FILE_ENV], "w") as f:
            f.write(signal.Signals(signum).name)
        send(signal.SIGUSR1)
        if signum == signal.SIGTERM:
            _say("[lenext train] SIGTERM: passed on to the ranks as SIGUSR1 (they save at the next step "
                 "boundary and exit 0)")

    try:
        for s in handled[:3]:
            signal.signal(s, forward)
        # SIGUSR1 still ignored here: exec keeps an ignored signal ignored but resets a handled one
        child.append(subprocess.Popen(list(cmd), env=env, start_new_session=True, stdout=stdout,
                                      stderr=None if stdout is None else subprocess.STDOUT))
        signal.signal(signal.SIGUSR1, forward)
        _say(f"[lenext train] launcher pid {child[0].pid} (its process group)")
        rc = child[0].wait()  # a handled signal interrupts the wait, which Python resumes (PEP 475)
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        shutil.rmtree(stop_dir, ignore_errors=True)
    return rc if rc >= 0 else 128 - rc


def _say(line: str) -> None:
    # a closed stdout (`lenext train ... | tee log`, tee killed by the same group signal) must
    # not stop the signal's forwarding, nor leave the launcher running without this process
    with contextlib.suppress(OSError):
        print(line, flush=True)
