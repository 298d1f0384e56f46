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
from typing import Callable, Optional

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


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """The model's full fp32 state dict from a checkpoint of any ZeRO stage, on CPU, in one process.

    ZeRO 1-3 keep the exact fp32 master weights in the optimizer partitions: merge them with
    DeepSpeed's zero_to_fp32. Stage 0 has none, and its module file holds the full weights.
    """
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    root, tag = resolve(path)
    folder = Path(root) / tag
    if any(folder.glob("*zero_pp_rank_*_optim_states.pt")):
        state = get_fp32_state_dict_from_zero_checkpoint(root, tag=tag)
    else:
        state = torch.load(folder / "mp_rank_00_model_states.pt", map_location="cpu",
                           weights_only=False)["module"]
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()
            if not k.endswith("._extra_state")}


def load_weights(model: torch.nn.Module, path: str, keep: Callable[[str], bool]) -> str:
    """Start a new run from another run's weights (HeadScale), before DeepSpeed wraps the model.

    Parameters for which keep(name) is true keep their fresh initialization (the head scales,
    which start from the config's value, not from the source); every other parameter must be in
    the checkpoint, so a wrong source fails loudly instead of training from random weights.
    """
    root, tag = resolve(path)
    state = {k: v for k, v in read_weights(path).items() if not keep(k)}
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not keep(k) and not k.endswith("._extra_state")]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"{root}/{tag} does not fit this model: missing {missing[:5]}, "
                           f"unexpected {result.unexpected_keys[:5]} (same model.* shape needed)")
    return f"{root}/{tag}"
