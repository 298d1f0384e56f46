"""Checkpoint files are data, never code: every torch.load of a checkpoint runs with weights_only.

DeepSpeed 0.19.8 unpickles with `weights_only=False` (TorchCheckpointEngine.load, used by
engine.load_checkpoint; utils/zero_to_fp32.py's parse_model_states / parse_optim_states), so a
checkpoint someone shares could run any code on `convert`, resume, `checkpoint.init_from` or
`--head-scales-from`. Inside `weights_only_loads()` torch's own switch
TORCH_FORCE_WEIGHTS_ONLY_LOAD (read by torch.load on each call, torch/serialization.py) turns
those loads into weights_only loads too, and only the globals below may be unpickled: what our
checkpoints hold besides tensors and plain containers (found with
torch.serialization.get_unsafe_globals_in_checkpoint on ZeRO-0..3, fp32 and bf16 checkpoints):
- numpy's RNG state (np.random.get_state(): an ndarray of uint32) in our client state;
- DeepSpeed's optimizer bookkeeping: the loss scaler, the ZeRO stage enum, fragment addresses.
A file needing anything else (e.g. a pickled os.system) is refused with CheckpointError.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import re
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from lenext_dist.errors import CheckpointError

_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
# a common DeepSpeed workaround users export; with _FORCE also set torch.load raises RuntimeError
_FORCE_NO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def allowed_globals() -> list:
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [np.ndarray, np.dtype, _reconstruct, type(np.dtype(np.uint32)),
            LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


@contextlib.contextmanager
def weights_only_loads(what: str | os.PathLike) -> Iterator[None]:
    """Every torch.load inside (ours and DeepSpeed's) is weights_only with our allow-list; a file
    needing other globals raises CheckpointError naming `what` (a checkpoint file or folder)."""
    old = {k: os.environ.get(k) for k in (_FORCE, _FORCE_NO)}
    os.environ[_FORCE] = "1"
    os.environ.pop(_FORCE_NO, None)
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            yield
    except pickle.UnpicklingError as e:
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(e))
        detail = f" ({found.group(1)})" if found else ""
        raise CheckpointError(
            f"{what}: refused to load: it holds pickled code or objects that are not weights"
            f"{detail}. Checkpoints are loaded with torch.load(weights_only=True); only load "
            "checkpoints written by lenext_dist.train, and get this one again from its source") from None
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load(path: str | os.PathLike, **kw):
    """torch.load(path, weights_only=True) with our allow-list; CheckpointError naming the file
    for a malicious or truncated one."""
    with weights_only_loads(path):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, **kw)
        except (RuntimeError, EOFError, OSError) as e:  # truncated zip, short read, not a torch file
            if isinstance(e, OSError) and not Path(path).is_file():
                raise CheckpointError(f"{path}: no such file") from None
            raise CheckpointError(f"{path}: cannot be read as a checkpoint file "
                                  f"({str(e).splitlines()[0][:160]}); it may be truncated "
                                  "(an interrupted copy?): copy it again") from None
