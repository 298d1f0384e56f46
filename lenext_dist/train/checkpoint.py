"""DeepSpeed checkpoints with an atomic `latest`, keep-last-K retention and full RNG state.

Layout of checkpoint.dir:
    step_0000100/    DeepSpeed's files (model, ZeRO optimizer partitions) + config.yaml + COMPLETE
    latest           the tag of the newest complete checkpoint (written last, by os.replace)

A crash (even kill -9) while step_N is being written leaves `latest` naming the previous tag, so
resume never sees a partial checkpoint; the partial folder is overwritten when step N comes again.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from lenext_dist.config import RunConfig, save_config

LATEST = "latest"
COMPLETE = "COMPLETE"


def tag_for(step: int) -> str:
    return f"step_{step:07d}"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(engine, cfg: RunConfig, step: int, consumed_samples: int, extra: Optional[dict] = None) -> str:
    """Save on all ranks; rank 0 then marks it complete, moves `latest` and prunes old ones."""
    root = Path(cfg.checkpoint.dir)
    tag = tag_for(step)
    client = {"step": step, "consumed_samples": consumed_samples, "rng": rng_state(),
              **(extra or {})}
    engine.save_checkpoint(str(root), tag=tag, client_state=client, save_latest=False)
    dist.barrier()  # every rank's shard is on disk before `latest` may point at it
    if dist.get_rank() == 0:
        save_config(cfg, root / tag / "config.yaml")
        _atomic_write(root / tag / COMPLETE, f"{step}\n")
        _atomic_write(root / LATEST, tag + "\n")
        _prune(root, cfg.checkpoint.keep_last)
    dist.barrier()
    return tag


def _prune(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    tags = sorted(p for p in root.glob("step_*") if (p / COMPLETE).exists())
    for old in tags[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_tag(root: str | os.PathLike) -> Optional[str]:
    """Tag named by `latest` if that checkpoint is complete, else None."""
    f = Path(root) / LATEST
    if not f.is_file():
        return None
    tag = f.read_text().strip()
    if not (Path(root) / tag / COMPLETE).is_file():
        raise RuntimeError(f"{f} names {tag}, which is not a complete checkpoint; "
                           f"point it at a complete step_* folder or remove it")
    return tag


def resolve(path: str) -> tuple[str, str]:
    """`dir` (uses its latest) or `dir/step_N` -> (dir, tag)."""
    p = Path(path)
    if (p / COMPLETE).is_file():
        return str(p.parent), p.name
    tag = latest_tag(p)
    if tag is None:
        raise FileNotFoundError(f"{path}: no complete checkpoint (no `latest` file and no COMPLETE marker)")
    return str(p), tag


def load(engine, root: str, tag: str) -> dict:
    """Full resume: module, optimizer and our client state (step, samples, RNG)."""
    _, client = engine.load_checkpoint(root, tag=tag, load_optimizer_states=True,
                                       load_lr_scheduler_states=False)
    if client is None:
        raise RuntimeError(f"{root}/{tag}: DeepSpeed could not load this checkpoint")
    set_rng_state(client["rng"])
    return client


def load_weights(engine, path: str) -> str:
    """Start a new run from another run's weights (HeadScale): module only, non-strict so that
    parameters the source never had (the head scales) keep their fresh initialization."""
    root, tag = resolve(path)
    loaded, _ = engine.load_checkpoint(root, tag=tag, load_module_only=True, load_module_strict=False,
                                       load_optimizer_states=False, load_lr_scheduler_states=False)
    if loaded is None:
        raise RuntimeError(f"{path}: DeepSpeed could not load weights from {root}/{tag}")
    return f"{root}/{tag}"
