"""Which attention kernel ran, how much memory it took, and what it may take without an L x L.

Which SDPA backend ran is read from torch's own op names under the profiler: `F.scaled_dot_product_
attention` dispatches to one aten op per backend (torch/_C aten native_functions: the names
below), recorded on the CPU side, so the same code reports the CPU fused kernel here and
flash / efficient / cudnn / math on CUDA.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "cpu_fused",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
"""aten op -> backend name; "math" is the one that materializes [b, h, sq, sk]."""
FUSED = {"flash", "efficient", "cudnn", "cpu_fused", "flex"}


def backends_run(fn: Callable[[], object]) -> dict[str, int]:
    """Run fn() under the profiler (CPU op events only: cheap) -> {backend: number of SDPA calls}.
    Forward and backward ops both count (the backward ops are named *_backward and not listed)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    seen: dict[str, int] = {}
    for ev in prof.events():
        name = SDPA_OPS.get(ev.name)
        if name:
            seen[name] = seen.get(name, 0) + 1
    return seen


def expected_sdpa_backend(dtype: torch.dtype, masked: bool, head_dim: int) -> str:
    """The backend torch's CUDA dispatcher picks first (aten/src/ATen/native/transformers/cuda/
    sdp_utils.cpp, priority flash > efficient > math): flash for fp16/bf16, no attn_mask, head dim
    <= 256 on sm80+; else memory-efficient (any dtype, additive masks); math only if both refuse."""
    if dtype in (torch.float16, torch.bfloat16) and not masked and head_dim <= 256:
        return "flash"
    return "efficient"


def attention_budget(b: int, h: int, g: int, L: int, d: int, bytes_per: int) -> int:
    """Peak bytes a fused attention forward+backward of q [b, h, L, d], k/v [b, g, L, d] may take,
    with no term in L^2: q, k, v, out, their gradients and the upstream gradient (7), k/v repeated
    to h heads with their gradients (4, paths.sdpa_call), fp32 copies of q for its scaling
    (paths.scaled_query: 2 in fp32 = 4 of bf16), working copies inside the kernel (4): 19 tensors
    of b h L d, plus fp32 row statistics (logsumexp, flex's per-row max) 8 b h L, plus FlexAttention's
    block mask (b h (L/128)^2 int32 per direction, 4 of them) and 256 MiB for workspaces and
    allocator rounding. An [h, L, L] bias or a [L, L] mask breaks it at the long lengths."""
    blocks = math.ceil(L / 128)
    return (19 * b * h * L * d * bytes_per + 8 * b * h * L * 4 + 4 * b * h * blocks * blocks * 4
            + 256 * 2**20)


def square_bytes(L: int) -> int:
    """The smallest L x L allocation: a boolean [L, L] mask."""
    return L * L


def synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def allocated_bytes(dev: torch.device) -> int:
    """Bytes the allocator holds for live tensors on a CUDA device; 0 elsewhere."""
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0


def peak_bytes(dev: torch.device) -> Optional[int]:
    """The allocator's peak on a CUDA device; None elsewhere (the CPU has no allocator stats)."""
    return torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None


def largest_allocation(fn: Callable[[], object], dev: torch.device) -> tuple[Optional[int], Optional[int]]:
    """(peak bytes above the start, largest single allocation in bytes) of fn() on a CUDA device,
    from the allocator's own trace (torch.cuda.memory._record_memory_history); (None, None) after
    running fn() elsewhere."""
    if dev.type != "cuda":
        fn()
        return None, None
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    # sizes only: no stack capture per allocation (context=None), which would slow the call down
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1_000_000)
    try:
        # entries already in the trace (a previous recording may survive) are not this call's
        before = [len(t) for t in torch.cuda.memory._snapshot().get("device_traces", [])]
        fn()
        torch.cuda.synchronize(dev)
        traces = torch.cuda.memory._snapshot().get("device_traces", [])
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    largest = 0
    for i, trace in enumerate(traces):
        for ev in trace[before[i] if i < len(before) else 0:]:
            if ev.get("action") == "alloc":
                largest = max(largest, int(ev.get("size", 0)))
    return torch.cuda.max_memory_allocated(dev) - base, largest


def reset_flex_state() -> None:
    """Each case compiles afresh: torch.compile's per-function recompile limit and paths.py's
    process-wide record of flex signatures (FLEX_MAX_SHAPES, past which it takes the chunked
    path; failed signatures) would otherwise push the later cases off FlexAttention."""
    from lenext_dist.attention import paths

    torch._dynamo.reset()
    paths._flex_shapes.clear()
    paths._flex_broken.clear()


def flex_outcome(seen: dict[str, int]) -> dict:
    """Where FlexAttention was expected, what ran (`seen`: backends_run's SDPA calls): "flex" (it
    runs no SDPA op) or "chunked" (SDPA per chunk: flex failed, the error kept, or never chose)."""
    from lenext_dist.attention import paths

    out = {"kernel": "chunked" if seen or paths._flex_broken else "flex",
           "flex_kernel_options": list(paths._flex_shapes.values())}
    for e in paths._flex_broken.values():  # it was tried and failed (paths.py warned)
        out["flex_error"] = f"{type(e).__name__}: {e}"[:300]
    return out
