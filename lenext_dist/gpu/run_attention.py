"""Forward+backward of each distinct layer variant of an attention case on CUDA: the kernel that
ran, time, peak memory above the inputs and the largest single allocation.

Passes when a fused kernel ran (SDPA flash / efficient / cudnn, or FlexAttention without falling
back to the chunked path) and, at the long length, the peak stays within the analytic budget
without L^2 terms (kernels.attention_budget) and no allocation reaches L x L bytes. At 2K an L x L
tensor is smaller than q itself, so memory is recorded there, not judged.
"""
from __future__ import annotations

import time

import torch

from . import kernels, plan


def one_call(variant, case: plan.Case, shape, dtype, dev: torch.device) -> dict:
    from lenext_dist.attention import Documents, attend

    b, h, g, L, d = shape
    if isinstance(variant, torch.nn.Module):
        variant = variant.for_layer().to(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, h, L, d, device=dev, dtype=dtype, generator=gen, requires_grad=True)
    k, v = (torch.randn(b, g, L, d, device=dev, dtype=dtype, generator=gen, requires_grad=True) for _ in range(2))
    m = torch.ones(h, device=dev)
    docs = None
    if case.documents > 1:  # equal documents, ids [b, L]
        docs = Documents((torch.arange(L, device=dev) * case.documents // L).expand(b, L))

    def step():
        for t in (q, k, v):
            t.grad = None
        attend(q, k, v, m, variant, documents=docs).float().sum().backward()

    kernels.reset_flex_state()
    step()  # compiles FlexAttention where it runs
    seen = kernels.backends_run(step)
    kernels.synchronize(dev)
    t0 = time.perf_counter()
    step()
    kernels.synchronize(dev)
    ms = 1000 * (time.perf_counter() - t0)
    peak, largest = kernels.largest_allocation(step, dev)
    expected = plan.attention_kernel(variant, case.documents, shape, dtype)
    out = {"expected": expected, "sdpa_calls": seen, "ms": round(ms, 2), "peak_bytes": peak,
           "largest_alloc_bytes": largest}
    if expected == "flex":
        out.update(kernels.flex_outcome(seen))
    else:
        out["kernel"] = "sdpa:" + "+".join(sorted(seen)) if seen else "none seen"
    return out

def run(case: plan.Case, ctx) -> dict:
    cfg = plan.case_config(ctx.config, case, ctx.extra)
    h, g, d = plan.head_shape(cfg)
    shape, dtype = (1, h, g, case.length, d), torch.bfloat16
    calls = [one_call(v, case, shape, dtype, ctx.device) for v in plan.distinct_variants(cfg)]
    budget = kernels.attention_budget(*shape[:4], shape[4], 2)
    square = kernels.square_bytes(case.length)
    judged = case.length > plan.SHORT and ctx.device.type == "cuda"
    errors = []
    for c in calls:
        fused = c["kernel"] == "flex" or (c["kernel"].startswith("sdpa:") and
                                          set(c["sdpa_calls"]) <= kernels.FUSED and c["sdpa_calls"])
        if not fused:
            errors.append(f"no fused kernel: {c['kernel']} (expected {c['expected']})")
        if judged and c["peak_bytes"] > budget:
            errors.append(f"peak {c['peak_bytes'] / 2**30:.2f} GiB > budget {budget / 2**30:.2f} GiB (an L x L term?)")
        if judged and c["largest_alloc_bytes"] >= square:
            errors.append(f"an allocation of {c['largest_alloc_bytes'] / 2**20:.0f} MiB >= L x L bytes")
    return {"ok": not errors, "error": "; ".join(errors) if errors else None, "calls": calls,
            "kernel": ", ".join(c["kernel"] for c in calls),
            "peak_bytes": max((c["peak_bytes"] or 0) for c in calls) or None,
            "largest_alloc_bytes": max((c["largest_alloc_bytes"] or 0) for c in calls) or None,
            "budget_bytes": budget,
            "memory_judged": judged}
