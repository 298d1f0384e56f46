"""A step's model weights on CPU, in one process, whatever ZeRO stage wrote them."""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
from pathlib import Path

import torch

from lenext_dist.checkpoint.layout import FROZEN_FP32, resolve
from lenext_dist.checkpoint.safe_load import load as safe_load
from lenext_dist.checkpoint.safe_load import weights_only_loads
from lenext_dist.errors import CheckpointError


def read_state(step_dir: str | os.PathLike) -> tuple[dict[str, torch.Tensor], str]:
    """(megatron state dict on CPU, source) of a complete step folder, in one process.

    source 'zero_fp32': ZeRO 1-3 keep the exact fp32 master weights in the optimizer partitions,
    merged with DeepSpeed's zero_to_fp32 (the only source under ZeRO-3, whose module file holds
    empty placeholders). Frozen parameters (all but the head scales of a HeadScale run) have no
    partition; DeepSpeed records them for zero_to_fp32 only when it partitions gradients (stages
    2-3), so at stage 1 they come from the module file, where they are whole and never changed.
    source 'module': ZeRO-0 has no partitions; its module file is complete.
    Either way, frozen fp32 parameters (KERPLE's r1/r2 in a bf16 HeadScale run) take the exact
    values the step saved beside the module (FROZEN_FP32); the module file rounds them.
    """
    step_dir = Path(step_dir)
    saved = _model_states(step_dir)
    if any(step_dir.glob("*_optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                weights_only_loads(step_dir), unreadable(step_dir):
            state = get_fp32_state_dict_from_zero_checkpoint(str(step_dir.parent), tag=step_dir.name)
        if not saved["zero3"]:  # stages 1-2 (ZeRO-3's module files hold per-rank placeholders)
            for k, v in saved["module"].items():
                if k not in state and isinstance(v, torch.Tensor) and v.numel():
                    state[k] = v
        source = "zero_fp32"
    else:
        if saved["zero3"]:
            raise CheckpointError(f"{step_dir}: no DeepSpeed model states file")
        state, source = saved["module"], "module"
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    state.update(saved.get(FROZEN_FP32) or {})
    empty = [k for k, v in state.items() if v.numel() == 0]
    if empty:
        raise CheckpointError(f"{step_dir}: {len(empty)} tensors are empty placeholders (a ZeRO-3 "
                              f"module file without optimizer partitions?), e.g. {empty[0]}")
    return state, source


def _model_states(step_dir: Path) -> dict:
    """What DeepSpeed saved beside the optimizer (TP = PP = 1): the module state dict ('module')
    and our client state, from mp_rank_00_model_states.pt; under ZeRO-3, whose module there is
    per-rank placeholders, from rank 0's zero_pp_rank_0_mp_rank_00_model_states.pt ('zero3')."""
    files = sorted(step_dir.glob("mp_rank_*_model_states.pt"))
    zero3 = not files
    files = files or sorted(step_dir.glob("zero_pp_rank_0_mp_rank_*_model_states.pt"))
    if not files:
        raise CheckpointError(f"{step_dir}: no DeepSpeed model states file")
    if len(files) > 1:
        raise CheckpointError(f"{step_dir}: {len(files)} model-parallel ranks; only TP=PP=1 is supported")
    saved = safe_load(files[0])
    if not isinstance(saved, dict) or not isinstance(saved.get("module"), dict):
        raise CheckpointError(f"{files[0]}: not a DeepSpeed model states file (no 'module' state "
                              "dict); copy it again, or choose another step")
    return {**saved, "zero3": zero3}


_READ_FAILED = re.compile(r"PytorchStreamReader|zip archive|invalid load key|Ran out of input|"
                          r"unexpected EOF|truncated|is not a model state checkpoint", re.IGNORECASE)


@contextlib.contextmanager
def unreadable(step_dir: Path):
    """DeepSpeed's own reads of a truncated or foreign file: a CheckpointError naming the folder."""
    try:
        yield
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as e:  # ValueError: zero_to_fp32
        if isinstance(e, CheckpointError) or not (isinstance(e, EOFError) or _READ_FAILED.search(str(e))):
            raise
        raise CheckpointError(f"{step_dir}: a checkpoint file cannot be read ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:160] if str(e) else ''}); it may be truncated "
                              "(an interrupted copy?) or not a DeepSpeed file: copy it again or choose "
                              "another step") from None
    except KeyError as e:  # a file that loads but lacks what DeepSpeed reads from it ('module', ...)
        raise CheckpointError(f"{step_dir}: a checkpoint file lacks {e.args[0]!r}: not a DeepSpeed "
                              "file of this kind (replaced or damaged?); copy it again or choose "
                              "another step") from None


def read_weights(checkpoint: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's state dict in fp32 from a checkpoint folder or step folder (any ZeRO stage)."""
    state, _ = read_state(resolve(checkpoint))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()
            if not k.endswith("._extra_state")}
