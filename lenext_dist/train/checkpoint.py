"""Writing and resuming DeepSpeed checkpoints: an atomic `latest`, keep-last-K retention and full
RNG state. The format (names, locating a complete step, reading weights) is lenext_dist/checkpoint,
which convert and extend read without importing training.

A crash (even kill -9) while step_N is being written leaves `latest` naming the previous tag, so
resume never sees a partial checkpoint; the partial folder is overwritten when step N comes again
(its COMPLETE marker, if an earlier run left one, is removed before any rank writes into it).
Retention only looks at steps up to the one just saved: a run started over (`resume: false`) in a
folder with later steps of an earlier run never prunes its own newest checkpoints for them.
On resume, `check_resume` refuses a checkpoint of a different model or attention (a NoPE run must
not continue as RoPE) and warns when the data order will differ.
"""
from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import shutil
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from lenext_dist.atomic import atomic_write
from lenext_dist.checkpoint.layout import (COMPLETE, CONFIG, LATEST, latest_tag_name, resolve, saved_config, step_of,
                                           tag_for)
from lenext_dist.checkpoint.safe_load import weights_only_loads
from lenext_dist.checkpoint.weights import read_weights, unreadable
from lenext_dist.config import AttentionConfig, RunConfig, save_config, stages, to_dict
from lenext_dist.errors import CheckpointError
from lenext_dist.model.megatron_env import on_cpu
from lenext_dist.train import optim


def rng_state() -> dict:
    """Python's, numpy's and torch's CPU generators and, on an accelerator, its generator and
    megatron's tracker states (what tensor-parallel dropout forks from; megatron's own checkpoints
    keep them as `rng_tracker_states`). Rank 0's state is the one saved (DeepSpeed writes the client
    state once): every rank is seeded alike (model/megatron_env.init_megatron) and TP = 1, so the
    ranks' generators are equal."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if not on_cpu():
        from deepspeed.accelerator import get_accelerator
        from megatron.core import tensor_parallel

        state["accelerator"] = get_accelerator().get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def set_rng_state(state: dict) -> None:
    """The accelerator's part only where this run has one and the checkpoint saved one (a CPU
    checkpoint resumed on a GPU keeps the GPU generators as seeded)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if not on_cpu() and "accelerator" in state:
        from deepspeed.accelerator import get_accelerator
        from megatron.core import tensor_parallel

        get_accelerator().set_rng_state(state["accelerator"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _atomic_write(path: Path, text: str) -> None:
    """The markers (COMPLETE, latest) must be durable before the next one is written: fsync."""
    atomic_write(path, text, fsync=True)


def save(engine, cfg: RunConfig, step: int, consumed_samples: int, extra: Optional[dict] = None) -> str:
    """Save on all ranks; rank 0 then marks it complete, moves `latest` and prunes old ones. A
    full disk raises CheckpointError saying how much space a checkpoint needs."""
    root, tag = Path(cfg.checkpoint.dir), tag_for(step)
    with _space_needed(engine, root, tag):
        return _save(engine, cfg, root, tag, step, consumed_samples, extra)


def _save(engine, cfg: RunConfig, root: Path, tag: str, step: int, consumed_samples: int,
          extra: Optional[dict]) -> str:
    client = {"step": step, "consumed_samples": consumed_samples, "rng": rng_state(),
              **(extra or {})}
    if dist.get_rank() == 0:  # an earlier run's step N: not complete while this one overwrites it
        _retire(root, tag)
    dist.barrier()
    engine.save_checkpoint(str(root), tag=tag, client_state=client, save_latest=False)
    dist.barrier()  # every rank's shard is on disk before `latest` may point at it
    if dist.get_rank() == 0:
        save_config(cfg, root / tag / CONFIG)
        _atomic_write(root / tag / COMPLETE, f"{step}\n")
        _atomic_write(root / LATEST, tag + "\n")
        _prune(root, cfg.checkpoint.keep_last, tag)
    dist.barrier()
    return tag


_WRITE_FAILED = re.compile(r"iostream error|file write failed|No space left|quota", re.IGNORECASE)
_FULL = (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def _space_needed(engine, root: Path, tag: str):
    """A write that fails for lack of space (torch's C++ writer says only `basic_ios::clear:
    iostream error` or `file write failed`, without errno): one CheckpointError with the space a
    checkpoint needs. Nothing is lost: the step folder has no COMPLETE marker and `latest` still
    names the last complete step."""
    try:
        yield
    except (RuntimeError, OSError) as e:
        chain, c = [], e  # torch's writer fails again on closing: the first error is the context
        while c is not None and len(chain) < 5:
            chain.append(c)
            c = c.__context__
        failed = [c for c in chain if isinstance(c, OSError) and c.errno in _FULL or
                  isinstance(c, RuntimeError) and _WRITE_FAILED.search(str(c))]
        if isinstance(e, CheckpointError) or not failed:
            raise
        full = isinstance(failed[-1], OSError)
        raise CheckpointError(_no_space(engine, root, tag, failed[-1], full)) from None


def _no_space(engine, root: Path, tag: str, e: Exception, full: bool) -> str:
    def gb(n: float) -> str:
        return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"

    def du(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0

    here = next(p for p in (root, *root.absolute().parents) if p.exists())
    free = shutil.disk_usage(here).free
    last = latest_tag_name(root) if root.is_dir() else None
    # as much as the last complete checkpoint took, else 16 bytes a parameter (the weights, and
    # Adam's fp32 master, m and v)
    needed = du(root / last) if last else 16 * sum(getattr(p, "ds_numel", p.numel())
                                                   for p in engine.module.parameters())
    partial = du(root / tag)
    what = (f"no space left on {root}" if full or free < needed else
            f"writing {root / tag} failed ({str(e).splitlines()[0][:120]}; a full disk or quota?)")
    return (f"{what}: a checkpoint needs about {gb(needed)}, {gb(free)} free"
            + (f" (the unfinished {tag} holds {gb(partial)}: delete it)" if partial else "")
            + f"; {tag} was not saved and `latest` still names "
            + (f"{last} (intact)" if last else "nothing")
            + ". Free space or point checkpoint.dir elsewhere, then resume")


def _retire(root: Path, tag: str) -> None:
    """Clear `tag` before it is written again; if `latest` names it, move `latest` to the newest other
    complete step first (or remove it), so a kill during the save never leaves `latest` on a partial.
    The folder goes whole, not only its COMPLETE: an unfinished save at another rank count leaves
    partitions this one does not overwrite, and they would make the step look saved by that many
    ranks (reshard.saved_dp_size) and its resume fail."""
    if latest_tag_name(root) == tag:
        others = sorted(p.name for p in root.glob("step_*") if p.name != tag and (p / COMPLETE).exists())
        if others:
            _atomic_write(root / LATEST, others[-1] + "\n")
        else:
            (root / LATEST).unlink()
    (root / tag / COMPLETE).unlink(missing_ok=True)  # first: a kill inside rmtree leaves no marker
    shutil.rmtree(root / tag, ignore_errors=True)


def _prune(root: Path, keep: int, newest: str) -> None:
    """Keep the `keep` latest complete steps up to `newest` (the tag just saved, named by `latest`)."""
    if keep <= 0:
        return
    tags = sorted(p for p in root.glob("step_*") if (p / COMPLETE).exists() and p.name <= newest)
    for old in tags[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# Sections that define the network: resuming with any of them changed trains another model on
# this one's weights (a NoPE run continued as RoPE loads without a shape error). The data order
# (blend, seed, global batch, sequence length, and train.steps, which sizes the blend) may change
# on purpose, so it is only reported.
_MODEL_KEYS = ("model", "attention", "train.mode")
_DATA_KEYS = ("data.blend", "data.seed", "train.global_batch_size", "train.steps", "model.seq_length",
              "data.bos", "data.document_mask", "data.task_loss",  # what the samples / loss mask are
              "train.stages")  # the plan (each stage's model is compared alone, in check_resume)
_FREE_KEYS = ("model.name", "model.init_method_std", *(f"attention.{k}" for k in AttentionConfig.KERNEL_FIELDS))
"""Same network either way: a label, the initialization, the kernel choices (a resume on another
machine may pick its own)."""


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume(cfg: RunConfig, step_dir: str | os.PathLike) -> list[str]:
    """Compare this run's config with the checkpoint's: raise CheckpointError naming the keys
    when the model or attention differ; return notes on changed data-order keys."""
    old = saved_config(step_dir)  # the whole run's, stages included
    # the model of stage 0, and under train.stages that of the stage the weights were trained in
    # (step N holds steps 0..N-1) and of the one step N trains in, each under both configs: a
    # stage's RoPE base edited, or its start moved past the checkpoint, trains these weights as
    # another model
    step = step_of(Path(step_dir).name)
    at = sorted({max(step - 1, 0), step}) if step is not None and (cfg.train.stages or old.train.stages) else []
    pairs = [("", cfg, old)] + [(f" (at step {s})", stages.stage_config(cfg, stages.index_at(cfg, s)),
                                 stages.stage_config(old, stages.index_at(old, s))) for s in at]
    bad = [d for where, a, b in pairs for d in _model_changes(a, b, where)]
    if bad:
        raise CheckpointError(
            f"{step_dir} was trained with another model or attention ({'; '.join(bad[:6])}); restore these "
            f"keys (model.train_length: null means model.seq_length; set it to the old L) to resume it, "
            f"or start a new run (another run_dir, or checkpoint.start_over=true to move this one "
            f"aside; checkpoint.init_from={step_dir} starts it from these weights)")
    # DeepSpeed (the partitions) or torch (the parameter groups) would fail inside the load
    now, then = _flat(to_dict(cfg)), _flat(to_dict(old))
    for key, what in (("parallel.zero_stage", "the optimizer state's partitions"),
                      ("optim.no_decay_embeddings", "the optimizer's parameter groups")):
        if now[key] != then[key]:
            raise CheckpointError(
                f"{step_dir} was trained with {key}={then[key]} ({what}); this run has {key}="
                f"{now[key]}: resume with {key}={then[key]}, or start a new run from its weights "
                f"(checkpoint.init_from={step_dir}; the optimizer state starts afresh)")
    return _changes(cfg, old, _DATA_KEYS)


def optim_changes(cfg: RunConfig, step_dir: str | os.PathLike) -> list[str]:
    """`key: old -> new` for each optim.* key changed since the checkpoint: this run's values
    apply (load keeps this run's optimizer settings, optim.settings_kept)."""
    return _changes(cfg, saved_config(step_dir), ("optim",))


def _changes(cfg: RunConfig, old: RunConfig, roots) -> list[str]:
    now, then = _flat(to_dict(cfg)), _flat(to_dict(old))
    return [f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in _changed(now, then) if _under(k, roots)]


def _under(k: str, roots) -> bool:
    return any(k == r or k.startswith(r + ".") for r in roots)


def _changed(now: dict, then: dict) -> list[str]:
    return sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))


def _model_changes(cfg: RunConfig, old: RunConfig, where: str) -> list[str]:
    """`key: old -> new` for each model key in which the two configs differ. L, the pretrained
    context, sets XPOS blocks, YaRN's original length and the temperature schedules' L:
    model.train_length, resolved when read (null = seq_length), so a null that only moved with
    seq_length is a changed model too."""
    now, then = _flat(to_dict(cfg)), _flat(to_dict(old))
    return [f"{k}: {then.get(k)!r} -> {now.get(k)!r}{where}" for k in _changed(now, then)
            if _under(k, _MODEL_KEYS) and not _under(k, _DATA_KEYS + _FREE_KEYS)]


def load(engine, root: str, tag: str, reshard: bool = False) -> dict:
    """Full resume: module, optimizer and our client state (step, samples, RNG). reshard: the
    checkpoint's ZeRO-1/2 partitions are of another data-parallel size (train/reshard.py)."""
    with weights_only_loads(Path(root) / tag), unreadable(Path(root) / tag), \
            optim.settings_kept(engine.optimizer):  # the checkpoint's state, this run's optim.*
        if reshard:
            from lenext_dist.train.reshard import load_resharded

            client = load_resharded(engine, Path(root) / tag)
        else:
            _, client = engine.load_checkpoint(root, tag=tag, load_optimizer_states=True,
                                               load_lr_scheduler_states=False)
    if client is None:
        raise CheckpointError(f"{root}/{tag}: DeepSpeed could not load this checkpoint")
    set_rng_state(client["rng"])
    return client


def load_weights(model: torch.nn.Module, path: str, keep: Callable[[str], bool]) -> str:
    """Start a new run from another run's weights (HeadScale), before DeepSpeed wraps the model.

    Parameters for which keep(name) is true keep their fresh initialization (the head scales,
    which start from the config's value, not from the source); every other parameter must be in
    the checkpoint, so a wrong source fails loudly instead of training from random weights.
    """
    step = resolve(path)
    state = {k: v for k, v in read_weights(step).items() if not keep(k)}
    ours = model.state_dict()
    for k, v in state.items():
        if k in ours and tuple(v.shape) != tuple(ours[k].shape):
            raise CheckpointError(f"{step} does not fit this model: {k} is {list(v.shape)} there, "
                                  f"{list(ours[k].shape)} here (same model.* shape needed: compare "
                                  f"the model section of {step / CONFIG} with this run's)")
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not keep(k) and not k.endswith("._extra_state")]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"{step} does not fit this model: missing {missing[:5]}, "
                              f"unexpected {result.unexpected_keys[:5]} (same model.* shape needed)")
    return str(step)
