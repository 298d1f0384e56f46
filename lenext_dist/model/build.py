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

from typing import Optional, Union

import torch
import torch.nn.functional as F

from lenext_dist.attention import layer_qk_norms, layer_variants
from lenext_dist.attention.names import HEAD_SCALE_KEY

from .megatron_env import accelerator_name, current_device


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
        # its backward casts the logits' gradient to bf16 whatever their dtype
        # (megatron/core/fusions/fused_cross_entropy.py, calculate_gradients): bf16 runs only
        cross_entropy_loss_fusion=fuse and bf16,
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
    if dev.type not in ("cpu", "meta") and dev.index is None:
        dev = current_device()  # where megatron puts its params (e.g. cuda:3 from the launcher)
    config = transformer_config(cfg, device=dev.type)
    mc = cfg.model
    # CUDA: megatron places its own params on torch.cuda.current_device(); CPU/meta: the ambient
    # default device decides where torch.empty(...) inside megatron lands. Modules megatron builds
    # with neither device nor dtype (torch.nn.RMSNorm, transformer/torch_norm.py) follow the
    # ambient device on every device, and `place_parameters` below gives them params_dtype.
    with torch.device(dev):
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
    place_parameters(model, dev, config.params_dtype)
    if cfg.train.activation_checkpointing:
        _recompute_layers(model)
    return model


def documented_fp32(name: str) -> bool:
    """Parameters that stay fp32 in a bf16/fp16 model on purpose: HeadScale's m_h and the learned
    position variant's (KERPLE r1/r2, `...core_attention.position.<param>`); see
    attention/precision.py and train/fp32_params.py."""
    return name.endswith(HEAD_SCALE_KEY) or ".core_attention.position." in name


@torch.no_grad()
def place_parameters(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Every parameter on `device` in `dtype`, except `documented_fp32` ones (fp32, on `device`).

    Why: megatron creates torch.nn.RMSNorm with no device or dtype, so on CUDA its weights were
    left on the CPU in fp32 beside bf16 GPU weights (a device mismatch in any bare-model forward)
    and a bf16 run kept fp32 shadows of every norm weight (train/fp32_params.py). A moved
    parameter is a new Parameter with the old one's requires_grad and attributes; one shared by
    several modules stays shared.
    """
    device = torch.device(device)
    names = {id(p): n for n, p in model.named_parameters()}
    moved: dict[int, torch.nn.Parameter] = {}
    for mod in model.modules():
        for key, p in list(mod._parameters.items()):
            if p is None or id(p) not in names:
                continue
            want = torch.float32 if documented_fp32(names[id(p)]) else dtype
            if id(p) not in moved and (p.device != device or p.dtype != want):
                new = torch.nn.Parameter(p.detach().to(device=device, dtype=want),
                                         requires_grad=p.requires_grad)
                new.__dict__.update(p.__dict__)
                moved[id(p)] = new
            if id(p) in moved:
                mod._parameters[key] = moved[id(p)]
    for mod in model.modules():  # buffers: device only (the uniform head_scale stays fp32)
        for key, b in mod.named_buffers(recurse=False):
            if b is not None and b.device != device:
                mod._buffers[key] = b.to(device)


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
