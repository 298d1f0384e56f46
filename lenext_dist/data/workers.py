"""Loader worker processes that build the next steps' batches while the device computes, and that
neither die of the stop signals meant for the training process nor hang its exit.

A stop signal (SIGTERM, SIGUSR1) is the training process's to act on at a step boundary (StopSignal:
a checkpoint, then exit). Slurm signals every process of a step and launchers signal the process
group, so the workers get it too: they must keep building batches until the training process
stops. Two windows make that harder than ignoring the signals in `worker_init_fn`:
- from the fork to `worker_init_fn` a worker has the default action and a signal there kills it
  (the next batch raises "DataLoader worker exited unexpectedly"): the stop signals are blocked in
  the forking thread across the fork, and a worker unblocks them once its handler is in place;
- at the training process's exit (a crash keeps the iterator alive in the traceback) torch leaves
  its workers to multiprocessing, which ends them with SIGTERM and joins them: a worker that
  ignored SIGTERM made that join wait forever (a crashed job then held its nodes until the time
  limit). A worker acts on a stop signal once its training process is exiting (a flag in shared
  memory, set by an exit hook that runs before multiprocessing's).
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import multiprocessing
import os
import signal
from typing import Iterator

import torch

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_CTX = multiprocessing.get_context("fork")
_exiting: tuple[int, object] | None = None  # (pid, shared c_bool): set when that process exits


def _exit_flag():
    """This process's shared flag, set by its exit hook; registered after multiprocessing's own
    (imported with torch), so it runs first (atexit is last-in, first-out)."""
    global _exiting
    if _exiting is None or _exiting[0] != os.getpid():
        flag = _CTX.RawValue(ctypes.c_bool, False)
        atexit.register(setattr, flag, "value", True)
        _exiting = (os.getpid(), flag)
    return _exiting[1]


def _on_stop(exiting, signum: int, _frame) -> None:
    if exiting.value:  # the training process is ending its workers: die as the signal would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _worker_init(exiting, _worker_id: int) -> None:
    for s in STOP_SIGNALS:
        signal.signal(s, functools.partial(_on_stop, exiting))
    # blocked since the fork (worker_batches): a signal that came meanwhile is delivered now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def worker_batches(steps, workers: int) -> Iterator:
    """Iterate `steps` (a sequence whose items are already whole batches) in order, built ahead in
    `workers` forked processes (fork: they inherit the dataset, megatron's over memory-mapped
    shards, as it is)."""
    loader = torch.utils.data.DataLoader(steps, batch_size=None, num_workers=workers,
                                         worker_init_fn=functools.partial(_worker_init, _exit_flag()),
                                         multiprocessing_context=_CTX)
    # the workers are forked in iter(): they inherit this thread's mask, so a stop signal reaches
    # none of them before its handler; this process gets any that came meanwhile at the unblock
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
