"""Run the shard step: plan, pick this task's units, process them in parallel, merge.

Parallelism is over units of work (a file, a byte range of a .jsonl, a parquet row group;
see units.py). Nothing here imports torch or the megatron.core package (mcore_io.py loads
megatron's writer alone), so a run starts in ~0.3 s; worker processes are forked after
sentencepiece is loaded (pool.py) and report progress deltas that the parent turns into
one tqdm bar (input MB, MB/s, ETA, documents, tokens, tokens/s).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from .errors import NOT_ERRORS, PrepError
from .lock import RunLock
from .manifest import check_name, load_done, make_plan, parts_dir, read_json, plan_path, \
    write_or_check_plan
from .merge import merge
from .readers import DEFAULT_TEXT_KEY, discover_inputs
from .tokenizer import SpmTokenizer, get_tokenizer
from .worker import process_unit, unit_label


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
    min_tokens: int = 0
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
        if self.min_tokens < 0:
            raise PrepError(f"--min-tokens must be >= 0, got {self.min_tokens}")
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
        **({"min_tokens": job.min_tokens} if job.min_tokens else {}),
    }


def _fingerprinted(settings: dict) -> dict:
    # skip_bad stays False here: a unit that met no bad input has the same bytes either way, and
    # one that did records what it skipped (_finished redoes it for a run without --skip-bad).
    # So the advice of a bad line, "rerun with --skip-bad", resumes the run instead of being
    # refused as other settings, and every earlier plan keeps its fingerprint.
    return {**{k: v for k, v in settings.items() if k not in ("threads", "tokenizer")}, "skip_bad": False}


def _finished(job: ShardJob, unit: dict, fingerprint: str) -> bool:
    """The unit is done under this plan, and without skipping bad input unless --skip-bad."""
    rec = load_done(job.out, job.name, unit, fingerprint)
    return rec is not None and (job.skip_bad or not set(rec.get("skipped", {})) - NOT_ERRORS)


LOG_EVERY = 60.0
"""Seconds between progress lines in a log (stderr not a terminal: a Slurm task's)."""


class _Progress:
    """A tqdm bar on a terminal; in a log a plain line every LOG_EVERY seconds (a bar's carriage
    returns make one endless line of a log file); nothing with --no-progress."""

    def __init__(self, total_bytes: int, name: str, enabled: bool):
        self.bar, self.total, self.name = None, total_bytes, name
        self.done = self.docs = self.tokens = 0
        self.t0 = self.last = time.time()
        self.lines = enabled and not sys.stderr.isatty()
        if not enabled or self.lines:
            return
        from tqdm import tqdm  # only when shown

        self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
                        file=sys.stderr, mininterval=0.5, dynamic_ncols=True)

    def __call__(self, nbytes: int, docs: int, tokens: int) -> None:
        self.docs += docs
        self.tokens += tokens
        self.done += nbytes
        now = time.time()
        rate = self.tokens / max(now - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.set_postfix_str(f"docs={self.docs:,} tok={self.tokens:,} tok/s={rate:,.0f}",
                                     refresh=False)
            self.bar.update(nbytes)
        elif self.lines and now - self.last >= LOG_EVERY:
            self.last = now
            left = (now - self.t0) * (self.total - self.done) / self.done if self.done else float("nan")
            print(f"[shard {self.name}] {self.done / 2**30:,.2f} of {self.total / 2**30:,.2f} GiB "
                  f"({100 * self.done / max(self.total, 1):.1f}%), {self.docs:,} documents, "
                  f"{self.tokens:,} tokens ({rate:,.0f}/s), about {left / 60:,.0f} min left",
                  file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _make_out(out: str, name: str) -> str:
    try:
        os.makedirs(parts_dir(out, name), exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise PrepError(f"--out {out!r} is (or is under) a file, not a directory: "
                        "pass a directory path") from None
    except OSError as e:
        raise PrepError(f"cannot create --out {out!r}: {e.strerror}") from None
    return parts_dir(out, name)


def run_shard(job: ShardJob) -> dict:
    """Shard this task's part of the inputs; merge too when it is the only task.

    Returns a summary dict (and the manifest under "manifest" when merged).
    """
    check_name(job.name)
    paths = discover_inputs(job.inputs, job.fmt, job.languages)
    tok = get_tokenizer(os.path.abspath(job.tokenizer), job.threads)
    settings = _settings(job, tok)
    parts = _make_out(job.out, job.name)
    with RunLock(parts, "shard", (job.task_index, job.num_tasks)):
        plan = make_plan(job.name, paths, _fingerprinted(settings), tok.describe())
        write_or_check_plan(job.out, job.name, plan)
        plan = read_json(plan_path(job.out, job.name))  # the first task's, which all share
        summary = _shard_units(job, plan, settings, len(paths))
        if job.num_tasks == 1:
            summary["manifest"] = merge(job.out, job.name, job.command, job.remove_parts,
                                        locked=True)
    return summary


def _shard_units(job: ShardJob, plan: dict, settings: dict, n_files: int) -> dict:
    fp = plan["fingerprint"]
    units = plan["units"]
    mine = units[job.task_index :: job.num_tasks]
    todo = [u for u in mine if not _finished(job, u, fp)]
    print(
        f"[shard {job.name}] task {job.task_index + 1}/{job.num_tasks}: {len(mine)} of "
        f"{len(units)} units of {n_files} input files, {len(mine) - len(todo)} already done, "
        f"{len(todo)} to do, {job.workers} worker(s)",
        file=sys.stderr,
    )
    t0 = time.time()
    bar = _Progress(sum(u["bytes"] for u in todo), job.name, job.progress)
    # Biggest units first, so no worker idles at the end; the order of completion does not
    # matter since merge follows the plan's order.
    tasks = []
    for u in sorted(todo, key=lambda u: -u["bytes"]):
        f = plan["inputs"][u["input"]]
        tasks.append((unit_label(u, f["path"]),
                      (u, f, job.out, job.name, settings, fp, job.command)))
    try:
        if job.workers == 1 or len(tasks) <= 1:
            for _, a in tasks:
                process_unit(*a, progress=bar)
        else:
            from .pool import run_pool

            run_pool(tasks, process_unit, min(job.workers, len(tasks)), bar,
                     parts_dir(job.out, job.name))
    finally:
        bar.close()
    return {
        "task_index": job.task_index,
        "num_tasks": job.num_tasks,
        "inputs_done_now": len(todo),
        "seconds": round(time.time() - t0, 3),
        "tokens_now": bar.tokens,
        "docs_now": bar.docs,
    }
