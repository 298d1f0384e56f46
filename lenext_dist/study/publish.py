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

from lenext_dist.errors import UserError


class PublishError(UserError, ValueError):
    """A results file (STUDY.md, regime.json) names a path outside its folder."""

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


def inside(root: Path, rel: str, what: str) -> Path:
    """`root / rel` resolved, refused (PublishError) unless it lies under `root`: a path a results
    file names must not reach out of its folder (`../x`, `/etc/x`, a symlink out)."""
    root = Path(root).resolve()
    path = (root / rel).resolve()
    if root not in path.parents:
        raise PublishError(f"{what} names {rel!r}, outside {root}; nothing was published")
    return path


def publish(out: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Copy out/STUDY.md + ALWAYS + the files it cites to dest, replacing it.
    Returns (copied, missing) relative paths. Every cited path is checked (one outside `out` is
    refused) and copied to a sibling folder first; only then is `dest` replaced by it."""
    out, dest = Path(out).resolve(), Path(dest)
    md = (out / "STUDY.md").read_text()
    rels = ["STUDY.md", *ALWAYS, *cited_files(md)]
    srcs = {rel: inside(out, rel, "STUDY.md") for rel in rels}
    stage = dest.with_name(f".{dest.name}.publishing")
    if stage.exists():
        shutil.rmtree(stage)
    copied, missing = [], []
    for rel in rels:
        if not srcs[rel].is_file():
            missing.append(rel)
            continue
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(srcs[rel], stage / rel)
        copied.append(rel)
    if dest.exists():
        shutil.rmtree(dest)
    stage.rename(dest)
    return copied, missing
