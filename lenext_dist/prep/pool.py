"""Forked worker processes that run units of work and never leave the parent waiting.

multiprocessing.Pool silently replaces a worker that dies (OOM killer, kill -9) and waits
forever for the result it lost. Here the parent knows which unit each worker holds (the
worker says "start" before it begins) and watches every worker's exit code: a worker that
dies is an error naming its unit and the signal, and the others are stopped. A unit that
fails with a PrepError (bad input, disk full) stops the run with that message.

Workers are forked, so they start in milliseconds with the tokenizer already loaded, and
read their tasks from the parent's memory (only unit indices and small records travel).

Workers end with the parent: a SIGTERM to it (`kill PID`, Slurm) runs the clean-up below as a
Ctrl-C does, and a parent killed outright takes its workers with it (Linux's parent-death
signal). An orphan went on tokenizing, held the run's lock (a rerun was refused) and blocked
forever once the results pipe was full.
"""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import queue
import signal
import traceback
from typing import Callable, Sequence

from lenext_dist.atomic import temp_suffix
from lenext_dist.errors import sigterm_unwinds

from .errors import PrepError


def _die_with(parent: int) -> None:
    """The kernel kills this process when `parent` dies (PR_SET_PDEATHSIG, linux/prctl.h); where
    there is no prctl, the parent's own clean-up (SIGTERM, Ctrl-C) still stops its workers."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    PR_SET_PDEATHSIG = 1
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the prctl
        os._exit(1)


def _worker(tasks, fn, todo, results, parent: int) -> None:
    _die_with(parent)
    pid = os.getpid()
    while True:
        i = todo.get()
        if i is None:
            break
        results.put(("start", pid, i))
        try:
            fn(*tasks[i][1], progress=lambda *d: results.put(("progress", pid, d)))
        except PrepError as e:
            results.put(("error", pid, i, str(e), True))
            break
        except BaseException:  # a bug: the parent shows the traceback
            results.put(("error", pid, i, traceback.format_exc(), False))
            break
        results.put(("done", pid, i))
    results.close()
    results.join_thread()


def _unit_from_temps(tasks, tmp_dir: str, pid: int):
    # worker.py names a unit's partials <key>.<split>.tmp-<host>-<pid>.bin
    keys = {os.path.basename(f).split(".tmp-")[0].rsplit(".", 1)[0]
            for f in glob.glob(os.path.join(tmp_dir, f"*{temp_suffix(pid)}.bin"))}
    for i, (_, args) in enumerate(tasks):
        if args[0].get("key") in keys:
            return i
    return None


def _death(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def run_pool(tasks: Sequence[tuple], fn: Callable, workers: int, on_progress: Callable,
             tmp_dir: str) -> None:
    """Run fn(*args, progress=...) for each (label, args) in `tasks` on `workers` forked
    processes. `tmp_dir` is where a stopped worker may have left `*<temp_suffix(pid)>*` files."""
    ctx = mp.get_context("fork")
    todo, results = ctx.Queue(), ctx.Queue()
    for i in range(len(tasks)):
        todo.put(i)
    for _ in range(workers):
        todo.put(None)
    procs = [ctx.Process(target=_worker, args=(tasks, fn, todo, results, os.getpid()), daemon=True)
             for _ in range(workers)]
    for p in procs:
        p.start()
    # after the forks: a worker keeps SIGTERM's default (terminate() below ends it at once)
    with sigterm_unwinds("stopped by SIGTERM: workers stopped, finished units kept; rerun the same "
                         "command to resume"):
        _watch(tasks, procs, results, todo, on_progress, tmp_dir)


def _watch(tasks, procs, results, todo, on_progress, tmp_dir: str) -> None:
    holding: dict = {}  # pid -> task index being worked on
    left = len(tasks)

    def handle(msg) -> None:
        nonlocal left
        kind, pid = msg[0], msg[1]
        if kind == "start":
            holding[pid] = msg[2]
        elif kind == "progress":
            on_progress(*msg[2])
        elif kind == "done":
            holding.pop(pid, None)
            left -= 1
        else:
            _, _, i, text, user = msg
            if user:
                raise PrepError(text)
            raise RuntimeError(f"worker failed on {tasks[i][0]}:\n{text}")

    try:
        while left:
            try:
                handle(results.get(timeout=0.2))
                continue
            except queue.Empty:
                pass
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or all(p.exitcode is not None for p in procs):
                while True:  # what the dead one said before dying (its "start") may be queued
                    try:
                        handle(results.get(timeout=0.2))
                    except queue.Empty:
                        break
                if not left:
                    break
                p = (dead or procs)[0]
                unit = holding.get(p.pid)
                if unit is None:  # killed before its "start" left: its temp files tell
                    unit = _unit_from_temps(tasks, tmp_dir, p.pid)
                where = tasks[unit][0] if unit is not None else "between units"
                raise PrepError(
                    f"worker process {p.pid} {_death(p.exitcode or 0)} while tokenizing {where}; "
                    "nothing of that unit was kept. If the OOM killer did it (see `dmesg`), "
                    "use fewer --workers; rerun the same command to resume (finished units "
                    "are kept)."
                )
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            for pat in (f"*{temp_suffix(p.pid)}", f"*{temp_suffix(p.pid)}.*"):
                for f in glob.glob(os.path.join(tmp_dir, pat)):
                    os.remove(f)  # a stopped worker's unfinished partials
        results.cancel_join_thread()
        todo.cancel_join_thread()
