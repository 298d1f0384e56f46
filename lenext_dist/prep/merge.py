"""Merge per-input partial shards into one megatron prefix per split, and write the manifest.

Partials are concatenated into the bytes megatron's own `IndexedDatasetBuilder.add_index`
writes, streamed part by part (_concatenate), in the plan's order of units (sorted input
files, each file's units in file order), which is what makes the output independent of the number of
workers and Slurm tasks. Outputs are written under temporary names and renamed, so a
killed merge leaves no half-written `<name>_<split>.bin`.
"""

from __future__ import annotations

import glob
import os
import shutil
import struct
import sys
import time

import numpy as np

from lenext_dist.atomic import open_new, temp_suffix

from .errors import PrepError
from .lock import RunLock
from .manifest import (
    answers_prefix,
    build_manifest,
    check_inputs_unchanged,
    check_name,
    load_done,
    load_plan,
    manifest_path,
    output_prefix,
    parts_dir,
    partial_prefix,
    write_json_atomic,
)
from .mcore_io import IDX_HEAD, IDX_MAGIC, indexed_dataset
from .tokenizer import sha256_file, token_dtype
from .worker import splits_for


def finished_records(out_dir: str, name: str, plan: dict) -> tuple[list[dict], list[str]]:
    """Done-records of the units in plan order, and the unfinished units' labels."""
    from .worker import unit_label

    records, missing = [], []
    for unit in plan["units"]:
        rec = load_done(out_dir, name, unit, plan["fingerprint"])
        if rec is None:
            missing.append(unit_label(unit, plan["inputs"][unit["input"]]["path"]))
        else:
            records.append(rec)
    return records, missing


def merge(
    out_dir: str,
    name: str,
    command: str,
    remove_parts: bool = False,
    locked: bool = False,
) -> dict:
    """Merge all partials of run `name` in `out_dir`; return the manifest. `locked`: the
    caller (a single-task shard run) already holds the run's lock."""
    check_name(name)
    plan = load_plan(out_dir, name)
    try:
        if locked:
            return _merge(out_dir, name, command, remove_parts, plan)
        with RunLock(parts_dir(out_dir, name), "merge"):
            return _merge(out_dir, name, command, remove_parts, plan)
    except OSError as e:  # disk full while merging: the temporaries are gone already
        raise PrepError(f"merge of {name!r} in {out_dir!r} failed: {e.strerror or e} "
                        f"({e.filename or out_dir}). Free disk space, then rerun merge "
                        "(or the same shard command).") from None


LOG_EVERY = 60.0
"""Seconds between the merge's progress lines."""


def _part_index(prefix: str, dtype, check_bin: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(int32 sequence lengths, int64 document indices) of a partial shard's .idx, memory-mapped
    (megatron's format: mcore_io's IDX_* notes); `check_bin`: its .bin holds what they say."""
    idx = prefix + ".idx"
    with open(idx, "rb") as f:
        head = f.read(IDX_HEAD)
    code = indexed_dataset().DType.code_from_dtype(dtype)
    redo = "delete the run's .parts folder and rerun the shard command"
    if len(head) < IDX_HEAD or head[:9] != IDX_MAGIC or head[17] != code:
        raise PrepError(f"{idx}: not a megatron index of dtype code {code} (a damaged partial): {redo}")
    seqs, docs = struct.unpack("<QQ", head[18:34])

    def mapped(dt, at: int, n: int) -> np.ndarray:  # numpy cannot map 0 bytes
        return np.memmap(idx, dt, "r", offset=at, shape=(n,)) if n else np.zeros(0, dt)

    lengths, documents = mapped(np.int32, IDX_HEAD, seqs), mapped(np.int64, IDX_HEAD + 12 * seqs, docs)
    if check_bin:
        need = int(lengths.sum(dtype=np.int64)) * np.dtype(dtype).itemsize
        if os.path.getsize(prefix + ".bin") != need:  # a crash before the page cache reached the disk
            raise PrepError(f"{prefix}.bin: {os.path.getsize(prefix + '.bin'):,} bytes, its index says "
                            f"{need:,} (cut short): {redo}")
    return lengths, documents


def _concatenate(parts: list[str], prefix: str, dtype) -> None:
    """Concatenate the partial shards `parts` (in order) into `prefix`.bin/.idx (atomically): the
    bytes megatron's IndexedDatasetBuilder.add_index + finalize write (test_prep_shard pins it),
    streamed part by part. The builder holds every document's length and index as a Python
    object and its pointers as a Python list (~130 bytes a document at its peak: 75 GB for
    SlimPajama's 590M documents); this holds one part's arrays at a time."""
    mc = indexed_dataset()
    tmp, itemsize = prefix + temp_suffix(), np.dtype(dtype).itemsize
    try:
        counts = [tuple(map(len, _part_index(p, dtype, check_bin=True))) for p in parts]
        # one pass over the parts per section of the .idx (all lengths, then all pointers, then all
        # document indices), each part's index memory-mapped again rather than held
        with open_new(tmp + ".idx") as f:
            f.write(IDX_MAGIC + struct.pack("<QB", 1, mc.DType.code_from_dtype(dtype)))
            # [S] lengths, [S] byte pointers, [1 + sum(D_i - 1)] document indices (each part's
            # leading 0 dropped, its indices shifted by the sequences before it)
            f.write(struct.pack("<QQ", sum(s for s, _ in counts), 1 + sum(d - 1 for _, d in counts)))
            for p in parts:
                f.write(_part_index(p, dtype)[0].tobytes())
            at = 0
            for p in parts:
                bytes_ = _part_index(p, dtype)[0].astype(np.int64) * itemsize
                f.write((at + np.cumsum(bytes_) - bytes_).tobytes())
                at += int(bytes_.sum())
            f.write(np.zeros(1, np.int64).tobytes())
            before = 0
            for p, (seqs, _) in zip(parts, counts):
                f.write((before + _part_index(p, dtype)[1][1:]).astype(np.int64).tobytes())
                before += seqs
        total, done, last = sum(os.path.getsize(p + ".bin") for p in parts), 0, time.time()
        with open_new(tmp + ".bin") as out:
            for p in parts:
                with open(p + ".bin", "rb") as src:
                    shutil.copyfileobj(src, out, 16 << 20)
                done += os.path.getsize(p + ".bin")
                if time.time() - last >= LOG_EVERY:  # SlimPajama's merge copies ~1 TB
                    last = time.time()
                    print(f"[merge] {os.path.basename(prefix)}.bin: {done / 2**30:,.1f} of "
                          f"{total / 2**30:,.1f} GiB copied", file=sys.stderr, flush=True)
    except BaseException:
        for ext in (".bin", ".idx"):
            if os.path.exists(tmp + ext):
                os.remove(tmp + ext)
        raise
    for ext in (".bin", ".idx"):
        os.replace(tmp + ext, prefix + ext)


def _merge(out_dir: str, name: str, command: str, remove_parts: bool, plan: dict) -> dict:
    # Inputs gone by now are fine (merged on another machine); changed ones are not.
    check_inputs_unchanged(plan, out_dir, missing_ok=True)
    records, missing = finished_records(out_dir, name, plan)
    if missing:
        raise PrepError(
            f"cannot merge {name!r}: {len(missing)} of {len(plan['units'])} units of work are not "
            f"finished (first: {missing[0]!r}). Rerun the shard step (same command; finished "
            "units are not redone) for every --task-index, then merge again."
        )
    dtype = token_dtype(plan["tokenizer"]["vocab_size"])
    answers = plan["settings"]["format"] == "tasks"  # generated documents carry answer masks
    outputs = {}
    for split in splits_for(plan["settings"]):
        prefix = output_prefix(out_dir, name, split)
        # what a killed merge of this run left: its own outputs' temporaries (a glob of name_*
        # took another run's too: kv_lm_train's of a run named kv)
        for p in (prefix, answers_prefix(prefix)):
            for stale in glob.glob(glob.escape(p) + ".tmp-*"):
                os.remove(stale)
        parts = [partial_prefix(out_dir, name, unit["key"], split) for unit in plan["units"]]
        _concatenate(parts, prefix, dtype)
        if answers:
            _concatenate([answers_prefix(p) for p in parts], answers_prefix(prefix), np.uint8)
        print(f"[merge] {os.path.basename(prefix)}: written; hashing it for the manifest", file=sys.stderr,
              flush=True)
        outputs[split] = {
            "prefix": os.path.abspath(prefix),
            "documents": sum(r["docs_written"].get(split, 0) for r in records),
            "tokens": sum(r["tokens"].get(split, 0) for r in records),
            "bin_sha256": sha256_file(prefix + ".bin"),
            "idx_sha256": sha256_file(prefix + ".idx"),
            "bin_bytes": os.path.getsize(prefix + ".bin"),
            **({"answers": os.path.abspath(answers_prefix(prefix))} if answers else {}),
        }
    # Every distinct command that produced part of the data (Slurm tasks, reruns), then ours.
    commands = sorted({r["command"] for r in records if r.get("command")})
    if command not in commands:
        commands.append(command)
    manifest = build_manifest(plan, records, outputs, commands)
    # megatron's IndexedDataset cannot memory-map an empty .bin: say so now, not at training.
    manifest["warnings"] = [
        f"{o['prefix']} has no documents (megatron cannot load an empty shard)"
        for o in outputs.values() if o["documents"] == 0
    ]
    for w in manifest["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    write_json_atomic(manifest_path(out_dir, name), manifest)
    if remove_parts:
        shutil.rmtree(parts_dir(out_dir, name))
    return manifest
