"""One unit of work (a file, a byte range of a .jsonl, a parquet row group: units.py) ->
one partial shard per split + a done-record.

The result of a unit does not depend on which process or Slurm task handled it, so merging
partials in plan order gives the same bytes for any number of workers or tasks, and a rerun
after a kill only redoes unfinished units.

Crash safety: partials are written under temporary names, renamed into place, and only
then is the done-record written (atomically). A done-record therefore implies complete
partials; a file without one is simply redone, overwriting whatever a killed run left.
"""

from __future__ import annotations

import errno
import glob
import os
import time
from collections import Counter
from typing import Callable, Optional

import numpy as np

from lenext_dist.atomic import open_new, temp_suffix

from .errors import EMPTY, EXCLUDED_SET, SHORT, Bad, PrepError
from .lock import RunLock
from .manifest import answers_prefix, done_path, partial_prefix, parts_dir, write_json_atomic
from .readers import open_reader
from .task_source import TaskReader
from .tokenizer import get_tokenizer, in_valid_split, sha256_file
from .units import stat_of

# Texts per encode call: large enough that SentencePiece's batch call amortizes its
# per-call overhead, small enough that memory stays bounded (~ this many chars in flight).
BATCH_CHARS = 1 << 21
BATCH_DOCS = 2048

ProgressFn = Callable[[int, int, int], None]  # (input bytes, documents, tokens) deltas


def splits_for(settings: dict) -> list[str]:
    return ["train", "valid"] if settings["valid_fraction"] > 0 else ["train"]


class _SplitWriters:
    """megatron IndexedDatasetBuilders for each split of one input, under temp names; with
    `answers`, each split's answer mask too (uint8, same document lengths: manifest.answers_prefix)."""

    def __init__(self, out_dir: str, name: str, key: str, splits: list[str], dtype,
                 answers: bool = False):
        from .mcore_io import indexed_dataset  # megatron's writer, without megatron.core's init

        builder = indexed_dataset().IndexedDatasetBuilder
        self.builders: dict[tuple[str, bool], object] = {}  # (split, is mask) -> builder
        self.paths: dict[tuple[str, bool], tuple[str, str]] = {}  # -> (temp, final prefix)
        for s in splits:
            prefix = partial_prefix(out_dir, name, key, s)
            for mask in (False, True) if answers else (False,):
                final = answers_prefix(prefix) if mask else prefix
                tmp = final + temp_suffix()
                self.paths[s, mask] = (tmp, final)
                open_new(tmp + ".bin").close()  # megatron opens it with "wb": ours, not a planted link
                self.builders[s, mask] = builder(tmp + ".bin", dtype=np.uint8 if mask else dtype)

    def add(self, split: str, tokens, answers: tuple = ()) -> None:
        # One document = one sequence, as megatron's preprocess_data.py writes it.
        self.builders[split, False].add_document(tokens, [len(tokens)])
        if (split, True) in self.builders:
            mask = np.zeros(len(tokens), np.uint8)
            for start, k in answers:
                if start + k > len(tokens):  # the generator's token count is the tokenizer's
                    raise PrepError(f"a generated document's answer ({start}+{k}) lies past its "
                                    f"{len(tokens)} tokens (report this: task_source.py)")
                mask[start:start + k] = 1
            self.builders[split, True].add_document(mask, [len(mask)])

    def commit(self) -> None:
        for key, b in self.builders.items():
            open_new(self.paths[key][0] + ".idx").close()  # as the .bin above
            b.finalize(self.paths[key][0] + ".idx")
        for tmp, final in self.paths.values():
            for ext in (".bin", ".idx"):
                os.replace(tmp + ext, final + ext)

    def discard(self) -> None:
        for b in self.builders.values():
            try:
                b.data_file.close()
            except OSError:  # its final flush fails again on a full disk; the file goes anyway
                pass
        for tmp, _ in self.paths.values():
            for ext in (".bin", ".idx"):
                try:
                    os.remove(tmp + ext)
                except FileNotFoundError:
                    pass


def unit_label(unit: dict, path: str) -> str:
    """Where a unit is, for messages: the file, and the part of it."""
    if "start" in unit:
        return f"{path} (bytes {unit['start']}-{unit['end']})"
    if "row_groups" in unit:
        return f"{path} (row group {unit['row_groups'][0]})"
    return path


def _check_unchanged(path: str, entry: dict) -> None:
    try:
        now = stat_of(path)
    except FileNotFoundError:
        raise PrepError(f"input {path!r} disappeared since the run began") from None
    if now != {"size": entry["size"], "mtime_ns": entry["mtime_ns"]}:
        raise PrepError(
            f"input {path!r} changed since the run began (size {entry['size']} -> "
            f"{now['size']}, or modified): start a fresh run (new --out, or delete its "
            "parts) so the output matches one version of the data"
        )


def process_unit(
    unit: dict,
    entry: dict,
    out_dir: str,
    name: str,
    settings: dict,
    fingerprint: str,
    command: str,
    progress: Optional[ProgressFn] = None,
) -> dict:
    """Tokenize one unit of input file `entry` into partial shards; return (and write) its
    done-record. Disk errors become a PrepError saying where, with nothing half-written left."""
    where = unit_label(unit, entry["path"])
    # Locked per unit, not only per task: tasks submitted with another task count share units.
    with RunLock(parts_dir(out_dir, name), where, unit=unit["key"]):
        try:
            return _process_unit(unit, entry, out_dir, name, settings, fingerprint, command, progress)
        except OSError as e:
            full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            raise PrepError(
                f"{where}: {e.strerror or e} ({e.filename or out_dir}). "
                + ("Free disk space under --out (or use another --out); " if full else "")
                + "finished units are kept: rerun the same command to resume."
            ) from None


def _process_unit(unit, entry, out_dir, name, settings, fingerprint, command, progress):
    t0 = time.time()
    path = entry["path"]
    _check_unchanged(path, entry)
    # A killed run may have left temp files of this unit; only the holder of its lock touches them.
    for stale in glob.glob(os.path.join(parts_dir(out_dir, name), glob.escape(unit["key"]) + ".*tmp-*")):
        os.remove(stale)
    tok = get_tokenizer(settings["tokenizer"], settings["threads"])
    splits = splits_for(settings)
    include = set(settings["include_sets"] or ())
    exclude = set(settings["exclude_sets"] or ())
    filtering = bool(include or exclude)
    valid_fraction = settings["valid_fraction"]
    min_tokens = settings.get("min_tokens", 0)  # absent from plans made before --min-tokens
    skip_bad = settings["skip_bad"]

    stats_read = 0
    written: Counter = Counter({s: 0 for s in splits})
    tokens: Counter = Counter({s: 0 for s in splits})
    skipped: Counter = Counter()
    by_set: Counter = Counter()
    problems: list[str] = []  # first few bad locations, so a user can look at them

    tasks = settings["format"] == "tasks"
    writers = _SplitWriters(out_dir, name, unit["key"], splits, tok.dtype, answers=tasks)
    if tasks:  # documents generated over the file's text (one unit)
        reader = TaskReader(path, settings["text_key"], settings["tasks"], tok)
    else:
        reader = open_reader(path, settings["format"], settings["text_key"],
                             **{k: unit[k] for k in ("start", "end", "row_groups") if k in unit})
    batch_texts: list[str] = []
    batch_splits: list[str] = []
    batch_answers: list[tuple] = []
    batch_chars = 0
    reported_bytes = 0

    def flush() -> None:
        nonlocal batch_chars, reported_bytes
        n_tok = 0
        if batch_texts:
            for split, ids, answers in zip(batch_splits, tok.encode_batch(batch_texts),
                                           batch_answers):
                if len(ids) < min_tokens:
                    skipped[SHORT] += 1
                    continue
                writers.add(split, ids, answers)
                written[split] += 1
                tokens[split] += len(ids)
                n_tok += len(ids)
        if progress is not None:
            progress(reader.bytes_done - reported_bytes, len(batch_texts), n_tok)
            reported_bytes = reader.bytes_done
        batch_texts.clear()
        batch_splits.clear()
        batch_answers.clear()
        batch_chars = 0

    def count_bad(bad: Bad) -> None:
        if not skip_bad:
            raise bad.error()
        skipped[bad.reason] += bad.docs
        if len(problems) < 20:
            problems.append(f"{bad.reason} at {bad.where}: {bad.detail}"[:300])

    try:
        for rec in reader:
            if isinstance(rec, Bad):
                stats_read += rec.docs
                count_bad(rec)
                continue
            stats_read += 1
            text, set_name = rec.text, rec.set_name
            if set_name is not None:
                by_set[set_name] += 1
            if filtering:
                if set_name is None:
                    count_bad(Bad("missing_set_name", f"{unit_label(unit, path)} (document {stats_read})",
                                  "cannot apply --include-sets/--exclude-sets"))
                    continue
                if set_name in exclude or (include and set_name not in include):
                    skipped[EXCLUDED_SET] += 1
                    continue
            if not text or text.isspace():
                skipped[EMPTY] += 1
                continue
            split = "valid" if in_valid_split(text, valid_fraction) else "train"
            batch_texts.append(text)
            batch_splits.append(split)
            batch_answers.append(rec.answers)
            batch_chars += len(text)
            if batch_chars >= BATCH_CHARS or len(batch_texts) >= BATCH_DOCS:
                flush()
        flush()
        _check_unchanged(path, entry)  # edited while we read it: these tokens are of neither
        writers.commit()
    except BaseException:
        writers.discard()
        raise

    info = {"path": path, "size": entry["size"], "mtime_ns": entry["mtime_ns"]}
    if unit.get("start", 0) == 0 and unit.get("row_groups", [0])[0] == 0:
        info["sha256"] = sha256_file(path)  # the file's first unit hashes the whole file
    record = {
        "input": info,
        "key": unit["key"],
        "fingerprint": fingerprint,
        "command": command,
        "docs_read": stats_read,
        "docs_written": dict(written),
        "tokens": dict(tokens),
        "skipped": dict(sorted(skipped.items())),
        "docs_by_set": dict(sorted(by_set.items())),
        "problems": problems,
        "seconds": round(time.time() - t0, 3),
    }
    write_json_atomic(done_path(out_dir, name, unit["key"]), record)
    return record
