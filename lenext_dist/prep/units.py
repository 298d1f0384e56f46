"""Units of work finer than a file, so one big input still keeps every worker busy.

  .jsonl     byte ranges of `unit_bytes`; a unit owns every line that STARTS in its range
             (it skips the partial line it lands in and reads past its end to finish its
             last line), so the ranges tile the file's lines exactly once.
  .parquet   one unit per row group (the format's own unit of independent decoding).
  .jsonl.zst one unit per file: a zstd stream cannot be entered in the middle (SlimPajama's
             ~60K files of ~15 MB are fine-grained already).
  .txt       one unit per file (a file is one document).
  --format tasks: one unit per input file, whatever its kind (the generators draw filler from the
             whole file and seed by its sha256: tasks.py).

Units depend only on the input files (sizes, row groups) and `unit_bytes`, which is a
function of the total input size alone, never of --workers or --num-tasks: the plan, the
partials and the merged bytes are the same for any parallelism. Merging in plan order
(file by file, unit by unit) restores the file order of documents.
"""

from __future__ import annotations

import os

MIN_UNIT = 1 << 20  # 1 MiB: ~30 long documents; finer costs more files than it balances
MAX_UNIT = 64 << 20  # at most ~16K units per TB: a plan.json and parts/ that stay listable
UNITS_TARGET = 256  # aim for this many units over the whole input (capped by the above)


def unit_bytes(total: int) -> int:
    """Byte-range size for a corpus of `total` bytes (a pure function of the inputs)."""
    want = total // UNITS_TARGET
    return max(MIN_UNIT, min(MAX_UNIT, want >> 20 << 20))


def split_file(path: str, fmt: str, size: int, step: int) -> list[dict]:
    """The units of one input file: reader arguments (none for a whole file) + "bytes"."""
    if fmt == "tasks":  # task documents draw filler from the whole file (tasks.py): one unit
        return [{"bytes": size}]
    if fmt == "starcoder":
        import pyarrow.parquet as pq

        try:
            n = pq.ParquetFile(path).metadata.num_row_groups
        except Exception:  # unreadable footer: one unit, whose reader reports the file as bad
            return [{"bytes": size}]
        if n > 1:
            return [{"row_groups": [g, g + 1], "bytes": size // n} for g in range(n)]
    elif path.endswith(".jsonl") and size > step:
        return [{"start": s, "end": min(s + step, size), "bytes": min(step, size - s)}
                for s in range(0, size, step)]
    return [{"bytes": size}]


def plan_units(files: list[dict], fmt: str) -> list[dict]:
    """Units of all files in file order: {"key", "input" (index into files), **reader args}."""
    step = unit_bytes(sum(f["size"] for f in files))
    units = []
    for i, f in enumerate(files):
        parts = split_file(f["path"], fmt, f["size"], step)
        for j, args in enumerate(parts):
            # A whole-file unit keeps the file's key, so its partial names read naturally.
            key = f["key"] if len(parts) == 1 else f"{f['key']}.u{j:05d}"
            units.append({"key": key, "input": i, **args})
    return units


def stat_of(path: str) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
