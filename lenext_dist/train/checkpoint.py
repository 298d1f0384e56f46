"""DeepSpeed checkpoints with an atomic `latest`, keep-last-K retention and full RNG state.

Layout of checkpoint.dir:
    step_0000100/    DeepSpeed's files (model, ZeRO optimizer partitions) + config.yaml + COMPLETE
    latest           the tag of the newest complete checkpoint (written last, by os.replace)

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
import io
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from lenext_dist.atomic import atomic_write
from lenext_dist.config import RunConfig, save_config
from lenext_dist.errors import CheckpointError

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
        save_config(cfg, root / tag / "config.yaml")
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
    """Unmark `tag` before it is overwritten; if `latest` names it, move `latest` to the newest other
    complete step first (or remove it), so a kill during the save never leaves `latest` on a partial."""
    if latest_tag_name(root) == tag:
        others = sorted(p.name for p in root.glob("step_*") if p.name != tag and (p / COMPLETE).exists())
        if others:
            _atomic_write(root / LATEST, others[-1] + "\n")
        else:
            (root / LATEST).unlink()
    (root / tag / COMPLETE).unlink(missing_ok=True)


def latest_tag_name(root: Path) -> Optional[str]:
    """The tag `latest` names, complete or not (None without a `latest` file)."""
    f = root / LATEST
    return f.read_text().strip() if f.is_file() else None


def _prune(root: Path, keep: int, newest: str) -> None:
    """Keep the `keep` latest complete steps up to `newest` (the tag just saved, named by `latest`)."""
    if keep <= 0:
        return
    tags = sorted(p for p in root.glob("step_*") if (p / COMPLETE).exists() and p.name <= newest)
    for old in tags[:-keep]:
        shutil.rmtree(old, ignore_errors=True)




def latest_tag(root: str | os.PathLike) -> Optional[str]:
    """Tag named by `latest` if that checkpoint is complete, else None."""
    f = Path(root) / LATEST
    tag = latest_tag_name(Path(root))
    if tag is None:
        return None
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


# Sections that define the network: resuming with any of them changed trains another model on
# this one's weights (a NoPE run continued as RoPE loads without a shape error). The data order
# (blend, seed, global batch, sequence length, and train.steps, which sizes the blend) may change
# on purpose, so it is only reported.
_MODEL_KEYS = ("model", "attention", "train.mode")
_DATA_KEYS = ("data.blend", "data.seed", "train.global_batch_size", "train.steps", "model.seq_length",
              "data.bos", "data.document_mask", "data.task_loss")  # the last three: what the samples / loss mask are
_FREE_KEYS = ("model.name", "model.init_method_std", "model.train_length", "attention.impl",
              "attention.chunk_size")
"""Same network either way: a label, the initialization, the kernel choice (train_length only
through model.base_length, compared instead)."""


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume(cfg: RunConfig, step_dir: str | os.PathLike) -> list[str]:
    """Compare this run's config with the checkpoint's: raise CheckpointError naming the keys
    when the model or attention differ; return notes on changed data-order keys."""
    from lenext_dist.config import to_dict

    old = run_config(step_dir)
    now, then = _flat(to_dict(cfg)), _flat(to_dict(old))
    # the pretrained L (train_length, or seq_length when unset) sets XPOS blocks, YaRN's original
    # length and the log scale's L: a model key even when it only moved with seq_length
    now["model.base_length"], then["model.base_length"] = cfg.model.base_length, old.model.base_length
    changed = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))

    def under(k, roots):
        return any(k == r or k.startswith(r + ".") for r in roots)

    bad = [k for k in changed if under(k, _MODEL_KEYS) and not under(k, _DATA_KEYS + _FREE_KEYS)]
    if bad:
        diff = "; ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in bad[:6])
        raise CheckpointError(
            f"{step_dir} was trained with another model or attention ({diff}); restore these "
            f"keys (model.base_length: set model.train_length to the old value) to resume it, "
            f"or start a new run (another run_dir, or checkpoint.start_over=true to move this one "
            f"aside; checkpoint.init_from={step_dir} starts it from these weights)")
    return [f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in changed if under(k, _DATA_KEYS)]


def load(engine, root: str, tag: str, reshard: bool = False) -> dict:
    """Full resume: module, optimizer and our client state (step, samples, RNG). reshard: the
    checkpoint's ZeRO-1/2 partitions are of another data-parallel size (train/reshard.py)."""
    from lenext_dist.train.safe_load import weights_only_loads

    with weights_only_loads(Path(root) / tag), _unreadable(Path(root) / tag):
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


def run_config(step_dir: str | os.PathLike) -> RunConfig:
    """The resolved config a checkpoint was written with (its config.yaml)."""
    from lenext_dist.config import load_config

    f = Path(step_dir) / "config.yaml"
    if not f.is_file():
        raise CheckpointError(f"{step_dir}: no config.yaml (not written by lenext_dist.train?)")
    return load_config(f)


def read_state(step_dir: str | os.PathLike) -> tuple[dict[str, torch.Tensor], str]:
    """(megatron state dict on CPU, source) of a complete step folder, in one process.

    source 'zero_fp32': ZeRO 1-3 keep the exact fp32 master weights in the optimizer partitions,
    merged with DeepSpeed's zero_to_fp32 (the only source under ZeRO-3, whose module file holds
    empty placeholders). Frozen parameters (all but the head scales of a HeadScale run) have no
    partition; DeepSpeed records them for zero_to_fp32 only when it partitions gradients (stages
    2-3), so at stage 1 they come from the module file, where they are whole and never changed.
    source 'module': ZeRO-0 has no partitions; its module file is complete.
    """
    step_dir = Path(step_dir)
    if any(step_dir.glob("*_optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        from lenext_dist.train.safe_load import weights_only_loads

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                weights_only_loads(step_dir), _unreadable(step_dir):
            state = get_fp32_state_dict_from_zero_checkpoint(str(step_dir.parent), tag=step_dir.name)
        if any(step_dir.glob("mp_rank_*_model_states.pt")):  # stages 1-2 (ZeRO-3: per-rank placeholders)
            for k, v in _module_state(step_dir).items():
                if k not in state and isinstance(v, torch.Tensor) and v.numel():
                    state[k] = v
        source = "zero_fp32"
    else:
        state, source = _module_state(step_dir), "module"
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    empty = [k for k, v in state.items() if v.numel() == 0]
    if empty:
        raise CheckpointError(f"{step_dir}: {len(empty)} tensors are empty placeholders (a ZeRO-3 "
                              f"module file without optimizer partitions?), e.g. {empty[0]}")
    return state, source


def _module_state(step_dir: Path) -> dict:
    """The module state dict DeepSpeed saved with the step (TP = PP = 1)."""
    files = sorted(step_dir.glob("mp_rank_*_model_states.pt"))
    if not files:
        raise CheckpointError(f"{step_dir}: no DeepSpeed model states file")
    if len(files) > 1:
        raise CheckpointError(f"{step_dir}: {len(files)} model-parallel ranks; only TP=PP=1 is supported")
    from lenext_dist.train.safe_load import load as safe_load

    return safe_load(files[0])["module"]


_READ_FAILED = re.compile(r"PytorchStreamReader|zip archive|invalid load key|Ran out of input|"
                          r"unexpected EOF|truncated", re.IGNORECASE)


@contextlib.contextmanager
def _unreadable(step_dir: Path):
    """DeepSpeed's own reads of a truncated or foreign file: a CheckpointError naming the folder."""
    try:
        yield
    except (RuntimeError, EOFError, pickle.UnpicklingError) as e:
        if isinstance(e, CheckpointError) or not (isinstance(e, EOFError) or _READ_FAILED.search(str(e))):
            raise
        raise CheckpointError(f"{step_dir}: a checkpoint file cannot be read ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:160] if str(e) else ''}); it may be truncated "
                              "(an interrupted copy?) or not a DeepSpeed file: copy it again or choose "
                              "another step") from None


def read_weights(checkpoint: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's state dict in fp32 from a checkpoint folder or step folder (any ZeRO stage)."""
    state, _ = read_state(resolve(checkpoint))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()
            if not k.endswith("._extra_state")}


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
                                  f"the model section of {step / 'config.yaml'} with this run's)")
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not keep(k) and not k.endswith("._extra_state")]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"{step} does not fit this model: missing {missing[:5]}, "
                              f"unexpected {result.unexpected_keys[:5]} (same model.* shape needed)")
    return str(step)
