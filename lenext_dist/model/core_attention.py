"""The core-attention module megatron's `SelfAttention` calls: our variant math from
`lenext_dist.attention`, plugged in through `SelfAttentionSubmodules.core_attention`.

megatron (attention.py, `Attention.__init__`) builds it as
`core_attention(config=, layer_number=, attn_mask_type=, attention_type=, cp_comm_type=,
softmax_scale=, pg_collection=)` and calls it as
`core_attention(query, key, value, attention_mask, attn_mask_type=, attention_bias=,
packed_seq_params=)` with query [sq, b, np, hn] and key/value [sk, b, ng, hn] (after its
`get_query_key_value_tensors`; megatron's RotaryEmbedding is off: position_embedding_type
"none" always, rotation happens here). It returns [sq, b, np * hn].

Why not megatron's DotProductAttention: it materializes [b, np, sq, sk] scores (through a CUDA
`GlobalMemoryBuffer`), applies its causal mask on "cuda", and has only a scalar softmax_scale.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from lenext_dist.attention import HEAD_SCALE, Documents, PositionVariant
from lenext_dist.attention.precision import fp32_value

from . import ulysses
from .megatron_env import current_device


class LenextCoreAttention(MegatronModule):
    """Causal attention of one layer with a per-head multiplier m [np] (lambda_h = m_h / sqrt(hn)).

    Built by `core_attention_builder(variants=..., init_scale=..., ...)` (a closure over our run
    config, since megatron passes only its own kwargs; `variant` is this layer's, from
    attention.layout). `head_scale` is an fp32 Parameter when
    HeadScale is enabled, else a non-persistent buffer filled with the uniform scale c (so uniform
    and per-head scales run the same code; the buffer stays out of checkpoints since c is config).
    """

    # DeepSpeed 0.19 (engine._cast_module_mixed_precision, runtime/keep_in_fp32.py) keeps
    # *buffers* matching these names in fp32 when it casts a model to bf16: the uniform-scale
    # buffer stays exact. It casts every *parameter*, so a learned head_scale is bf16 under a
    # DeepSpeed bf16 engine; the forward reads its exact fp32 value through `fp32_value`
    # (kept beside it by lenext_dist/train/fp32_params.py).
    _keep_in_fp32_modules_strict = [HEAD_SCALE]

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection=None, *,
                 variant: PositionVariant, init_scale: float, learned: bool, trainable: bool,
                 qk_norm: Optional[tuple[torch.nn.Module, torch.nn.Module]] = None):
        super().__init__(config=config)
        if softmax_scale is not None or config.apply_query_key_layer_scaling:
            # our scale lives in head_scale only; megatron's would be applied a second time
            raise ValueError("LenextCoreAttention: set the scale through attention.scale_c / "
                             "head_scale, not TransformerConfig.softmax_scale")
        if attn_mask_type != AttnMaskType.causal or attention_type != "self":
            raise ValueError(f"only causal self-attention, got {attn_mask_type} {attention_type}")
        if config.context_parallel_size != 1 or config.tensor_model_parallel_size != 1:
            raise ValueError("tensor/context parallel size must be 1")
        self.layer_number = layer_number
        h = config.num_attention_heads
        # sequence parallelism (ulysses.py): the all-to-all around the variant's attention
        self.ulysses = (ulysses.UlyssesAttention(h, config.num_query_groups or h)
                        if ulysses.size() > 1 else None)
        # where megatron puts its own params: the ambient default device with
        # use_cpu_initialization (cpu, or meta under `torch.device("meta")`), else the
        # accelerator's current device (megatron: torch.cuda.current_device())
        device = None if config.use_cpu_initialization else current_device()
        # The position variant is a submodule under the fixed name `position`: a learned variant
        # (KERPLE) gets its own parameters per layer (`for_layer`), with state-dict keys
        # `...core_attention.position.<param>` (HF: `...self_attn.position.<param>`);
        # parameter-free variants are one object shared by all layers and add no keys.
        position = variant.for_layer()
        if device is not None and position is not variant:
            position = position.to(device)
        self.position = position
        # QK-norm (attention/qknorm.py): q_norm / k_norm submodules over the head dim, keys
        # `...core_attention.{q,k}_norm.weight` (HF: `...self_attn.{q,k}_norm.weight`, Qwen3's
        # names); applied here, before the variant rotates, as the HF model does. Not megatron's
        # q_layernorm submodules: the exported model must run the same code.
        if qk_norm is not None:
            q_norm, k_norm = (n.to(device=device, dtype=config.params_dtype) for n in qk_norm)
            self.q_norm, self.k_norm = q_norm, k_norm
        else:
            self.q_norm = self.k_norm = None
        m = torch.full((h,), float(init_scale), dtype=torch.float32, device=device)
        # a fixed uniform scale c reaches the kernel as a python float: SDPA's scale= c/sqrt(d),
        # no pass over q (paths.query_and_scale); the buffer stays for counts and the export
        self.uniform_scale = None if learned else float(init_scale)
        if learned:
            self.register_parameter(HEAD_SCALE, torch.nn.Parameter(m, requires_grad=trainable))
        else:
            self.register_buffer(HEAD_SCALE, m, persistent=False)

    @torch.no_grad()
    def set_uniform_scale(self, c: float) -> None:
        """Every head's scale to c (lambda = c / sqrt(d)), at evaluation: the buffer (or learned
        parameter) and, for a fixed scale, the number the kernel reads."""
        getattr(self, HEAD_SCALE).fill_(float(c))
        if self.uniform_scale is not None:
            self.uniform_scale = float(c)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None,
                attention_bias: Optional[Tensor] = None, packed_seq_params=None) -> Tensor:
        """query [sq, b, np, hn], key/value [sk, b, ng, hn] -> [sq, b, np * hn].

        attention_mask: None (causal attention over the whole sequence), or document ids [b, s]
        (an integer tensor, data.document_mask): causal attention inside each packed document,
        positions from each document's start (lenext_dist.attention.documents). megatron hands
        the model's attention_mask through to here untouched. A dense [b, 1, s, s] mask is refused.
        """
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("packed_seq_params / attention_bias are not supported "
                                      "(document masking takes document ids as attention_mask)")
        documents = _documents(attention_mask)
        if self.q_norm is not None:  # per head, over hn: before Ulysses' all-to-all and rotation
            query, key = self.q_norm(query), self.k_norm(key)
        sq, b, np_, hn = query.shape
        # [np] fp32 (under bf16 the exact value, fp32_params.py), or the uniform c as a float
        m = self.uniform_scale if self.uniform_scale is not None else fp32_value(self.head_scale)
        if self.ulysses is not None:
            # [s/N, b, np, hn] shards -> whole sequence, heads [lo, hi) -> [s/N, b, np, hn]
            heads = self.ulysses.heads
            self.position.heads = heads  # this rank's rows of a per-head bias table

            def local(q, k, v):  # [b, np/N, s, hn], whole sequence: global positions
                return self.position(q, k, v, ulysses.heads_slice(m, heads), documents=documents)

            return self.ulysses(query, key, value, local).reshape(sq, b, np_ * hn)
        # [s, b, n, hn] -> [b, n, s, hn]: SDPA's layout (a strided view; SDPA copies if needed)
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        # = attend(q, k, v, head_scale, position), called as a module so ZeRO-3 gathers its params
        out = self.position(q, k, v, m, documents=documents)  # [b, np, sq, hn]
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return out.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)

    def extra_repr(self) -> str:
        return f"layer={self.layer_number}"


_last_documents: list = []  # [(ids tensor, Documents)]: one per forward, shared by every layer


def _documents(attention_mask: Optional[Tensor]) -> Optional[Documents]:
    """Documents of the document ids every layer of one forward receives (built once per ids
    tensor, so the FlexAttention block mask is too)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.dtype.is_floating_point or \
            attention_mask.dtype == torch.bool:
        raise ValueError(f"attention_mask must be None or document ids [b, s] (integers), got "
                         f"{attention_mask.dtype} {tuple(attention_mask.shape)}")
    if _last_documents and _last_documents[0][0] is attention_mask:
        return _last_documents[0][1]
    docs = Documents(attention_mask)
    _last_documents[:] = [(attention_mask, docs)]
    return docs


def core_attention_builder(*, variants: list, qk_norms: Optional[list] = None, **bound):
    """A `CoreAttentionBuilder` (megatron's protocol: a callable taking its kwargs) that also
    passes our keyword arguments `bound` (init_scale, learned, trainable) and the variant and
    QK-norm of the layer being built: `variants[layer_number - 1]` (one per layer,
    attention.layout), `qk_norms[layer_number - 1]` ((q norm, k norm) or None, attention.qk_norm;
    default none)."""

    def build(**megatron_kwargs) -> LenextCoreAttention:
        i = megatron_kwargs["layer_number"] - 1  # megatron's global 1-based layer number
        if not 0 <= i < len(variants):
            raise ValueError(f"layer_number {i + 1} outside the {len(variants)} layers of the layout")
        return LenextCoreAttention(**megatron_kwargs, variant=variants[i],
                                   qk_norm=qk_norms[i] if qk_norms else None, **bound)

    return build
