"""Running the study's work on a few CPU lanes: commands side by side (data prep, pretraining
launches), and jobs (typed evaluation jobs, `lenext extend`'s workflow) in a pool of worker
processes (each imports torch/transformers once and runs many evaluations).

Every command's output goes to a log file under the study folder; a failing command raises
`JobError` naming that log. Environment for children: `DS_ACCELERATOR=cpu`, one thread per lane
(`OMP_NUM_THREADS=1`: two tiny models side by side beat one on two threads, DESIGN section 9),
and a private `TORCH_EXTENSIONS_DIR` so DeepSpeed's shared-memory comm op is built once and not
rebuilt when another process on the machine builds it with another command line (measured here:
a 40 s rebuild at every launch with the shared default cache).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from lenext_dist.errors import UserError

REPO = Path(__file__).resolve().parents[2]


class JobError(UserError, RuntimeError):
    """A study step failed; the message names its log file."""


def child_env(threads: int = 1) -> dict:
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env.setdefault("TORCH_EXTENSIONS_DIR",
                   str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                       / "lenext_torch_extensions"))
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


@dataclass
class Command:
    name: str
    argv: list[str]
    log: Path
    threads: int = 1
    done: Optional[Callable[[], bool]] = None
    """Skip the command when this returns True (resumability)."""
    seconds: float = field(default=0.0, init=False)


def _start(cmd: Command) -> subprocess.Popen:
    cmd.log.parent.mkdir(parents=True, exist_ok=True)
    f = open(cmd.log, "w")
    f.write("$ " + " ".join(cmd.argv) + "\n")
    f.flush()
    return subprocess.Popen(cmd.argv, cwd=REPO, env=child_env(cmd.threads), stdout=f,
                            stderr=subprocess.STDOUT)


def run_commands(cmds: Sequence[Command], lanes: int, log: Callable[[str], None] = print) -> dict:
    """Run commands, at most `lanes` at a time; returns {name: seconds}; raises on a failure
    (after the running ones finish)."""
    pending = [c for c in cmds if not (c.done and c.done())]
    for c in cmds:
        if c not in pending:
            log(f"[study] {c.name}: done before, skipped")
    running: dict[subprocess.Popen, tuple[Command, float]] = {}
    failed = []
    while pending or running:
        while pending and len(running) < max(1, lanes) and not failed:
            c = pending.pop(0)
            log(f"[study] start {c.name} (log {c.log})")
            running[_start(c)] = (c, time.perf_counter())
        if not pending and not running:
            break
        if failed and not running:
            break
        time.sleep(0.5)
        for p in [p for p in running if p.poll() is not None]:
            c, t0 = running.pop(p)
            c.seconds = time.perf_counter() - t0
            if p.returncode != 0:
                failed.append(c)
                log(f"[study] FAILED {c.name} (exit {p.returncode}); see {c.log}")
            else:
                log(f"[study] done {c.name} in {c.seconds:.0f} s")
        if failed and not running:
            break
    if failed:
        tail = failed[0].log.read_text().splitlines()[-15:]
        raise JobError(f"{failed[0].name} failed; last lines of {failed[0].log}:\n" + "\n".join(tail))
    return {c.name: round(c.seconds, 1) for c in cmds}


# ----------------------------------------------------------------------------- eval pool
def _worker_init(threads: int) -> None:
    os.environ.update({k: v for k, v in child_env(threads).items() if k not in ("PYTHONPATH",)})
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(threads)


def _job_task(name: str, jobs: list, log: str) -> tuple[str, float]:
    """Run each job (an object with `run()`: an evaluation job of lenext_dist.eval.jobs, or
    `lenext extend`'s ExtendOptions) in this worker; its output goes to `log`."""
    import contextlib

    t0 = time.perf_counter()
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        for job in jobs:
            print(f"$ {job!r}", flush=True)
            job.run()
    return name, time.perf_counter() - t0


@dataclass
class Task:
    name: str
    jobs: list
    """Objects with `run()` (they pickle: they travel to a pool worker), run in order."""
    log: Optional[Path] = None
    after: tuple[str, ...] = ()
    """Names of tasks that must finish first."""


def run_tasks(tasks: Sequence[Task], workers: int, threads: int = 1,
              log: Callable[[str], None] = print) -> dict:
    """Run tasks on `workers` processes respecting `after`; returns {name: seconds}."""
    import multiprocessing as mp

    todo = list(tasks)
    names = {t.name for t in todo}
    finished: dict[str, float] = {}
    futures: dict[Future, Task] = {}
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=mp.get_context("spawn"),
                             initializer=_worker_init, initargs=(threads,)) as ex:
        while todo or futures:
            ready = [t for t in todo if all(a in finished or a not in names for a in t.after)]
            for t in ready:
                if len(futures) >= max(1, workers) * 2:
                    break
                todo.remove(t)
                fut = ex.submit(_job_task, t.name, t.jobs, str(t.log))
                futures[fut] = t
            if not futures:
                raise JobError(f"unsatisfiable task order: {[t.name for t in todo]}")
            done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
            for fut in done:
                t = futures.pop(fut)
                try:
                    name, sec = fut.result()
                except Exception as e:
                    for f in futures:
                        f.cancel()
                    raise JobError(f"task {t.name} failed (log {t.log}): {e}") from e
                finished[name] = round(sec, 1)
                log(f"[study] done {name} in {sec:.0f} s")
    return finished
