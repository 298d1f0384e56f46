"""Names of a checkpoint folder and how a complete step is found in it.

Layout of checkpoint.dir (written by lenext_dist/train/checkpoint.py):
    step_0000100/    DeepSpeed's files (model, ZeRO optimizer partitions) + config.yaml + COMPLETE
    latest           the tag of the newest complete checkpoint (written last, by os.replace)

A step folder counts only with its COMPLETE marker, and `latest` is moved only after it, so a
reader never sees a partial save. No torch here: cluster job scripts read this on login nodes.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from lenext_dist.config import RunConfig, load_config
from lenext_dist.errors import CheckpointError

LATEST = "latest"
COMPLETE = "COMPLETE"
CONFIG = "config.yaml"  # the resolved RunConfig the step was written with
FROZEN_FP32 = "fp32_frozen"
"""Client-state key of the exact fp32 values of frozen fp32 parameters (train/fp32_params.frozen):
the module file holds them in the training dtype."""


_TAG = re.compile(r"step_(\d+)")


def tag_for(step: int) -> str:
    return f"step_{step:07d}"


def step_of(tag: str) -> Optional[int]:
    """The step a tag names (tag_for's inverse); None for a name that is not a step tag."""
    m = _TAG.fullmatch(tag)
    return int(m.group(1)) if m else None


def latest_tag_name(root: Path) -> Optional[str]:
    """The tag `latest` names, complete or not (None without a `latest` file)."""
    f = root / LATEST
    # bytes that are not text (a damaged file) read as U+FFFD: latest_tag then refuses the name
    return f.read_bytes().decode("utf-8", "replace").strip() if f.is_file() else None


def latest_tag(root: str | os.PathLike) -> Optional[str]:
    """Tag named by `latest` if that checkpoint is complete, else None."""
    f = Path(root) / LATEST
    tag = latest_tag_name(Path(root))
    if tag is None:
        return None
    if not tag or not tag.isprintable() or len(tag) > 255 or "/" in tag or tag in (".", ".."):
        raise CheckpointError(f"{f}: not a checkpoint tag (damaged? it holds {tag[:40]!r}); write "
                              "the name of a complete step_* folder into it, or remove it")
    if not (Path(root) / tag / COMPLETE).is_file():
        raise CheckpointError(f"{f} names {tag}, which is not a complete checkpoint; "
                              f"point it at a complete step_* folder or remove it")
    return tag


def resolve(checkpoint: str | os.PathLike, tag: Optional[str] = None) -> Path:
    """A checkpoint folder (+ tag, or its `latest`) or a step_* folder -> the complete step folder."""
    p = Path(checkpoint)
    if tag is not None:
        step = p / tag
    elif (p / COMPLETE).is_file() or any(p.glob("*model_states.pt")):
        step = p
    elif (p / LATEST).is_file():
        step = p / latest_tag(p)
    else:
        raise CheckpointError(f"{p}: neither a checkpoint folder with a `latest` file nor a step_* "
                              "folder (name a step_NNNNNNN folder)")
    if not step.is_dir():
        raise CheckpointError(f"{step}: no such checkpoint")
    if not (step / COMPLETE).is_file():
        raise CheckpointError(f"{step}: no COMPLETE marker (a partial save?); choose another step")
    return step


def saved_config(step_dir: str | os.PathLike) -> RunConfig:
    """The resolved config a checkpoint was written with (its config.yaml): the whole run's,
    train.stages included (what a resume compares itself with)."""
    f = Path(step_dir) / CONFIG
    if not f.is_file():
        raise CheckpointError(f"{step_dir}: no config.yaml (not written by lenext_dist.train?)")
    return load_config(f)


def run_config(step_dir: str | os.PathLike) -> RunConfig:
    """The config the weights of this checkpoint were trained with: under train.stages, the
    stage of its last trained step (step N holds the weights after steps 0..N-1, so a boundary
    checkpoint is its earlier stage's: that stage's length and RoPE base, which an export must
    carry); else saved_config."""
    from lenext_dist.config import stages

    cfg = saved_config(step_dir)
    step = step_of(Path(step_dir).name)
    if not cfg.train.stages or step is None:
        return cfg
    return stages.stage_config(cfg, stages.index_at(cfg, max(step - 1, 0)))
