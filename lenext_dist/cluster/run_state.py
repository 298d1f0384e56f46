"""What a job script needs to know about a run before and after training.

Contract with the training loop (lenext_dist/train/loop.py) and the checkpoint format
(lenext_dist/checkpoint), no marker file needed: the loop always saves a checkpoint at the
launch's last step (train.exit_at when set, else train.steps), and `<checkpoint.dir>/latest` names
the newest complete checkpoint (`step_NNNNNNN/COMPLETE`). So

    done     nothing left (train/run_dir.py finished: at the last step,
             a HeadScale search's scales written)               -> nothing to do
    stopped  a complete checkpoint short of that                -> resume (requeue) from it
    fresh    no checkpoint yet, or checkpoint.start_over        -> train from step 0

The checkpoint on disk is read whatever checkpoint.resume says: a job that saved one on a stop
signal resumes from it when requeued (pretrain.sbatch turns resume on for every restart).

`preflight` lists what would make the run fail right away (missing tokenizer, shards, init_from, an
earlier run that checkpoint.resume=false would overwrite).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lenext_dist.checkpoint.layout import COMPLETE, latest_tag_name, step_of
from lenext_dist.train.run_dir import finished, last_step


@dataclass
class RunState:
    state: str  # done | stopped | fresh
    step: int
    total: int
    checkpoint_dir: str

    def line(self) -> str:
        return f"{self.state} {self.step} {self.total} {self.checkpoint_dir}"


def latest_step(checkpoint_dir: str | os.PathLike) -> Optional[int]:
    """Step of the complete checkpoint `latest` names; None if there is none."""
    tag = latest_tag_name(Path(checkpoint_dir))
    step = step_of(tag) if tag is not None else None
    if step is None or not (Path(checkpoint_dir) / tag / COMPLETE).is_file():
        return None
    return step


def run_state(cfg) -> RunState:
    """`total`: the launch's last step (train.exit_at when set)."""
    step = None if cfg.checkpoint.start_over else latest_step(cfg.checkpoint.dir)
    total = last_step(cfg)
    if step is None:
        return RunState("fresh", 0, total, cfg.checkpoint.dir)
    return RunState("done" if finished(cfg, step) else "stopped", step, total, cfg.checkpoint.dir)


def _shard_missing(prefix: str) -> list[str]:
    return [f"{prefix}{ext}" for ext in (".bin", ".idx") if not Path(f"{prefix}{ext}").is_file()]


def preflight(cfg) -> list[str]:
    """Problems that would stop the run at start, as messages naming the config key."""
    problems = []
    if not Path(cfg.data.tokenizer).is_file():
        problems.append(f"data.tokenizer: {cfg.data.tokenizer} not found")
    if not cfg.data.blend:
        problems.append("data.blend: empty (point it at shards made by `lenext prep`)")
    for key, items in (("data.blend", cfg.data.blend), ("data.valid_blend", cfg.data.valid_blend)):
        for item in items:
            for path in _shard_missing(item.prefix):
                problems.append(f"{key}: shard file {path} not found")
    ck = cfg.checkpoint
    if not ck.resume and not ck.start_over and latest_step(ck.dir) is not None:
        problems.append(f"checkpoint.resume: false, but {ck.dir} holds an earlier run's checkpoints: "
                        "resume it (checkpoint.resume=true) or pass --checkpoint.start_over=true")
    init = cfg.checkpoint.init_from
    if init and latest_step(cfg.checkpoint.dir) is None:
        p = Path(init)
        if not ((p / COMPLETE).is_file() or latest_step(p) is not None):
            problems.append(f"checkpoint.init_from: {init} is not a complete checkpoint "
                            f"(no COMPLETE marker, no `latest`)")
    return problems
