"""Merge per-input partial shards into one megatron prefix per split, and write the manifest.

Partials are concatenated with megatron's own `IndexedDatasetBuilder.add_index` (loaded
without the megatron.core package: mcore_io.py) in the plan's order of units (sorted input
files, each file's units in file order), which is what makes the output independent of the number of
workers and Slurm tasks. Outputs are written under temporary names and renamed, so a
killed merge leaves no half-written `<name>_<split>.bin`.
"""

from __future__ import annotations

import gc
import glob
import os
import shutil
import sys

import numpy as np

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
from .mcore_io import indexed_dataset
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


def _concatenate(IndexedDatasetBuilder, parts: list[str], prefix: str, dtype) -> None:
    """Concatenate the partial shards `parts` (in order) into `prefix`.bin/.idx (atomically)."""
    tmp = f"{prefix}.tmp-{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=dtype)
    # add_index calls gc.collect() once per partial, which walks every live object
    # (~0.25 s with torch imported: hours for SlimPajama's ~60K files). Freezing the
    # existing objects first makes each collection only look at new ones.
    gc.freeze()
    try:
        for part in parts:
            builder.add_index(part)
        builder.finalize(tmp + ".idx")
    except BaseException:
        try:
            builder.data_file.close()
        except OSError:  # the final flush fails again on a full disk
            pass
        for ext in (".bin", ".idx"):
            if os.path.exists(tmp + ext):
                os.remove(tmp + ext)
        raise
    finally:
        gc.unfreeze()
    for ext in (".bin", ".idx"):
        os.replace(tmp + ext, prefix + ext)


def _merge(out_dir: str, name: str, command: str, remove_parts: bool, plan: dict) -> dict:
    IndexedDatasetBuilder = indexed_dataset().IndexedDatasetBuilder
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
    for stale in glob.glob(os.path.join(out_dir, glob.escape(name) + "_*.tmp-*")):
        os.remove(stale)  # left by a killed merge
    outputs = {}
    answers = plan["settings"]["format"] == "tasks"  # generated documents carry answer masks
    for split in splits_for(plan["settings"]):
        prefix = output_prefix(out_dir, name, split)
        parts = [partial_prefix(out_dir, name, unit["key"], split) for unit in plan["units"]]
        _concatenate(IndexedDatasetBuilder, parts, prefix, dtype)
        if answers:
            _concatenate(IndexedDatasetBuilder, [answers_prefix(p) for p in parts],
                         answers_prefix(prefix), np.uint8)
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
