"""SIGTERM / SIGUSR1: checkpoint at the next step boundary and exit cleanly.

Slurm sends SIGUSR1 ahead of a time limit (`--signal=USR1@120`) and SIGTERM on preemption. The
handler only sets a flag; ranks agree on it with one all-reduce per step, so every rank stops at
the same step even when only some of them received the signal.
"""
from __future__ import annotations

import signal

import torch
import torch.distributed as dist


class StopSignal:
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.name = None
        for s in self.SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, _frame):
        self.name = signal.Signals(signum).name

    def agreed(self, device="cpu") -> bool:
        """True on every rank if any rank got a signal (collective: call on all ranks). `name` is
        then the signal's name on every rank, whichever rank received it. `device`: where the
        process group reduces (the accelerator under NCCL, which takes no CPU tensors)."""
        num = torch.tensor([signal.Signals[self.name].value if self.name else 0], device=device)
        if dist.is_initialized():
            dist.all_reduce(num, op=dist.ReduceOp.MAX)
        if num.item():
            self.name = signal.Signals(int(num.item())).name
        return bool(num.item())
