"""The checks of evaluation options, one home each. Each is the `check` of a job field (eval/jobs.py,
through lenext_dist/flags.py): `lenext eval`'s argparse `type=` (a bad value exits 2 with "argument
--flag: ..." before any model loads) and the check of a job built in code (the parsed value or a
string, the same message). A choice among names is flags.choice; the number checks every command
shares (int_, float_, pos_int, nonneg_int, pos_float: finite, in range) are flags.py's too."""
from __future__ import annotations

import argparse
from typing import Sequence

from lenext_dist.dtypes import CHOICES
from lenext_dist.flags import float_, int_, pos_int
from lenext_dist.prep.tasks import TASKS

DTYPES = CHOICES  # fp32/bf16/fp16 and torch's float32/bfloat16/float16 (lenext_dist/dtypes.py)

ROPE_SCALINGS = ("none", "pi", "ntk", "yarn")
PROTOCOLS = ("last-stride", "yarn", "full")  # the perplexity protocols of eval/ppl.py


def entropy_length(s) -> int:
    """--length of `lenext eval entropy`: a window of one token has one visible key, entropy 0
    by definition, and no positions to bin (eval/entropy.py summarize_entropy)."""
    v = int_(s)
    if v < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2 (a window of one token has nothing to "
                                         f"measure), got {v}")
    return v


def ints(s) -> list[int]:
    """'2048,4096' (or [2048, 4096]) -> [2048, 4096]: a non-empty list of lengths > 0."""
    items = s.replace(" ", "").split(",") if isinstance(s, str) else list(s)
    out = [pos_int(x) for x in items if x != ""]
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of lengths > 0")
    return out


def depths(s) -> str:
    """'N' (N >= 1 evenly spaced depths) or a list of depths in [0, 1]; kept as written."""
    from .passkey import parse_depths

    s = s if isinstance(s, str) else ",".join(map(str, s)) if isinstance(s, Sequence) else str(s)
    try:
        d = parse_depths(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or a list of depths in [0, 1], got {s!r}") from None
    if not d or not all(0.0 <= x <= 1.0 for x in d):
        raise argparse.ArgumentTypeError(f"needs at least one depth, each in [0, 1], got {s!r}")
    return s


def paths(s) -> list[str]:
    """--data: one or more files, globs or folders."""
    return [str(x) for x in ([s] if isinstance(s, str) else s)]


TASK_NAMES = tuple(TASKS)  # the task generators' registry is the list


def task_names(s) -> list[str]:
    """'passkey,repeat' (or a list): task generators of lenext_dist/prep/tasks.py."""
    items = s.replace(" ", "").split(",") if isinstance(s, str) else list(s)
    out = [x for x in items if x != ""]
    bad = [x for x in out if x not in TASK_NAMES]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"expected tasks from {', '.join(TASK_NAMES)}, got {s!r}")
    return out


def temperature_section(s) -> dict:
    """'KIND[:key=value,...]' -> the attention.temperature section it names, e.g.
    'llama4:floor_scale=64,attn_scale=0.1' -> {kind: llama4, floor_scale: 64.0, attn_scale: 0.1};
    checked by the registry (lenext_dist/attention/temperature.py)."""
    from lenext_dist.attention.temperature import check

    kind, _, rest = str(s).partition(":")
    section: dict = {"kind": kind.strip()}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"expected KIND[:key=value,...], got {s!r}")
        key = key.strip()
        try:
            section[key] = value.strip() if key == "layers" else float_(value)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{key}: {e}") from None
    try:
        check(section)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return section


def temperature(s) -> str:
    """--temperature: the spec as written, once `temperature_section` accepts it."""
    temperature_section(s)
    return str(s)
