"""The HeadScale search of `lenext extend`: its `RunConfig` (the base run's, with the search's
changes), validated here before anything is launched, written as the config file of a
training launch on N ranks (lenext_dist.train.launch's command, as `lenext train --nproc N`)."""
from __future__ import annotations

import json
import math
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional

from lenext_dist.config import RunConfig, load_config, save_config
from lenext_dist.errors import UserError
from lenext_dist.train.launch import launch_command, launcher_status


def search_length(target: int, overshoot: float) -> int:
    """L' a little past the target, a multiple of 8 (paper: 18K for 16K)."""
    return int(math.ceil(target * overshoot / 8) * 8)


def _dotted(d: dict, prefix: str = "") -> list[str]:
    """{"a": {"b": 1}} -> ["a.b=1"] (values as JSON, which the override parser reads as YAML)."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _dotted(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={json.dumps(v)}")
    return out


def search_config(ckpt: Path, run_dir: Path, *, target: int, init: float, steps: int, lr: float,
                  warmup: int, global_batch: int, micro_batch: int, overshoot: float,
                  min_value: Optional[float], zero_stage: int,
                  activation_checkpointing: bool, data: Optional[dict] = None) -> RunConfig:
    """The search's config: the config the checkpoint's weights were trained with (under
    train.stages, the stage of its last step, as one stage: its length, RoPE base and blend) with
    these changes, through the same strict loader as any run (a bad value is a one-line
    ConfigError here, not in the child). data: other `data.*` keys (e.g. a blend of documents of
    the target length, a seed)."""
    from lenext_dist.checkpoint.layout import run_config

    base = run_config(ckpt)
    base = replace(base, train=replace(base.train, stages=[]))  # the search is one stage of its own
    changes = {
        "name": run_dir.name, "run_dir": str(run_dir),
        "model": {"seq_length": search_length(target, overshoot),
                  "train_length": base.model.train_length},
        "attention": {"scale_c": init, "head_scale": {
            "enabled": True, "trainable": True, "init": init, "min_value": min_value}},
        # exit_at 0: the checkpoint's own (a segment's end) says how its run was cut, not this one
        "train": {"mode": "headscale", "steps": steps, "exit_at": 0, "global_batch_size": global_batch,
                  "micro_batch_size": micro_batch, "grad_accum": None, "eval_interval": 0,
                  "activation_checkpointing": activation_checkpointing},
        "optim": {"lr": lr, "warmup_steps": warmup, "min_lr_ratio": 0.1, "weight_decay": 0.0},
        # a fresh data order, as the paper
        "data": {"seed": base.data.seed + 1, "cache_dir": None, **(data or {})},
        "parallel": {"zero_stage": zero_stage},
        "checkpoint": {"dir": str(run_dir / "checkpoints"), "init_from": str(ckpt),
                       "interval": max(1, steps // 4), "resume": True},
    }
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "config.yaml"
        save_config(base, f)
        return load_config(f, _dotted(changes))


def launch(cfg: RunConfig, target: int, nproc: int, port: int) -> None:
    """Write cfg to <run_dir>/search.yaml and train it on `nproc` ranks (resumes if killed),
    through `lenext train`'s launcher handling: a SIGTERM or SIGUSR1 reaches the ranks as a stop
    (a checkpoint, then out) instead of killing DeepSpeed's launcher; a search that did not reach
    its last step is an error (rerun to resume it), never exported."""
    from lenext_dist.checkpoint.layout import latest_tag, tag_for

    conf = Path(cfg.run_dir) / "search.yaml"
    save_config(cfg, conf)
    cmd = launch_command(conf, nproc, port)
    print(f"[extend] HeadScale search for T={target}: L'={cfg.model.seq_length}, m_h init "
          f"{cfg.attention.head_scale.init}", flush=True)
    try:  # into the caller's stdout (a worker's log when run in a worker process)
        out = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        out = None
    if launcher_status(cmd, stdout=out):
        raise UserError(f"the HeadScale search for T={target} failed (its error is above): {' '.join(cmd)}")
    tag = latest_tag(cfg.checkpoint.dir)
    if tag != tag_for(cfg.train.steps):
        raise UserError(f"the HeadScale search for T={target} stopped at {tag or 'no checkpoint'} of "
                        f"{cfg.train.steps} steps (a stop signal?): rerun lenext extend to resume it")
