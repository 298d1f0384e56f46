"""`--dry-run`: build the model on the meta device and report sizes, FLOPs and memory; no training.

Memory estimate per data-parallel rank (bytes), for AdamW under ZeRO with world size W:
    weights      P x w        (/ W at stage 3)       w = 4 (fp32) or 2 (bf16/fp16)
    gradients    T x g        (/ W at stage >= 2)    T = trainable parameters; g = w, or 4 when
                                                    w = 2 at stage >= 1 (fp32 accumulation,
                                                    data_types.grad_accum_dtype in the DeepSpeed JSON)
    fp32 master  T x 4 when w = 2 (/ W at stage >= 1)
    Adam m, v    T x 8        (/ W at stage >= 1)
    activations  L x s x b x h x 34 x (w / 2)        (Korthikanti et al. 2022, "Reducing Activation
                 Recomputation in Large Transformer Models", eq. 1, with the 5 a s^2 b attention-
                 matrix term dropped because our attention never materializes it)
    norm_fp32    (2 L + 1) x s x b x h x 4 when w = 2: megatron's local spec runs torch's composite
                 RMSNorm, which upcasts its input to fp32 and keeps that copy for the backward
                 (two norms per layer and the final one), on top of the bf16 input in the 34
    logits       s x b x V x (4 + 2 when w = 2): megatron's unfused cross-entropy
                 (tensor_parallel/cross_entropy.py) turns the [s, b, V] logits into an fp32 copy
                 and saves its softmax for the backward, while the bf16 logits are still alive
Activation checkpointing (train.activation_checkpointing) keeps only each layer's input [s, b, h]
(L x s x b x h x w) plus one layer's 34 x s x b x h x (w / 2) recomputed during the backward, and
norm_fp32 becomes 3 x s x b x h x 4 (that layer's two norms and the final one).
Ulysses sequence parallelism of size N (parallel.ulysses_size) divides every s-dependent term
(activations, norm_fp32, logits) by N: each rank holds s/N tokens outside attention and, inside it,
h/N heads of the whole sequence (the same s x b x h / N values); the ZeRO terms stay divided by the
whole world W, over which DeepSpeed partitions (the sequence-data-parallel group).
A rough guide for choosing micro batch, ZeRO stage and N, not a measurement.
"""
from __future__ import annotations

import os

import yaml

from lenext_dist.config import RunConfig, to_dict


def _gb(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def memory_estimate(cfg: RunConfig, total: int, trainable: int, world: int) -> dict[str, float]:
    w = 4 if cfg.train.precision == "fp32" else 2
    z = cfg.parallel.zero_stage
    m = cfg.model
    s = m.seq_length // cfg.parallel.ulysses_size  # tokens per rank outside attention
    sbh = s * cfg.train.micro_batch_size * m.hidden_size  # one [s/N, b, h] tensor
    est = {
        "weights": total * w / (world if z >= 3 else 1),
        "gradients": trainable * (4 if w == 2 and z >= 1 else w) / (world if z >= 2 else 1),
        "fp32_master": (trainable * 4 if w == 2 else 0) / (world if z >= 1 else 1),
        "adam_states": trainable * 8 / (world if z >= 1 else 1),
        "activations": (sbh * (m.num_layers * w + 34 * w / 2) if cfg.train.activation_checkpointing
                        else sbh * m.num_layers * 34 * w / 2),
        # checkpointing: only the recomputed layer's two norms and the final one are live
        "norm_fp32": (sbh * (3 if cfg.train.activation_checkpointing else 2 * m.num_layers + 1) * 4
                      if w == 2 else 0.0),
        "logits": s * cfg.train.micro_batch_size * m.vocab_size * (4 + (2 if w == 2 else 0)),
    }
    if cfg.parallel.offload_optimizer:
        est["fp32_master"] = est["adam_states"] = 0.0  # in host memory instead
    est["total"] = sum(est.values())
    return est


def dry_run(cfg: RunConfig, world: int | None = None) -> dict:
    """Print the resolved config and the model's numbers; returns them (used by tests)."""
    from lenext_dist.attention import temperature
    from lenext_dist.attention.layout import describe, labels
    from lenext_dist.model import (build_model, flops_per_token, init_megatron,
                                   init_single_process_group, parameter_counts)
    from lenext_dist.train.optim import freeze_for_mode

    world = world or int(os.environ.get("WORLD_SIZE", 1))
    n = cfg.parallel.ulysses_size
    dp = cfg.parallel.data_parallel_size(world)  # the world must split into sequence groups
    accum = cfg.train.accum_steps(dp)  # validates the batch arithmetic for this world size
    init_single_process_group()  # megatron's parallel state needs a group even on the meta device
    init_megatron(cfg.train.seed)
    model = build_model(cfg, device="meta")
    freeze_for_mode(model, cfg)
    counts = parameter_counts(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    fpt = flops_per_token(cfg)
    mem = memory_estimate(cfg, counts["total"], trainable, world)
    print("# resolved config")
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())
    print("\n# dry run (meta device, nothing allocated)")
    print(f"parameters: {counts['total']:,} total ({counts['total'] / 1e9:.3f}B), "
          f"{counts['embedding']:,} embedding, {counts['non_embedding']:,} non-embedding")
    heads = cfg.model.num_layers * cfg.model.num_attention_heads
    print(f"attention heads: {heads} ({cfg.model.num_layers} layers x {cfg.model.num_attention_heads}"
          f" heads) = HeadScale's per-head scales, here {counts['head_scales']:,} parameters "
          f"({'trainable' if cfg.attention.head_scale.trainable else 'fixed'} when enabled)")
    names = cfg.layer_positions
    specs = cfg.layer_specs
    t = cfg.attention.temperature
    print(f"attention: {cfg.attention.position}, layout {cfg.attention.layout.kind}: layers "
          f"{describe(labels(specs))}"
          + ("" if t.kind == "none" else f"; temperature {temperature.describe(t)}"))
    print(f"trainable: {trainable:,} ({cfg.train.mode} mode)")
    print(f"FLOPs/token: {fpt:.4e} (PaLM 6N + 12LHQT); per step: "
          f"{fpt * cfg.train.global_batch_size * cfg.model.seq_length:.4e}")
    print(f"batch: micro {cfg.train.micro_batch_size} x accum {accum} x dp {dp} (ulysses {n}) = "
          f"{cfg.train.global_batch_size} sequences of {cfg.model.seq_length}")
    print(f"memory estimate per rank (ZeRO-{cfg.parallel.zero_stage}, {cfg.train.precision}, W={world}, "
          f"ulysses {n}: {cfg.model.seq_length // n:,} of {cfg.model.seq_length:,} tokens per rank): "
          + ", ".join(f"{k} {_gb(v)}" for k, v in mem.items()))
    per_stage = _stages(cfg, counts["total"], trainable, world, dp) if cfg.train.stages else []
    return {"counts": counts, "trainable": trainable, "flops_per_token": fpt, "memory": mem,
            "layers": names, "stages": per_stage}


def _stages(cfg: RunConfig, total: int, trainable: int, world: int, dp: int) -> list[dict]:
    """Every stage of train.stages: its settings, FLOPs and memory (the model's parameters are the
    same in every stage; its length, batch and RoPE base change)."""
    from lenext_dist.config import stages
    from lenext_dist.model import flops_per_token

    print(f"\n# length stages (train.stages): {len(cfg.train.stages) + 1}")
    out = []
    for k in range(len(cfg.train.stages) + 1):
        s = stages.stage_config(cfg, k)
        accum = s.train.accum_steps(dp)  # the batch arithmetic of every stage at this world size
        fpt = flops_per_token(s)
        mem = memory_estimate(s, total, trainable, world)
        print(stages.describe(cfg, k))
        print(f"  FLOPs/token {fpt:.4e}, per step {fpt * s.train.global_batch_size * s.model.seq_length:.4e}; "
              f"micro {s.train.micro_batch_size} x accum {accum} x dp {dp}; memory per rank "
              + ", ".join(f"{k} {_gb(v)}" for k, v in mem.items()))
        out.append({"flops_per_token": fpt, "memory": mem, "seq_length": s.model.seq_length,
                    "global_batch_size": s.train.global_batch_size})
    return out
