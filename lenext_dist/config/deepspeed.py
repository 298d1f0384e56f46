"""The DeepSpeed JSON, generated from the run config (never written by hand)."""
from __future__ import annotations

from .schema import RunConfig


def deepspeed_config(cfg: RunConfig, world_size: int) -> dict:
    """DeepSpeed config dict for `deepspeed.initialize(config=...)`.

    The optimizer and LR schedule are ours (torch AdamW built in lenext_dist.train, so nothing
    JIT-compiles and HeadScale can give the scales their own param group); DeepSpeed owns ZeRO,
    gradient accumulation, clipping and mixed precision.
    """
    t, p = cfg.train, cfg.parallel
    zero: dict = {"stage": p.zero_stage}
    if p.zero_stage >= 1 and p.offload_optimizer:
        # pinned host buffers (DeepSpeed's default): page-locked copies run at full bandwidth and
        # overlap the step (DeepSpeed's offload_config.py); a no-op on a CPU-only host
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if p.zero_stage in (1, 2):
        # contiguous_gradients: copy each reduced gradient into one flat partition buffer as it is
        # produced (no fragmentation of 2.2 GB of bf16 grads for a 1.1B model); overlap_comm: the
        # bucket reduce runs on a side stream behind the backward (DeepSpeed leaves it off below
        # ZeRO-3); buckets sized so the overlap buffers stay small
        zero.update(contiguous_gradients=True, overlap_comm=p.overlap_comm,
                    reduce_bucket_size=p.bucket_size, allgather_bucket_size=p.bucket_size)
    if p.zero_stage == 3:
        # Gather the full 16-bit weights on save so export needs no zero_to_fp32 pass.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        # every gradient through the reduce-scatter, whose averaging model/ulysses.py
        # backward_factor corrects under sequence parallelism (DeepSpeed's default, pinned)
        zero["reduce_scatter"] = True
    ds = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.accum_steps(world_size),
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # our own metrics line replaces DeepSpeed's
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        # ZeRO-Offload would otherwise insist on DeepSpeed's CPU Adam (a JIT build of cpu_adam) and
        # refuse our torch AdamW; torch's AdamW steps the offloaded fp32 partition on the CPU
        "zero_force_ds_cpu_optimizer": False,
    }
    if p.reduce_dtype is not None:
        ds["communication_data_type"] = p.reduce_dtype
    if t.precision == "bf16":
        # immediate_grad_update: DeepSpeed's bf16 optimizer (ZeRO-1 with fp32 accumulation) adds
        # each micro-batch's bf16 gradient into the fp32 buffer in the backward hook
        ds["bf16"] = {"enabled": True, "immediate_grad_update": True}
        if p.zero_stage >= 1:
            # accumulate gradients over micro-batches in fp32 (ZeRO-1/2 keep an fp32 gradient
            # partition, ZeRO-3 an fp32 accumulation buffer) rather than in bf16, which DeepSpeed
            # itself calls "not safe numerically". ZeRO-0 cannot: its DDP bf16 wrapper raises
            # NotImplementedError for bf16 params with fp32 accumulation (engine.py,
            # _do_optimizer_sanity_check, DeepSpeed 0.19.8)
            ds["data_types"] = {"grad_accum_dtype": "fp32"}
    elif t.precision == "fp16":
        ds["fp16"] = {"enabled": True, "initial_scale_power": 16, "loss_scale_window": 1000}
    return ds
