"""Slurm hostlists (`gpu[01-03,07],login1`) and DeepSpeed hostfiles.

`expand()` knows the syntax Slurm prints: comma-separated items, each with any number of bracket
groups of numbers and zero-padded ranges (`n[001-004]`, `rack[1-2]-n[1-3]`); `hostnames()` hands
anything else to `scontrol show hostnames`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Optional, Sequence

from lenext_dist.cluster import ClusterError


EXAMPLE = "gpu[001-004]"


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ClusterError("unbalanced ']'")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ClusterError("unbalanced '['")
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _expand_range(spec: str) -> list[str]:
    vals: list[str] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise ClusterError(f"bad range {part!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ClusterError(f"descending range {part!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        vals.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return vals


def _expand_item(item: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if not m:
        if "[" in item or "]" in item:
            raise ClusterError(f"bad brackets in {item!r}")
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    return [head + v + rest for v in _expand_range(m.group(1)) for rest in _expand_item(tail)]


def _expand(nodelist: str) -> list[str]:
    hosts: list[str] = []
    for item in _split_top(nodelist):
        hosts.extend(_expand_item(item))
    return hosts


def expand(nodelist: str) -> list[str]:
    """Expand a Slurm hostlist expression the way `scontrol show hostnames` does (order kept)."""
    try:
        return _expand(nodelist)
    except ClusterError as e:
        raise ClusterError(f"hostlist {nodelist!r}: {e}") from None


def hostnames(nodelist: Optional[str] = None, use_scontrol: bool = True) -> list[str]:
    """Hosts of `nodelist` (default: $SLURM_JOB_NODELIST, else $SLURM_NODELIST). Our own expansion
    first (no subprocess; scontrol can stall a minute retrying a missing slurm.conf); syntax it does
    not know goes to `scontrol show hostnames`. A bad hostlist is a ClusterError naming where it
    came from (the argument, or the environment variable)."""
    where = f"NODELIST {nodelist!r}"
    if not nodelist:
        env = next((k for k in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if os.environ.get(k)), "")
        if not env:
            raise ClusterError("no NODELIST given and SLURM_JOB_NODELIST is not set (not inside a Slurm "
                               f"job?): give the hosts, e.g. {EXAMPLE!r}")
        nodelist = os.environ[env]
        where = f"{env}={nodelist!r}"
    try:
        return _expand(nodelist)
    except ClusterError as e:
        ours = str(e)
    if not (use_scontrol and shutil.which("scontrol")):
        raise ClusterError(f"{where}: not a Slurm hostlist ({ours}); e.g. {EXAMPLE!r}") from None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=15, check=True).stdout.split()
    except (subprocess.SubprocessError, OSError) as e:
        why = f"exit status {e.returncode}" if isinstance(e, subprocess.CalledProcessError) else e
        raise ClusterError(f"{where}: not a Slurm hostlist ({ours}; scontrol: {why}); e.g. {EXAMPLE!r}") from None
    if not out:
        raise ClusterError(f"{where}: scontrol expanded it to nothing")
    return out


def hostfile(hosts: Sequence[str], slots: int) -> str:
    """DeepSpeed/OpenMPI hostfile text: one `host slots=N` line per host."""
    if slots < 1:
        raise ClusterError(f"--slots {slots}: must be >= 1 (the ranks per host)")
    if not hosts:
        raise ClusterError("no hosts")
    return "".join(f"{h} slots={slots}\n" for h in hosts)
