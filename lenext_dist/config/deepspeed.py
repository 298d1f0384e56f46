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
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if p.zero_stage == 3:
        # Gather the full 16-bit weights on save so export needs no zero_to_fp32 pass.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
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
    if t.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        ds["fp16"] = {"enabled": True, "initial_scale_power": 16, "loss_scale_window": 1000}
    return ds
