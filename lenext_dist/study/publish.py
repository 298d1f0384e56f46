"""Publish a study into the repository: STUDY.md and exactly the files it cites.

The results folder (`results/study/`: models, checkpoints, logs) is far too large to version, but
STUDY.md must stay traceable: every number names the JSON it came from and every figure is a PNG
drawn from `summary.json`. `publish` copies STUDY.md, the summary/plan/timings JSON and every
file STUDY.md cites (backticked paths and image links, relative to the results folder) to
`dest` with the same relative paths, so the links of the published copy resolve.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

ALWAYS = ("summary.json", "plan.json", "timings.json")
# `eval/nope-s1/ppl_last-stride.json`, ![fig1](fig1_loss_entropy.png)
_CITED = re.compile(r"`([\w./-]+\.(?:json|jsonl|npz|png))`|!\[[^\]]*\]\(([\w./-]+)\)")


def cited_files(markdown: str) -> list[str]:
    """Relative paths cited by a STUDY.md, in order of first mention, without duplicates."""
    seen: dict[str, None] = {}
    for m in _CITED.finditer(markdown):
        seen.setdefault(m.group(1) or m.group(2), None)
    return list(seen)


PUBLISHED = "docs/study"
"""Where the full study is published in the repository (the code is lenext_dist/study, its
configs configs/study, its working output results/study)."""


def publish(out: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Copy out/STUDY.md + ALWAYS + the files it cites to dest (emptied first).
    Returns (copied, missing) relative paths; a cited path outside `out` is refused."""
    out, dest = Path(out).resolve(), Path(dest)
    md = (out / "STUDY.md").read_text()
    if dest.exists():
        shutil.rmtree(dest)
    copied, missing = [], []
    for rel in ["STUDY.md", *ALWAYS, *cited_files(md)]:
        src = (out / rel).resolve()
        if out not in src.parents:
            raise ValueError(f"STUDY.md cites {rel!r}, outside {out}")
        if not src.is_file():
            missing.append(rel)
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / rel)
        copied.append(rel)
    return copied, missing
