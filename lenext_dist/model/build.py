"""Build the megatron-core GPTModel of a run (TinyLlama shape) with our core attention.

The only place that constructs megatron model code (megatron-core deprecates GPTModel in 0.19:
keep the blast radius here). Shape, from cfg.model: SwiGLU (gated_linear_unit + silu), RMSNorm,
no biases, GQA via num_query_groups, untied embeddings unless model.tie_embeddings, no dropout.
`position_embedding_type="none"` ALWAYS: positions (RoPE and its scalings, ...) enter inside
`LenextCoreAttention` through the attention registry, the same code the HF export runs.

Forward contract (megatron GPTModel):
    model(input_ids [b, s] long, position_ids [b, s] long, attention_mask=None, labels=[b, s] long)
        -> per-token loss [b, s] fp32            (without labels: logits [b, s, vocab])
position_ids are ignored (positions 0..s-1 inside core attention, or from each document's
start); attention_mask is None (causal inside core attention) or document ids [b, s] long
(data.document_mask: attention inside each packed document, see model/core_attention.py).
"""
from __future__ import annotations

import contextlib
from typing import Optional, Union

import torch
import torch.nn.functional as F

from lenext_dist.attention import layer_qk_norms, layer_variants
from lenext_dist.attention.names import HEAD_SCALE_KEY

from .megatron_env import accelerator_name


def transformer_config(cfg, *, device: Optional[str] = None):
    """megatron TransformerConfig for cfg (a RunConfig). device: 'meta' skips initialization."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    mc = cfg.model
    bf16 = cfg.train.precision == "bf16"
    fp16 = cfg.train.precision == "fp16"
    device = device or accelerator_name()
    # megatron's torch.compile fusions (megatron/core/jit.py: jit_fuser = torch.compile) need
    # nothing beyond torch: fused SwiGLU, bias-dropout-add and the "native" fused cross-entropy.
    # On CUDA only (CPU and the meta dry run keep the unfused ops the tests measure); the ones that
    # need Apex / Transformer Engine kernels (gradient_accumulation_fusion, persist_layer_norm)
    # and those our attention never reaches (masked softmax, RoPE) stay off everywhere.
    fuse = device == "cuda" and cfg.train.fused_kernels
    return TransformerConfig(
        num_layers=mc.num_layers,
        hidden_size=mc.hidden_size,
        num_attention_heads=mc.num_attention_heads,
        num_query_groups=mc.kv_heads,
        kv_channels=mc.head_dim,
        ffn_hidden_size=mc.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=mc.norm_epsilon,
        gated_linear_unit=True,  # SwiGLU: linear_fc1 = [gate; up], act(gate) * up
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=mc.init_method_std,
        softmax_scale=None,  # our scale is LenextCoreAttention.head_scale only
        params_dtype=torch.bfloat16 if bf16 else (torch.float16 if fp16 else torch.float32),
        bf16=bf16,
        fp16=fp16,
        # CPU: params are created on CPU (the GPU path calls torch.cuda.current_device());
        # meta: created under torch.device("meta") and never initialized.
        use_cpu_initialization=device in ("cpu", "meta"),
        perform_initialization=device != "meta",
        # fusions (DESIGN.md section 8): see `fuse` above
        bias_activation_fusion=fuse,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        bias_dropout_fusion=fuse,
        cross_entropy_loss_fusion=fuse,
        cross_entropy_fusion_impl="native",
    )


def layer_spec(cfg):
    """megatron's local GPT layer spec (RMSNorm) with core_attention swapped for ours; layer i
    (megatron's 1-based layer_number) gets the position variant attention.layout gives it and
    its QK-norm (attention.qk_norm; inside our core attention, so the export runs the same)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from .core_attention import core_attention_builder

    mc, att = cfg.model, cfg.attention
    hs = att.head_scale
    variants = layer_variants(att, num_layers=mc.num_layers, head_dim=mc.head_dim,
                              train_length=mc.train_length, num_heads=mc.num_attention_heads)
    qk_norms = layer_qk_norms(att, num_layers=mc.num_layers, head_dim=mc.head_dim,
                              norm_eps=mc.norm_epsilon)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = core_attention_builder(
        variants=variants, qk_norms=qk_norms,
        init_scale=cfg.head_scale_init if hs.enabled else att.scale_c,
        learned=hs.enabled,
        trainable=hs.enabled and hs.trainable,
    )
    return spec


def build_model(cfg, device: Union[str, torch.device, None] = None):
    """The GPTModel of cfg (a RunConfig) on `device` (default: DeepSpeed's accelerator).

    device="meta": parameters on the meta device (no memory, no init; the dry run and parameter
    counts of the full-size model). Needs `init_megatron` (megatron's parallel groups) first.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel

    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("build_model needs init_megatron(seed) first (after torch.distributed "
                           "is up; init_single_process_group() makes a 1-rank group)")
    dev = torch.device(device) if device is not None else torch.device(accelerator_name())
    config = transformer_config(cfg, device=dev.type)
    mc = cfg.model
    # CUDA: megatron places params on torch.cuda.current_device() itself; CPU/meta: the ambient
    # default device decides where torch.empty(...) inside megatron lands.
    ctx = torch.device(dev) if dev.type in ("cpu", "meta") else contextlib.nullcontext()
    with ctx:
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(cfg),
            vocab_size=mc.vocab_size,
            max_sequence_length=mc.seq_length,
            pre_process=True,
            post_process=True,
            parallel_output=True,  # TP = 1: the full vocabulary anyway
            share_embeddings_and_output_weights=mc.tie_embeddings,
            position_embedding_type="none",
        )
    if cfg.train.activation_checkpointing:
        _recompute_layers(model)
    return model


def _recompute_layers(model) -> None:
    """Activation checkpointing per transformer layer with torch.utils.checkpoint (non-reentrant).

    megatron's own recompute forks its CUDA RNG tracker and fails on CPU; our layers have no
    dropout, so plain torch recomputation gives identical gradients on every device. Only the
    layer inputs [s, b, h] are kept per layer; everything inside is recomputed in backward.
    """
    from torch.utils.checkpoint import checkpoint

    for layer in model.decoder.layers:
        def forward(*args, _inner=layer.forward, **kwargs):
            if not torch.is_grad_enabled():
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward


def head_scale_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, Parameter) of every learned per-head scale (empty unless head_scale.enabled)."""
    return [(n, p) for n, p in model.named_parameters() if n.endswith(HEAD_SCALE_KEY)]
