"""Run the shard step: plan, pick this task's inputs, process them in parallel, merge.

Parallelism is over input files (see worker.py for why). Worker processes are forked
after megatron and sentencepiece are imported, so each starts in milliseconds instead
of re-importing torch; they report progress deltas through a queue that the parent
turns into one tqdm bar (input MB, MB/s, ETA, documents, tokens, tokens/s).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from .errors import PrepError
from .manifest import load_done, make_plan, write_or_check_plan
from .merge import merge
from .readers import DEFAULT_TEXT_KEY, discover_inputs
from .tokenizer import SpmTokenizer
from .worker import get_tokenizer, process_input


@dataclass
class ShardJob:
    inputs: Sequence[str]
    fmt: str
    tokenizer: str
    out: str
    name: str
    workers: int = 1
    threads: int = 1
    text_key: Optional[str] = None
    include_sets: Sequence[str] = ()
    exclude_sets: Sequence[str] = ()
    languages: Sequence[str] = ()
    valid_fraction: float = 0.0
    skip_bad: bool = False
    task_index: int = 0
    num_tasks: int = 1
    progress: bool = True
    remove_parts: bool = False
    command: str = ""
    tasks: Optional[dict] = None  # --format tasks: task_source.task_spec(...)

    def __post_init__(self):
        if not 0.0 <= self.valid_fraction < 1.0:
            raise PrepError(f"--valid-fraction must be in [0, 1), got {self.valid_fraction}")
        if self.workers < 1 or self.threads < 1:
            raise PrepError("--workers and --threads must be >= 1")
        if self.num_tasks < 1 or not 0 <= self.task_index < self.num_tasks:
            raise PrepError(
                f"--task-index {self.task_index} is not in [0, --num-tasks {self.num_tasks})"
            )
        if (self.fmt == "tasks") != bool(self.tasks):
            raise PrepError("--tasks goes with --format tasks, and --format tasks needs --tasks")
        if (self.include_sets or self.exclude_sets) and self.fmt not in ("slimpajama",):
            raise PrepError("--include-sets/--exclude-sets only apply to --format slimpajama")


def _settings(job: ShardJob, tok: SpmTokenizer) -> dict:
    # Everything that changes the bytes of the output; the fingerprint is taken over it.
    return {
        "format": job.fmt,
        "text_key": job.text_key or DEFAULT_TEXT_KEY[job.fmt],
        "include_sets": sorted(job.include_sets),
        "exclude_sets": sorted(job.exclude_sets),
        "languages": sorted(job.languages),
        "valid_fraction": job.valid_fraction,
        "skip_bad": job.skip_bad,
        "tokenizer": tok.path,
        # threads only changes speed, not bytes, but workers read it from here
        "threads": job.threads,
        # only when set, so the fingerprint of every other run stays what it was
        **({"tasks": job.tasks} if job.tasks else {}),
    }


def _fingerprinted(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in ("threads", "tokenizer")}


class _Progress:
    def __init__(self, total_bytes: int, name: str, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
            file=sys.stderr, disable=not enabled, mininterval=0.5 if sys.stderr.isatty() else 10,
            dynamic_ncols=True,
        )
        self.docs = self.tokens = 0
        self.t0 = time.time()

    def __call__(self, nbytes: int, docs: int, tokens: int) -> None:
        self.docs += docs
        self.tokens += tokens
        rate = self.tokens / max(time.time() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"docs={self.docs:,} tok={self.tokens:,} tok/s={rate:,.0f}",
                                 refresh=False)
        self.bar.update(nbytes)

    def close(self):
        self.bar.close()


_QUEUE = None


def _pool_init(q):
    global _QUEUE
    _QUEUE = q


def _pool_task(args):
    entry, out, name, settings, fingerprint, command = args
    return process_input(entry, out, name, settings, fingerprint, command,
                         progress=lambda *d: _QUEUE.put(d))


def run_shard(job: ShardJob) -> dict:
    """Shard this task's part of the inputs; merge too when it is the only task.

    Returns a summary dict (and the manifest under "manifest" when merged).
    """
    paths = discover_inputs(job.inputs, job.fmt, job.languages)
    tok = get_tokenizer(os.path.abspath(job.tokenizer), job.threads)
    settings = _settings(job, tok)
    plan = make_plan(job.name, paths, _fingerprinted(settings), tok.describe())
    os.makedirs(job.out, exist_ok=True)
    write_or_check_plan(job.out, job.name, plan)
    fp = plan["fingerprint"]

    mine = plan["inputs"][job.task_index :: job.num_tasks]
    todo = [e for e in mine if load_done(job.out, job.name, e, fp) is None]
    print(
        f"[shard {job.name}] task {job.task_index + 1}/{job.num_tasks}: {len(mine)} of "
        f"{len(paths)} input files, {len(mine) - len(todo)} already done, {len(todo)} to do, "
        f"{job.workers} worker(s)",
        file=sys.stderr,
    )
    t0 = time.time()
    bar = _Progress(sum(e["size"] for e in todo), job.name, job.progress)
    try:
        args = [(e, job.out, job.name, settings, fp, job.command) for e in todo]
        if job.workers == 1 or len(todo) <= 1:
            for a in args:
                process_input(*a, progress=bar)
        else:
            _run_pool(args, job.workers, bar)
    finally:
        bar.close()
    summary = {
        "task_index": job.task_index,
        "num_tasks": job.num_tasks,
        "inputs_done_now": len(todo),
        "seconds": round(time.time() - t0, 3),
        "tokens_now": bar.tokens,
        "docs_now": bar.docs,
    }
    if job.num_tasks == 1:
        summary["manifest"] = merge(job.out, job.name, job.command, job.remove_parts)
    return summary


def _run_pool(args: list, workers: int, bar: _Progress) -> None:
    # fork: children inherit the imported megatron/sentencepiece (importing torch again
    # would cost ~4 s per worker). Biggest files first, so no worker idles at the end;
    # order of completion does not matter since merge follows the plan's order.
    ctx = mp.get_context("fork" if hasattr(os, "fork") else "spawn")
    q = ctx.Queue()
    args = sorted(args, key=lambda a: -a[0]["size"])
    with ctx.Pool(min(workers, len(args)), initializer=_pool_init, initargs=(q,)) as pool:
        pending = [pool.apply_async(_pool_task, (a,)) for a in args]
        while pending:
            try:
                bar(*q.get(timeout=0.2))
            except queue.Empty:
                pass
            still = []
            for r in pending:
                if r.ready():
                    r.get()  # re-raises a worker's PrepError here, in the parent
                else:
                    still.append(r)
            pending = still
        while True:  # drain progress sent just before the last task returned
            try:
                bar(*q.get_nowait())
            except queue.Empty:
                break
