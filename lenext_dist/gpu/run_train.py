"""The TinyLlama-1.1B step at its real shape under a DeepSpeed engine on one GPU (CUDA only).

The micro-batch search starts where dryrun.memory_estimate fits 90% of the device and steps down
on out-of-memory (the engine and its buffers are freed before the next try). MFU follows
lenext_dist/train/metrics.py: tokens/s x flops_per_token (PaLM 6N + 12 L H Q T, model/counts.py)
over the device's dense bf16 peak (train/peak.py).
"""
from __future__ import annotations

import dataclasses
import gc
import time

import torch

from . import kernels, plan

WARMUP, STEPS = 3, 8


def _with_micro(cfg, b: int):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch_size=b, global_batch_size=b))


def measure(cfg, b: int, mfu_floor: float, dev: torch.device, documents: int = 1) -> dict:
    from lenext_dist.model import build_model
    from lenext_dist.train import optim

    if documents > 1:
        kernels.reset_flex_state()
    start = kernels.allocated_bytes(dev)  # what earlier cases left on the device (0 if nothing)
    kernels.reset_peak(dev)
    engine = optim.build_engine(build_model(cfg), cfg, 1)
    try:
        return _measure(engine, cfg, b, mfu_floor, dev, start, documents)
    finally:
        # else the next case runs beside this one's states (the H100 check of 27 Nov: ZeRO-1's
        # peak came out 19.8 GB over ZeRO-2's, about ZeRO-2's 18 bytes/parameter of states)
        optim.release_engine(engine)


def _above(peak, start: int):
    """The peak above what was on the device when the case began (None off CUDA)."""
    return None if peak is None else peak - start


def _measure(engine, cfg, b: int, mfu_floor: float, dev: torch.device, start: int, documents: int) -> dict:
    from lenext_dist.model import flops_per_token
    from lenext_dist.train.peak import peak_tflops

    s, v = cfg.model.seq_length, cfg.model.vocab_size
    ids = torch.randint(0, v, (b, s + 1), device=dev)
    # documents > 1: that many equal documents per row, as document ids [b, s] (the loop's batch)
    doc_ids = (torch.arange(s, device=dev) * documents // s).expand(b, s) if documents > 1 else None
    batch = dict(input_ids=ids[:, :-1], position_ids=torch.arange(s, device=dev).expand(b, s),
                 attention_mask=doc_ids, labels=ids[:, 1:])

    def step():
        loss = engine(**batch).float().mean()
        engine.backward(loss)
        engine.step()
        return loss

    for _ in range(WARMUP):
        step()
    seen = kernels.backends_run(step)  # one step under the profiler: which SDPA backend ran
    kernels.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(STEPS):
        loss = step()
    kernels.synchronize(dev)
    dt = (time.perf_counter() - t0) / STEPS
    tok_s = b * s / dt
    peak, src = peak_tflops(dev.type, torch.bfloat16)
    mfu = tok_s * flops_per_token(cfg) / (peak * 1e12)
    out = {"micro_batch": b, "tokens_per_s": round(tok_s), "step_s": round(dt, 4), "mfu": round(mfu, 4),
           "model_tflops": round(tok_s * flops_per_token(cfg) / 1e12, 1), "peak_tflops": peak,
           "peak_source": src, "peak_bytes": _above(kernels.peak_bytes(dev), start),
           "start_bytes": start,
           "loss": float(loss), "sdpa_calls": seen, "kernel": ", ".join(sorted(seen)) or "none seen"}
    if documents > 1:  # flex, compiled for the step's shape, its backward through the recompute
        out.update(kernels.flex_outcome(seen))
        fused = out["kernel"] == "flex"
    else:
        fused = set(seen) <= kernels.FUSED and seen
    # the floor is of the datasheet peak: over a measured matmul (a device not in train/peak.py's
    # table) MFU reads 1.3-1.5x high, and the floor would pass what it should not; a documents
    # case checks the kernel and the backward, not throughput
    out["mfu_judged"] = src.startswith("table") and documents == 1
    low = out["mfu_judged"] and mfu < mfu_floor
    out["ok"] = bool(not low and fused and out["loss"] == out["loss"])
    if not out["ok"]:
        out["error"] = (f"MFU {100 * mfu:.1f}% < floor {100 * mfu_floor:.0f}%" if low else
                        f"attention {out['kernel']}: not all fused" if not fused else "loss is NaN")
    elif not out["mfu_judged"]:
        out["note"] = ("MFU not judged: a documents case" if documents > 1 else
                       f"MFU not judged: the peak is {src}, not a datasheet's (add the device to train/peak.py)")
    return out


def run(case: plan.Case, ctx) -> dict:
    cfg = plan.case_config(ctx.config, case, ctx.extra)
    tp = plan.train_plan(cfg, torch.cuda.get_device_properties(ctx.device).total_memory)
    oom = []
    for b in tp["micro_batches"]:
        try:
            return {**measure(_with_micro(cfg, b), b, ctx.mfu_floor, ctx.device, case.documents),
                    "out_of_memory_at": oom,
                    # the dry run's estimate at the micro-batch that ran (the report's budget)
                    "budget_bytes": tp["estimates"][b],
                    "shape": {k: tp[k] for k in ("layers", "hidden", "heads", "seq", "parameters",
                                                 "zero_stage", "precision")}}
        except (torch.cuda.OutOfMemoryError, RuntimeError) as e:  # DeepSpeed's hooks may re-wrap it
            if "out of memory" not in str(e).lower():
                raise
            oom.append(b)
        gc.collect()  # the failed engine's tensors go before the next, smaller try
        torch.cuda.empty_cache()
    return {"ok": False, "error": f"out of memory at every micro-batch {oom}", "out_of_memory_at": oom}
