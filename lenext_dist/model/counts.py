"""Parameter counts and FLOPs per token of a run's model, from the config alone (dry run) or a
built model (a test checks that both agree)."""
from __future__ import annotations

from typing import Union

import torch

from lenext_dist.attention.names import HEAD_SCALE_KEY
from lenext_dist.attention.qknorm import LEARNED, layer_kinds


def _counts_from_config(cfg) -> dict[str, int]:
    mc = cfg.model
    H, F, V, L = mc.hidden_size, mc.ffn_hidden_size, mc.vocab_size, mc.num_layers
    d, h, g = mc.head_dim, mc.num_attention_heads, mc.kv_heads
    attn = H * (h + 2 * g) * d + h * d * H  # fused QKV [(h + 2g) d, H] + output proj [H, h d]
    mlp = H * 2 * F + F * H  # linear_fc1 [2F, H] (gate; up) + linear_fc2 [H, F]
    norms = 2 * H  # input_layernorm + pre_mlp_layernorm (RMSNorm weights)
    heads = h if cfg.attention.head_scale.enabled else 0
    embedding = V * H
    output = 0 if mc.tie_embeddings else V * H
    # QK-norm's learned weights: [d] on q and on k of each layer it normalizes (rms kind)
    qk = 2 * d * sum(kind in LEARNED for kind in layer_kinds(cfg.attention, L))
    non_embedding = L * (attn + mlp + norms + heads) + qk + H + output  # + final norm
    return dict(total=embedding + non_embedding, embedding=embedding,
                non_embedding=non_embedding, head_scales=L * heads)


def _counts_from_model(model: torch.nn.Module) -> dict[str, int]:
    total = embedding = head_scales = 0
    for name, p in model.named_parameters():  # shared (tied) weights are listed once
        n = getattr(p, "ds_numel", p.numel())  # ZeRO-3 partitions p (numel 0); ds_numel is its size
        total += n
        if name.startswith("embedding."):
            embedding += n
        if name.endswith(HEAD_SCALE_KEY):
            head_scales += n
    return dict(total=total, embedding=embedding, non_embedding=total - embedding,
                head_scales=head_scales)


def parameter_counts(model_or_cfg: Union[torch.nn.Module, object]) -> dict[str, int]:
    """{total, embedding, non_embedding, head_scales} in parameters (numel).

    embedding = the input embedding only; the output layer counts as non-embedding (as in PaLM's
    N below). With tied embeddings the shared matrix counts once, as embedding.
    TinyLlama-1.1B: total 1,100,048,384 (+ 22 x 32 = 704 head_scales when head_scale.enabled).
    """
    if isinstance(model_or_cfg, torch.nn.Module):
        return _counts_from_model(model_or_cfg)
    return _counts_from_config(model_or_cfg)


def flops_per_token(cfg) -> float:
    """Training FLOPs per token (forward + backward), PaLM (Chowdhery et al. 2022) appendix B:

        6 N + 12 L H Q T

    N = all parameters except the input embedding (so the output layer's matmul is counted,
    and the input lookup, which is no matmul, is not); L layers, H query heads, Q head dim,
    T = sequence length (the attention score and value matmuls, counted over the full T x T
    square as PaLM does, i.e. without halving for the causal mask). Per-head scales are in N
    but negligible. The same for every attention variant and layout (attention.layout): a NoPE
    layer and a RoPE layer do the same matmuls (the rotation is elementwise, not counted).

    `train.mode: headscale` freezes every weight: the weight-gradient matmuls (2 N of the 6 N)
    are not computed, the activation gradients still are (the head scales sit in every layer),
    so 4 N + 12 L H Q T; counting 6 N there made the HeadScale runs report MFU above 100%.
    """
    mc = cfg.model
    n = parameter_counts(cfg)["non_embedding"]
    weight_passes = 4.0 if cfg.train.mode == "headscale" else 6.0
    return weight_passes * n + 12.0 * mc.num_layers * mc.num_attention_heads * mc.head_dim * mc.seq_length
