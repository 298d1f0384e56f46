"""On-disk bookkeeping of a sharding run: the plan, done-records, and the final manifest.

Layout under `--out`:
  <name>.parts/plan.json              inputs (sorted, with size + mtime), units, settings
  <name>.parts/lock                   flock'ed by every run (see lock.py)
  <name>.parts/<key>.<split>.bin/.idx  one partial shard per unit of work and split
  <name>.parts/<key>.done.json         written last, atomically: the unit is finished
  <name>_<split>.bin/.idx              merged output, one prefix per split
  <name>.manifest.json                 inputs, counts, tokenizer, commands, checksums

All JSON is written to a temporary name and renamed (os.replace is atomic on POSIX),
so a kill at any moment leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from typing import Iterable, Optional

from lenext_dist.atomic import atomic_write

from .errors import PrepError

PLAN_VERSION = 2  # 2: units finer than a file, input size + mtime recorded
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


# The longest file name made from --name is <name>_valid_answers.tmp-<host>-<pid>.idx (39 more
# characters); file systems allow 255 bytes, and the name is ASCII (_NAME_RE).
MAX_NAME = 200


def check_name(name: str) -> None:
    """--name becomes file names directly under --out: it must not leave that directory, and
    must leave room for the suffixes within a file name's 255 bytes."""
    if not _NAME_RE.fullmatch(name) or ".." in name:
        raise PrepError(
            f"--name {name!r} is not a plain file-name prefix (letters, digits, '.', '_', '+', "
            "'-'; no '/' or '..'): outputs must stay inside --out. Pick e.g. --name slimpajama"
        )
    if len(name) > MAX_NAME:
        raise PrepError(f"--name {name[:40]}... ({len(name)} characters): too long for the file "
                        f"names under --out; use at most {MAX_NAME} characters")


def write_json_atomic(path: str, obj) -> None:
    # No fsync: the promise is safety against a killed process (the page cache survives
    # kill -9), and fsync per input file cost ~5% of throughput.
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str) -> dict:
    """A plan, done-record or manifest; a damaged one is a PrepError naming it."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except ValueError as e:  # not UTF-8, or not JSON
        data = e
    if not isinstance(data, dict):
        raise PrepError(f"{path}: damaged (not a JSON object: {str(data)[:120]}); delete it, or "
                        "the whole <name>.parts folder to start over, and run the step again")
    return data


def parts_dir(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"{name}.parts")


def plan_path(out_dir: str, name: str) -> str:
    return os.path.join(parts_dir(out_dir, name), "plan.json")


def manifest_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"{name}.manifest.json")


def output_prefix(out_dir: str, name: str, split: str) -> str:
    return os.path.join(out_dir, f"{name}_{split}")


ANSWERS_SUFFIX = "_answers"


def answers_prefix(prefix: str) -> str:
    """The answer mask beside the shard `prefix` (generated task documents only): a megatron
    indexed dataset of uint8 with the shard's document lengths, 1 on answer tokens (the tokens
    `data.task_loss: answers` trains on)."""
    return prefix + ANSWERS_SUFFIX


def shard_manifest(prefix: str) -> Optional[tuple[str, dict]]:
    """(path, manifest) of the run that wrote the merged shard `prefix` (<out>/<name>_<split>),
    when its manifest lies beside it and lists that split; else None (a shard copied alone)."""
    name, _, split = os.path.basename(prefix).rpartition("_")
    path = manifest_path(os.path.dirname(prefix), name)
    try:
        manifest = read_json(path) if name else None
    except (OSError, PrepError):  # none, or damaged: as a shard copied alone
        return None
    return (path, manifest) if isinstance(manifest, dict) and split in manifest.get("outputs", {}) else None


def input_key(path: str) -> str:
    """A file-name-safe key for one input: readable basename + hash of the full path
    (SlimPajama repeats basenames across chunk directories)."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(path))[:80]
    return f"{hashlib.sha1(path.encode('utf-8')).hexdigest()[:12]}-{base}"


def partial_prefix(out_dir: str, name: str, key: str, split: str) -> str:
    return os.path.join(parts_dir(out_dir, name), f"{key}.{split}")


def done_path(out_dir: str, name: str, key: str) -> str:
    return os.path.join(parts_dir(out_dir, name), f"{key}.done.json")


def settings_fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def make_plan(name: str, inputs: list[str], settings: dict, tokenizer: dict) -> dict:
    from .units import plan_units, stat_of

    files = [{"path": p, "key": input_key(p), **stat_of(p)} for p in inputs]
    return {
        "version": PLAN_VERSION,
        "name": name,
        "inputs": files,
        "units": plan_units(files, settings["format"]),
        "settings": settings,
        "tokenizer": tokenizer,
        "fingerprint": settings_fingerprint(
            {"settings": settings, "tokenizer_sha256": tokenizer["sha256"], "inputs": inputs}
        ),
    }


def write_or_check_plan(out_dir: str, name: str, plan: dict) -> None:
    """Every task of a run computes the same plan; a different one means the user changed
    inputs or settings under an existing --out, which would silently mix two runs."""
    path = plan_path(out_dir, name)
    if os.path.exists(path):
        old = read_json(path)
        if old.get("version") != PLAN_VERSION:
            raise PrepError(
                f"{path!r} was written by another version of `lenext prep` (plan version "
                f"{old.get('version')}, this one reads {PLAN_VERSION}). Delete "
                f"{parts_dir(out_dir, name)!r} to start over, or use another --out."
            )
        if old.get("fingerprint") != plan["fingerprint"]:
            diff = [k for k in ("settings", "tokenizer") if old.get(k) != plan.get(k)]
            old_in = [i["path"] for i in old.get("inputs", [])]
            new_in = [i["path"] for i in plan["inputs"]]
            if old_in != new_in:
                diff.append(f"inputs ({len(old_in)} before, {len(new_in)} now)")
            raise PrepError(
                f"{out_dir!r} already holds a run of {name!r} with different "
                f"{', '.join(diff) or 'settings'}. Use another --out or --name, or delete "
                f"{parts_dir(out_dir, name)!r} (and the {name}_* outputs) to start over."
            )
        check_inputs_unchanged(old, out_dir)
        return
    # a new run whose name a finished one holds (its .parts removed by --remove-parts or by
    # hand): its merge would replace those shards and manifest, and leave a split it does not
    # make (a valid set of other data) beside them as if it were its own
    earlier = [p for p in [manifest_path(out_dir, name)] + [output_prefix(out_dir, name, s) + ".bin"
                                                             for s in ("train", "valid")] if os.path.exists(p)]
    if earlier:
        raise PrepError(f"{out_dir!r} already holds shards of a finished run named {name!r} "
                        f"({os.path.basename(earlier[0])}); use another --out or --name, or delete "
                        f"its {name}_* files and {name}.manifest.json to replace them")
    write_json_atomic(path, plan)


def check_inputs_unchanged(plan: dict, out_dir: str, missing_ok: bool = False) -> None:
    """Refuse to continue (or merge) a run whose inputs changed after it began: finished
    units hold tokens of the old bytes, so the output would mix two versions of the data."""
    for f in plan["inputs"]:
        try:
            st = os.stat(f["path"])
        except FileNotFoundError:
            if missing_ok:
                continue
            now = "it is gone"
        else:
            if (st.st_size, st.st_mtime_ns) == (f["size"], f["mtime_ns"]):
                continue
            now = f"size {f['size']} -> {st.st_size}, mtime changed" if st.st_size != f["size"] \
                else "same size, but modified since (mtime changed)"
        raise PrepError(
            f"input {f['path']!r} changed after the run in {out_dir!r} began ({now}): its "
            "finished parts would be stale. Restore the file, or start over: delete "
            f"{parts_dir(out_dir, plan['name'])!r} (and the {plan['name']}_* outputs) or use "
            "another --out."
        )


def load_plan(out_dir: str, name: str) -> dict:
    path = plan_path(out_dir, name)
    if not os.path.exists(path):
        raise PrepError(
            f"no plan at {path!r}: run the shard step (lenext prep --input ... "
            f"--out {out_dir} --name {name}) before merge"
        )
    return read_json(path)


def load_done(out_dir: str, name: str, unit: dict, fingerprint: str) -> Optional[dict]:
    """The done-record of a unit if it is finished under this plan, else None."""
    path = done_path(out_dir, name, unit["key"])
    if not os.path.exists(path):
        return None
    rec = read_json(path)
    if rec.get("fingerprint") != fingerprint:
        return None
    return rec


def sum_counts(records: Iterable[dict], field: str) -> dict:
    total: Counter = Counter()
    for r in records:
        total.update(r.get(field, {}))
    return dict(sorted(total.items()))


def build_manifest(plan: dict, records: list[dict], outputs: dict, commands: list[str]) -> dict:
    """The manifest promised to users: every document read is accounted for as written
    (per split) or skipped (per reason). `records` are the units' done-records in plan order."""
    docs_read = sum(r["docs_read"] for r in records)
    written = sum_counts(records, "docs_written")
    skipped = sum_counts(records, "skipped")
    return {
        "name": plan["name"],
        "commands": commands,
        # without skip_bad: the plan keeps it False for every run (runner._fingerprinted);
        # what was skipped, and why, is documents.skipped
        "settings": {k: v for k, v in plan["settings"].items() if k != "skip_bad"},
        "tokenizer": plan["tokenizer"],
        "inputs": _per_input(plan, records),
        "documents": {
            "read": docs_read,
            "written": written,
            "skipped": skipped,
            "read_by_set": sum_counts(records, "docs_by_set"),
        },
        "tokens": sum_counts(records, "tokens"),
        "outputs": outputs,
    }


def _per_input(plan: dict, records: list[dict]) -> list[dict]:
    """Unit records summed per input file (a file's first unit carries its sha256)."""
    by_input: dict = {}
    for unit, r in zip(plan["units"], records):
        by_input.setdefault(unit["input"], []).append(r)
    out = []
    for i, f in enumerate(plan["inputs"]):
        recs = by_input.get(i, [])
        out.append({
            "path": f["path"],
            "size": f["size"],
            "sha256": next((r["input"]["sha256"] for r in recs if "sha256" in r["input"]), None),
            "units": len(recs),
            "docs_read": sum(r["docs_read"] for r in recs),
            "docs_written": sum_counts(recs, "docs_written"),
            "skipped": sum_counts(recs, "skipped"),
            "problems": [p for r in recs for p in r.get("problems", [])][:20],
        })
    return out
