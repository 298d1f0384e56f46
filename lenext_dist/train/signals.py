"""SIGTERM / SIGUSR1: checkpoint at the next step boundary and exit cleanly.

Slurm sends SIGUSR1 ahead of a time limit (`--signal=USR1@120`) and SIGTERM on preemption. The
handler only sets a flag; ranks agree on it with one all-reduce per step, so every rank stops at
the same step even when only some of them received the signal.

Launchers: DeepSpeed's (`deepspeed`, and the `deepspeed.launcher.launch` it starts) handle SIGINT
and SIGTERM but not SIGUSR1, whose default action ends them: SIGUSR1 sent to the whole process
group (`kill -USR1 -PGID`, Slurm's `--signal=USR1` to every process of a step) kills the launcher
at once (exit 138) while its ranks, orphaned, still save and exit 0. Signal the ranks (their
pids), or start the launcher with SIGUSR1 ignored, which it passes on to the ranks (each installs
the handler below): `(trap '' USR1; exec deepspeed ... --module lenext_dist.train ...)`. `lenext train
--nproc N` (lenext_dist/train/launch.py) and the job scripts do this (`python -m
lenext_dist.cluster node`; launch/slurm/pretrain.sbatch signals only srun).
torchrun dies of it too, and starts its ranks in sessions of their own, which a signal to its
group never reaches: under torchrun, signal the ranks.
"""
from __future__ import annotations

import os
import signal


STOP_FILE_ENV = "LENEXT_STOP_FILE"
"""A file `lenext train` (launch.py) writes, with the signal's name, before it passes a stop on:
a rank ignores SIGUSR1 until its handler is in place (seconds of imports after it starts), so a
stop sent meanwhile would be lost; the rank reads the file once its handler is in place."""


class StopSignal:
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.name = None
        for s in self.SIGNALS:
            signal.signal(s, self._handle)
        stop_file = os.environ.get(STOP_FILE_ENV)
        if stop_file and os.path.isfile(stop_file):  # a stop that came before the handler
            with open(stop_file) as f:
                name = f.read().strip()
            self.name = name if name in {s.name for s in self.SIGNALS} else "SIGUSR1"

    def _handle(self, signum, _frame):
        self.name = signal.Signals(signum).name

    def agreed(self, device="cpu") -> bool:
        """True on every rank if any rank got a signal (collective: call on all ranks). `name` is
        then the signal's name on every rank, whichever rank received it. `device`: where the
        process group reduces (the accelerator under NCCL, which takes no CPU tensors)."""
        import torch
        import torch.distributed as dist

        num = torch.tensor([signal.Signals[self.name].value if self.name else 0], device=device)
        if dist.is_initialized():
            dist.all_reduce(num, op=dist.ReduceOp.MAX)
        if num.item():
            self.name = signal.Signals(int(num.item())).name
        return bool(num.item())
