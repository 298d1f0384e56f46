"""One unit of work: one input file -> one partial shard per split + a done-record.

Why one file per unit: the result of a file does not depend on which process or Slurm
task handled it, so merging partials in sorted input order gives the same bytes for any
number of workers or tasks, and a rerun after a kill only redoes unfinished files.

Crash safety: partials are written under temporary names, renamed into place, and only
then is the done-record written (atomically). A done-record therefore implies complete
partials; a file without one is simply redone, overwriting whatever a killed run left.
"""

from __future__ import annotations

import glob
import os
import time
from collections import Counter
from typing import Callable, Optional

from .errors import EMPTY, EXCLUDED_SET, Bad, PrepError
from .manifest import done_path, partial_prefix, parts_dir, write_json_atomic
from .readers import open_reader
from .tokenizer import SpmTokenizer, in_valid_split, sha256_file

# Texts per encode call: large enough that SentencePiece's batch call amortizes its
# per-call overhead, small enough that memory stays bounded (~ this many chars in flight).
BATCH_CHARS = 1 << 21
BATCH_DOCS = 2048

ProgressFn = Callable[[int, int, int], None]  # (input bytes, documents, tokens) deltas

_TOKENIZERS: dict = {}  # one loaded model per (path, threads) per process


def get_tokenizer(path: str, threads: int) -> SpmTokenizer:
    key = (path, threads)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = SpmTokenizer(path, threads)
    return _TOKENIZERS[key]


def splits_for(settings: dict) -> list[str]:
    return ["train", "valid"] if settings["valid_fraction"] > 0 else ["train"]


class _SplitWriters:
    """megatron IndexedDatasetBuilders for each split of one input, under temp names."""

    def __init__(self, out_dir: str, name: str, key: str, splits: list[str], dtype):
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        self.final = {s: partial_prefix(out_dir, name, key, s) for s in splits}
        self.tmp = {s: f"{p}.tmp-{os.getpid()}" for s, p in self.final.items()}
        self.builders = {s: IndexedDatasetBuilder(self.tmp[s] + ".bin", dtype=dtype) for s in splits}

    def add(self, split: str, tokens) -> None:
        # One document = one sequence, as megatron's preprocess_data.py writes it.
        self.builders[split].add_document(tokens, [len(tokens)])

    def commit(self) -> None:
        for s, b in self.builders.items():
            b.finalize(self.tmp[s] + ".idx")
        for s in self.builders:
            for ext in (".bin", ".idx"):
                os.replace(self.tmp[s] + ext, self.final[s] + ext)

    def discard(self) -> None:
        for s, b in self.builders.items():
            b.data_file.close()
            for ext in (".bin", ".idx"):
                try:
                    os.remove(self.tmp[s] + ext)
                except FileNotFoundError:
                    pass


def process_input(
    entry: dict,
    out_dir: str,
    name: str,
    settings: dict,
    fingerprint: str,
    command: str,
    progress: Optional[ProgressFn] = None,
) -> dict:
    """Tokenize one input file into partial shards; return (and write) its done-record."""
    t0 = time.time()
    path = entry["path"]
    if not os.path.isfile(path):
        raise PrepError(f"input {path!r} disappeared since the plan was made")
    size = os.path.getsize(path)
    if size != entry["size"]:
        raise PrepError(
            f"input {path!r} changed size since the plan was made ({entry['size']} -> {size}); "
            "start a fresh run (new --out) so the output matches one version of the data"
        )
    # A killed run may have left temp files of this input; only its owner task touches them.
    for stale in glob.glob(os.path.join(parts_dir(out_dir, name), glob.escape(entry["key"]) + ".*tmp-*")):
        os.remove(stale)
    tok = get_tokenizer(settings["tokenizer"], settings["threads"])
    splits = splits_for(settings)
    include = set(settings["include_sets"] or ())
    exclude = set(settings["exclude_sets"] or ())
    filtering = bool(include or exclude)
    valid_fraction = settings["valid_fraction"]
    skip_bad = settings["skip_bad"]

    stats_read = 0
    written: Counter = Counter({s: 0 for s in splits})
    tokens: Counter = Counter({s: 0 for s in splits})
    skipped: Counter = Counter()
    by_set: Counter = Counter()
    problems: list[str] = []  # first few bad locations, so a user can look at them

    writers = _SplitWriters(out_dir, name, entry["key"], splits, tok.dtype)
    reader = open_reader(path, settings["format"], settings["text_key"],
                         tasks=settings.get("tasks"), tokenizer=tok)
    batch_texts: list[str] = []
    batch_splits: list[str] = []
    batch_chars = 0
    reported_bytes = 0

    def flush() -> None:
        nonlocal batch_chars, reported_bytes
        n_tok = 0
        if batch_texts:
            for split, ids in zip(batch_splits, tok.encode_batch(batch_texts)):
                writers.add(split, ids)
                tokens[split] += len(ids)
                n_tok += len(ids)
        if progress is not None:
            progress(reader.bytes_done - reported_bytes, len(batch_texts), n_tok)
            reported_bytes = reader.bytes_done
        batch_texts.clear()
        batch_splits.clear()
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
            text, set_name = rec
            if set_name is not None:
                by_set[set_name] += 1
            if filtering:
                if set_name is None:
                    count_bad(Bad("missing_set_name", f"{path} (document {stats_read})",
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
            written[split] += 1
            batch_chars += len(text)
            if batch_chars >= BATCH_CHARS or len(batch_texts) >= BATCH_DOCS:
                flush()
        flush()
        writers.commit()
    except BaseException:
        writers.discard()
        raise

    record = {
        "input": {"path": path, "size": size, "sha256": sha256_file(path)},
        "key": entry["key"],
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
    write_json_atomic(done_path(out_dir, name, entry["key"]), record)
    return record
