"""On-disk bookkeeping of a sharding run: the plan, done-records, and the final manifest.

Layout under `--out`:
  <name>.parts/plan.json              inputs (sorted) + settings, shared by all tasks
  <name>.parts/<key>.<split>.bin/.idx  one partial shard per input file and split
  <name>.parts/<key>.done.json         written last, atomically: the input is finished
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

from .errors import PrepError

PLAN_VERSION = 1


def write_json_atomic(path: str, obj) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    # No fsync: the promise is safety against a killed process (the page cache survives
    # kill -9), and fsync per input file cost ~5% of throughput.
    os.replace(tmp, path)


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def parts_dir(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"{name}.parts")


def plan_path(out_dir: str, name: str) -> str:
    return os.path.join(parts_dir(out_dir, name), "plan.json")


def manifest_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"{name}.manifest.json")


def output_prefix(out_dir: str, name: str, split: str) -> str:
    return os.path.join(out_dir, f"{name}_{split}")


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
    return {
        "version": PLAN_VERSION,
        "name": name,
        "inputs": [
            {"path": p, "key": input_key(p), "size": os.path.getsize(p)} for p in inputs
        ],
        "settings": settings,
        "tokenizer": tokenizer,
        "fingerprint": settings_fingerprint(
            {"settings": settings, "tokenizer_sha256": tokenizer["sha256"], "inputs": inputs}
        ),
    }


def write_or_check_plan(out_dir: str, name: str, plan: dict) -> None:
    """Every task of a run computes the same plan; a different one means the user changed
    inputs or settings under an existing --out, which would silently mix two runs."""
    os.makedirs(parts_dir(out_dir, name), exist_ok=True)
    path = plan_path(out_dir, name)
    if os.path.exists(path):
        old = read_json(path)
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
        return
    write_json_atomic(path, plan)


def load_plan(out_dir: str, name: str) -> dict:
    path = plan_path(out_dir, name)
    if not os.path.exists(path):
        raise PrepError(
            f"no plan at {path!r}: run the shard step (data_prep/shard.py --input ... "
            f"--out {out_dir} --name {name}) before merge"
        )
    return read_json(path)


def load_done(out_dir: str, name: str, entry: dict, fingerprint: str) -> Optional[dict]:
    """The done-record of an input if it is finished under this plan, else None."""
    path = done_path(out_dir, name, entry["key"])
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
    (per split) or skipped (per reason)."""
    docs_read = sum(r["docs_read"] for r in records)
    written = sum_counts(records, "docs_written")
    skipped = sum_counts(records, "skipped")
    return {
        "name": plan["name"],
        "commands": commands,
        "settings": plan["settings"],
        "tokenizer": plan["tokenizer"],
        "inputs": [
            {
                "path": r["input"]["path"],
                "size": r["input"]["size"],
                "sha256": r["input"]["sha256"],
                "docs_read": r["docs_read"],
                "docs_written": r["docs_written"],
                "skipped": r["skipped"],
                "problems": r.get("problems", []),
            }
            for r in records
        ],
        "documents": {
            "read": docs_read,
            "written": written,
            "skipped": skipped,
            "read_by_set": sum_counts(records, "docs_by_set"),
        },
        "tokens": sum_counts(records, "tokens"),
        "outputs": outputs,
    }
