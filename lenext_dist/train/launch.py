"""The one place that builds the launch of a training run on N local ranks: DeepSpeed's runner
starting `python -m lenext_dist.train` on each rank (its `--module` form, so an installed package
needs no script of the checkout). `lenext train`, `lenext extend`'s HeadScale search and the GPU
check all launch through `launch_command`.

SIGUSR1 (lenext_dist/train/signals.py): the ranks save and exit 0 on it; DeepSpeed's launchers
have no handler for it and would die of it (exit 138) when it reaches their process group.
`exec_launcher` starts the runner with SIGUSR1 ignored, which its launcher inherits and which each
rank replaces with its own handler.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import NoReturn, Optional, Sequence, Union

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
    through DeepSpeed's runner, rendezvous on `port` (default: a free one)."""
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(int(nproc)),
           "--master_port", str(port or free_port()), "--module", MODULE]
    if config is not None:
        cmd += ["--config", str(config)]
    return cmd + [str(a) for a in overrides]


def ignore_stop_signal() -> None:
    """Ignore SIGUSR1 in this process; an ignored signal stays ignored in the processes it starts
    (fork and exec), so the launcher survives it while the ranks install their own handler."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def exec_launcher(cmd: Sequence[str], env: Optional[dict] = None) -> NoReturn:
    """Replace this process by the launcher of `cmd` (SIGUSR1 ignored): its exit status is the
    command's, and a signal to the process group reaches the launcher and the ranks only."""
    ignore_stop_signal()
    print(f"[lenext train] {shlex.join(cmd)}", flush=True)
    sys.stderr.flush()
    os.execve(cmd[0], list(cmd), dict(os.environ if env is None else env))
