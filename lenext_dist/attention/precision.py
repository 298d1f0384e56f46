"""fp32 values of the small scale parameters (HeadScale m_h, KERPLE r1/r2) under a bf16 engine.

DeepSpeed 0.19.8 casts every parameter of the model to bf16 (engine._cast_module_mixed_precision;
keep_in_fp32_modules covers buffers only), so m_h = 1.2 would run as 1.203125 (bf16 steps of
2^-7 near 1) while the optimizer's fp32 master holds the real value. The training side
(lenext_dist/train/fp32_params.py) hangs the fp32 value on the parameter object as
`FP32_ATTR` (after engine init and after every optimizer step); `fp32_value` reads it:

    value = shadow (fp32), where shadow rounds to the parameter's current bf16 value,
            else the parameter itself (something changed it: a load, a manual edit)
    grad  = d/d parameter (straight through: + (p - p.detach()), exactly 0 in value)

The check is elementwise on the device (no host sync). Without a shadow, or for an fp32
parameter, it is just `p.float()`, so everything outside a bf16 DeepSpeed engine is unchanged.
"""
from __future__ import annotations

import torch
from torch import Tensor

FP32_ATTR = "_lenext_fp32"
"""Attribute of a low-precision Parameter holding its fp32 value [same shape] (no grad)."""


def fp32_value(p: Tensor) -> Tensor:
    """p as fp32, from its fp32 shadow when it has a current one; differentiable w.r.t. p."""
    shadow = getattr(p, FP32_ATTR, None)
    if shadow is None or p.dtype == torch.float32 or shadow.shape != p.shape:
        return p.float()
    current = torch.where(shadow.to(p.dtype) == p.detach(), shadow, p.detach().float())
    return current + (p - p.detach()).float()
