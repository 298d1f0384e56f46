"""Keep the fp32 parameters of a bf16/fp16 model exact inside a DeepSpeed engine.

The model builds HeadScale's m_h and KERPLE's r1/r2 in fp32 on purpose; DeepSpeed 0.19.8 casts
them to bf16 with everything else and makes its fp32 master copy *from the bf16 values*. So:

1. `capture(model)` before `deepspeed.initialize`: the fp32 parameters' values.
2. `restore(engine, captured)` after: the masters set back to the exact values
   (`safe_set_full_fp32_param`, ZeRO 1-3), and each parameter's fp32 shadow
   (`attention.precision.FP32_ATTR`) set, which the forward reads through `fp32_value`.
3. `refresh(engine)` after every optimizer step (and after a checkpoint load): the shadows of
   trainable ones from their masters (`safe_get_full_fp32_param`: a small collective per
   parameter under ZeRO, so every rank calls it).

4. `frozen(engine)` into a checkpoint's client state, `restore` from it on resume: a frozen
   parameter has no master, and its captured value on resume is the fresh model's (init_from is
   skipped), while the module file holds the trained value in bf16 (KERPLE's r1/r2 in a HeadScale
   run). A checkpoint without them (saved before they were kept) leaves `fp32_value` the loaded
   bf16 value (the shadow no longer matches it).

ZeRO-0 with bf16 (DeepSpeed's DDP bf16 wrapper) has masters the safe_* accessors cannot reach: its
trainable fp32 parameters get no shadow and run in bf16 as before (the config already refuses
clamped head scales there).
"""
from __future__ import annotations

import torch

from lenext_dist.attention.precision import FP32_ATTR
from lenext_dist.checkpoint.layout import FROZEN_FP32


def capture(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{name: fp32 copy} of the fp32 parameters of a model whose other weights are not fp32."""
    from lenext_dist.model.build import documented_fp32

    params = dict(model.named_parameters())
    if all(p.dtype == torch.float32 for p in params.values()):
        return {}  # an fp32 run: nothing is cast
    # only the documented fp32 ones (m_h, KERPLE): build.place_parameters gives every other
    # weight, the norms included, the run's dtype, so nothing else needs an fp32 shadow
    return {n: p.detach().clone() for n, p in params.items()
            if documented_fp32(n) and p.dtype == torch.float32 and p.device.type != "meta"}


@torch.no_grad()
def restore(engine, captured: dict[str, torch.Tensor]) -> None:
    """After deepspeed.initialize: exact masters and shadows for the captured parameters."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    for name, p in engine.module.named_parameters():
        if name not in captured or p.dtype == torch.float32:
            continue
        value = captured[name].to(p.device)
        if p.requires_grad:
            if safe_get_full_fp32_param(p) is None:
                continue  # ZeRO-0 bf16: no reachable master, stays bf16
            safe_set_full_fp32_param(p, value)
        setattr(p, FP32_ATTR, value)


@torch.no_grad()
def refresh(engine) -> None:
    """Shadows of the trainable shadowed parameters from their fp32 masters (call on all ranks)."""
    from deepspeed.utils import safe_get_full_fp32_param

    for p in engine.module.parameters():
        if p.requires_grad and getattr(p, FP32_ATTR, None) is not None:
            master = safe_get_full_fp32_param(p)
            if master is not None:
                setattr(p, FP32_ATTR, master.detach().to(p.device, torch.float32).view(p.shape))


FROZEN = FROZEN_FP32  # the client-state key of `frozen` in a checkpoint


def frozen(engine) -> dict[str, torch.Tensor]:
    """{name: fp32 value, on the CPU} of the frozen shadowed parameters."""
    return {n: getattr(p, FP32_ATTR).cpu() for n, p in engine.module.named_parameters()
            if not p.requires_grad and getattr(p, FP32_ATTR, None) is not None}


def has_trainable(engine) -> bool:
    return any(p.requires_grad and getattr(p, FP32_ATTR, None) is not None
               for p in engine.module.parameters())
