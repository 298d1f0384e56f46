"""Optimizer, LR schedule and the per-head-scale constraint.

The optimizer is torch AdamW handed to DeepSpeed (nothing JIT-compiles; DeepSpeed wraps it in its
ZeRO optimizer). The LR is a pure function of the optimizer step, set on every step, so resume
needs no scheduler state and cannot drift.
"""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace
from typing import Optional

import torch

from lenext_dist.attention.names import HEAD_SCALE
from lenext_dist.config import OptimConfig, RunConfig


def cosine_lr(step: int, opt: OptimConfig, total_steps: int) -> float:
    """LR for 0-based optimizer step `step`: linear warmup to lr, then cosine to min_lr_ratio*lr."""
    if step < opt.warmup_steps:
        return opt.lr * (step + 1) / opt.warmup_steps
    span = max(1, total_steps - opt.warmup_steps)
    progress = min(1.0, (step - opt.warmup_steps) / span)
    floor = opt.lr * opt.min_lr_ratio
    return floor + (opt.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def is_head_scale(name: str) -> bool:
    return name.endswith(HEAD_SCALE)


def freeze_for_mode(model: torch.nn.Module, cfg: RunConfig) -> None:
    """HeadScale mode trains the per-head scales only; everything else is frozen."""
    if cfg.train.mode == "headscale":
        for name, p in model.named_parameters():
            p.requires_grad_(is_head_scale(name))


# megatron's GPTModel names its token embedding so; under tie_embeddings the output layer reads
# this same tensor (no separate output_layer.weight)
EMBEDDING = "embedding.word_embeddings.weight"


def is_embedding(name: str) -> bool:
    return name.endswith(EMBEDDING)


def param_groups(model: torch.nn.Module, weight_decay: float, no_decay_embeddings: bool = False) -> list[dict]:
    """AdamW groups: matrices decay; norms, biases and head scales do not (GPT-2/nanoGPT rule);
    with `no_decay_embeddings` the token embedding does not either (OLMo 2, SmolLM3). An untied
    output layer is a projection like any other matrix and keeps its decay."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        exempt = is_head_scale(name) or (no_decay_embeddings and is_embedding(name))
        (decay if p.ndim >= 2 and not exempt else no_decay).append(p)
    groups = [{"params": g, "weight_decay": wd} for g, wd in ((decay, weight_decay), (no_decay, 0.0)) if g]
    if not groups:
        raise ValueError("no trainable parameters (train.mode / attention.head_scale.trainable?)")
    return groups


def build_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    o = cfg.optim
    kind = {"fused": True} if o.fused else {"foreach": False}
    groups = param_groups(model, o.weight_decay, o.no_decay_embeddings)
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, **kind)


def build_engine(model: torch.nn.Module, cfg: RunConfig, world: int, mpu=None):
    """The DeepSpeed engine of `model` with our AdamW and the generated DeepSpeed config.

    On a single data-parallel rank with ZeRO-0 the engine's gradient "all-reduce" would still
    flatten every gradient into a bucket, reduce it over one rank and copy it back (~3% of a CPU
    step, measured by benchmarks/bench_train_step.py): nothing to average, so it is switched off
    (ZeRO 1-3 finalize their gradient partitions in that call and keep it).
    """
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    from lenext_dist.config import deepspeed_config

    from lenext_dist.train import fp32_params

    from deepspeed.utils import groups

    exact = fp32_params.capture(model)  # m_h, KERPLE: DeepSpeed casts them to bf16 below
    # mpu: Ulysses' groups (model/ulysses.py). DeepSpeed keeps the last engine's mpu in a module
    # global and sets it only when given one: clear it so that an engine without sequence
    # parallelism built later in the same process reduces over the whole world again
    groups.mpu = None
    dp = cfg.parallel.data_parallel_size(world)
    # the device init_distributed chose (index 0 for a task shown only its own GPU), where the
    # engine would set cuda:$LOCAL_RANK (engine._set_distributed_vars: "invalid device ordinal")
    acc = get_accelerator()
    args = None if acc.device_name() == "cpu" else SimpleNamespace(device_rank=acc.current_device())
    engine, *_ = deepspeed.initialize(args=args, model=model, optimizer=build_optimizer(model, cfg),
                                      config=deepspeed_config(cfg, dp), mpu=mpu)
    fp32_params.restore(engine, exact)
    if world == 1 and cfg.parallel.zero_stage == 0 and hasattr(engine, "enable_backward_allreduce"):
        engine.enable_backward_allreduce = False
    return engine


def release_engine(engine) -> None:
    """Free an engine's device memory now, while the process group it needs is still up.

    DeepSpeed's optimizer keeps gradient hooks that hold the engine after its last reference
    goes (gc.collect() does not free it): without this the next engine of the process, a stage
    of train.stages or a case of the GPU check, ran beside this one's weights, fp32 master and
    Adam states (found on an H100, 27 Nov; tests/unit/test_train_engine.py)."""
    engine.destroy()


@contextlib.contextmanager
def settings_kept(optimizer):
    """This run's optimizer settings (build_optimizer's) across a checkpoint load, which keeps only
    the state (moments, step). torch's Optimizer.load_state_dict, called by DeepSpeed's load at
    every ZeRO stage, replaces each param group's settings (betas, eps, weight_decay, the kernel)
    by the checkpoint's (torch/optim/optimizer.py, update_group), and DeepSpeed's ZeRO-1/2 and bf16
    optimizers take its gradient clipping (`clip_grad`: _load_global_state, _load_legacy_checkpoint):
    a changed optim.* was ignored on resume, and applied by a resume at another rank count (which
    loads no optimizer state dict, train/reshard.py)."""
    base = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed's wrappers hold torch's AdamW
    kept = [{k: v for k, v in g.items() if k != "params"} for g in base.param_groups]
    clip = getattr(optimizer, "clip_grad", None)
    yield
    for g, settings in zip(base.param_groups, kept, strict=True):
        g.update(settings)
    if clip is not None:
        optimizer.clip_grad = clip
    place_steps(base)


def place_steps(optimizer: torch.optim.Optimizer) -> None:
    """A fused (optim.fused, the default) or capturable AdamW reads its step on the parameter's
    device, fp32 (the CUDA kernel takes device pointers). torch's load_state_dict places it so by
    the saved groups' flags; a step loaded under others (or assigned, train/reshard.py) is moved."""
    for g in optimizer.param_groups:
        if g.get("fused") or g.get("capturable"):
            for p in g["params"]:
                state = optimizer.state.get(p, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(p.device, torch.float32)


def set_lr(optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


@torch.no_grad()
def grad_norm(model: torch.nn.Module) -> float:
    """Global L2 norm of the (already rank-averaged) gradients of a model that is not ZeRO-sharded."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()


@torch.no_grad()
def clamp_head_scales(module: torch.nn.Module, min_value: float) -> None:
    """m_h <- max(m_h, min_value) after an optimizer step (paper: the m_h >= 1 constraint).

    Under ZeRO the optimizer updates its own fp32 master copy and copies it into the module's
    parameters only after the next step, so clamping the module tensor alone would be undone.
    The clamp is elementwise, so each rank clamps every copy it holds: the master (DeepSpeed's
    safe_* accessors cover stages 1-3; bf16 under ZeRO-0 keeps masters they cannot reach, so the
    config refuses it), the ZeRO-3 partition `ds_tensor`, and `p.data`, the tensor the forward
    reads. Under ZeRO-3 small parameters such as these stay gathered ("persistent", below
    stage3_param_persistence_threshold) and are re-gathered from the unclamped partition inside
    the step, so `p.data` must be clamped as well; for a partitioned parameter it is empty.
    """
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    for name, p in module.named_parameters():
        if not (is_head_scale(name) and p.requires_grad):
            continue
        master = safe_get_full_fp32_param(p)
        if master is not None:
            safe_set_full_fp32_param(p, master.clamp(min=min_value))
        if hasattr(p, "ds_tensor"):
            p.ds_tensor.clamp_(min=min_value)
        p.data.clamp_(min=min_value)


def head_scale_matrix(engine) -> Optional[torch.Tensor]:
    """[layers, heads] fp32 per-head scales m_h, gathered under ZeRO-3 (collective: call on all
    ranks); None when the model has no learned head scales."""
    from deepspeed.utils import safe_get_full_fp32_param

    rows = []
    for name, p in engine.module.named_parameters():
        if is_head_scale(name):
            full = safe_get_full_fp32_param(p)
            rows.append((full if full is not None else p.data).detach().float().cpu())
    return torch.stack(rows) if rows else None


def head_scale_stats(matrix: torch.Tensor) -> dict[str, tuple[float, float, float]]:
    """{layer i: (min, mean, max)} of a [layers, heads] matrix of m_h, for the log line."""
    return {f"layer {i}": (r.min().item(), r.mean().item(), r.max().item()) for i, r in enumerate(matrix)}
