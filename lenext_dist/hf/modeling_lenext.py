"""`LenextForCausalLM`: the HF model of an exported lenext checkpoint.

Shipped inside every export (loaded with `trust_remote_code=True`); imports only torch,
transformers and the attention math of the training code:

- in the repo, `.lenext_attention` is a shim re-exporting `lenext_dist.attention`;
- in an export, `lenext_attention.py` (+ `lenext_attention_*.py`) is a flattened verbatim copy
  of `lenext_dist/attention/` written by `lenext_dist.convert` (transformers' remote-code loader
  follows flat `from .x import` imports only, no sub-packages).

So the exported model runs the very function the megatron model was trained with:
`attend(q, k, v, head_scale, variant, positions)` (rotation of the position variant, per-head
scale lambda_h = head_scale[h] / sqrt(d), causal softmax, GQA).

Weights use Llama's names (`model.layers.N.self_attn.q_proj.weight`, ...) plus one fp32 buffer per
layer, `model.layers.N.self_attn.head_scale` [heads]. The config's `position` / `rope` fields choose
the variant, `attention_options.layout` which layers run it (attention/layout.py: e.g. every k-th
layer NoPE, the others RoPE; absent: every layer); a config without them, or with a name this code
does not know, is refused.

Eval-time knobs on a loaded model (see also `set_position`, `set_uniform_scale`,
`set_head_scales`): `from_pretrained(dir, trust_remote_code=True, position="rope",
rope={"base": 1e4, "scaling": "yarn", "factor": 4.0}, scale_c=...)` overrides config fields
before the model is built (scale_c only matters for weights without head_scale buffers).

Padding: right padding only (each attention_mask row is ones then zeros, as lm-evaluation-harness
pads log-likelihood batches): with causal attention a pad never reaches a real token, so the real
positions compute exactly what they compute unpadded; left padding (zeros before a one), padding
with a KV cache (use_cache=None is config.use_cache) and a mask that is not [batch, seq] (4-D)
raise. Batch rows share positions.

Packed documents: `forward(..., document_ids=ids)` with ids [b, s] (e.g.
`model.document_ids(input_ids)`: split after EOS and at BOS) keeps attention inside each document,
positions counted from its start, as training with data.document_mask did (no KV cache).
`config.document_mask` / `config.bos_at_document_start` record how the model was trained.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional, Union

import torch
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from .configuration_lenext import LenextConfig, check_lenext_config
from .lenext_attention import (HEAD_SCALE, POSITIONS, Documents, attend, build_position, document_ids,
                               layer_qk_norms as _layout_qk_norms, layer_variants as _layout_variants)


def _namespace(d):
    return SimpleNamespace(**{k: _namespace(v) if isinstance(v, dict) else v for k, v in d.items()})


def _attn_cfg(config: LenextConfig):
    """The run's attention section as attributes: registry name + rope settings + the other
    attention options of the run (`config.attention_options`: window, layout, variant sections)."""
    check_lenext_config(config, POSITIONS)
    return _namespace({**(config.attention_options or {}), "position": config.position,
                       "scale_c": float(config.scale_c), "rope": dict(config.rope)})


def _variant_kwargs(config: LenextConfig) -> dict:
    return dict(head_dim=config.head_dim, train_length=int(config.train_length),
                num_heads=config.num_attention_heads)


def build_variant(config: LenextConfig):
    """The PositionVariant of `config.position` (validated), with the run's attention options;
    the variant of every layer of a uniform layout (`layer_variants` gives each layer's)."""
    # transformers builds models under a meta default device; the variant's tables (RoPE inv_freq)
    # are real CPU tensors, moved to the activations' device lazily
    with torch.device("cpu"):
        return build_position(_attn_cfg(config), **_variant_kwargs(config))


def _has_state(variant) -> bool:
    return isinstance(variant, nn.Module) and any(True for _ in variant.state_dict())


def layer_variants(config: LenextConfig) -> list:
    """One variant per layer, from the run's `attention.layout` (attention_options.layout; none:
    every layer config.position): parameter-free variants are shared by the layers that run them
    (RoPE's cos/sin cache is then computed once per forward), a variant with per-layer state
    (KERPLE's learned r1, r2 at `model.layers.N.self_attn.position.*`) is one copy per layer."""
    with torch.device("cpu"):
        shared = _layout_variants(_attn_cfg(config), num_layers=config.num_hidden_layers,
                                  **_variant_kwargs(config))
        out, seen = [], set()
        for v in shared:  # for_layer: the object itself when parameter-free, else a fresh copy
            out.append(v.for_layer() if id(v) in seen else v)
            seen.add(id(v))
        return out


def layer_qk_norms(config: LenextConfig) -> list:
    """(q norm, k norm) or None per layer, from the run's attention.qk_norm
    (attention_options.qk_norm; none in exports made before QK-norm), eps null = rms_norm_eps."""
    with torch.device("cpu"):
        return _layout_qk_norms(_attn_cfg(config), num_layers=config.num_hidden_layers,
                                head_dim=config.head_dim, norm_eps=config.rms_norm_eps)


class LenextAttention(nn.Module):
    """Causal self-attention with the lenext variant math.

    Attributes used by evaluation code:
      head_scale  fp32 buffer [heads]: m_h, logits of head h are m_h / sqrt(d) q.k
      position    the PositionVariant (shared by all layers of a model)
    """

    def __init__(self, config: LenextConfig, layer_idx: int, position, qk_norm=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.register_buffer(HEAD_SCALE, torch.full((self.num_heads,), float(config.scale_c),
                                                    dtype=torch.float32))
        self.position = position
        # QK-norm (`q_norm.weight`/`k_norm.weight` for the rms kind): before the rotation
        self.q_norm, self.k_norm = qk_norm if qk_norm is not None else (None, None)

    def _apply(self, fn, recurse=True):
        # .to(bf16) / .half() must not round the scales nor a variant's learned parameters
        # (KERPLE's r1/r2, read in fp32: attention/precision.py): keep them fp32, move device only
        hs = self._buffers[HEAD_SCALE]
        learned = ({n: p.data for n, p in self.position.named_parameters()}
                   if isinstance(self.position, nn.Module) else {})
        super()._apply(fn, recurse)
        moved = self._buffers[HEAD_SCALE]
        if moved.dtype != torch.float32:
            self._buffers[HEAD_SCALE] = hs.to(device=moved.device, dtype=torch.float32)
        for n, p in (self.position.named_parameters() if learned else ()):
            if p.dtype != torch.float32 and learned[n].dtype == torch.float32:
                p.data = learned[n].to(device=p.device, dtype=torch.float32)
        return self

    def _project(self, hidden_states: Tensor, query_from: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states[:, query_from:]).view(b, s - query_from, self.num_heads,
                                                            self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:  # per head over d, before the rotation (and the cache)
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v  # [b, h, s - query_from, d], [b, g, s, d], [b, g, s, d]

    def qk(self, hidden_states: Tensor, positions: Union[Tensor, int] = 0) -> tuple[Tensor, Tensor]:
        """hidden_states [b, s, hidden] (this layer's attention input, i.e. after input_layernorm)
        -> (q [b, h, s, d], k [b, g, s, d]), rotated by the position variant at `positions`
        (int start or tensor [s]). Feed to `iter_attention_probs(q, k, self.head_scale,
        q_scale=self.position.query_scale(pos), score_mod=self.position.score_mod)`."""
        q, k, _ = self._project(hidden_states)
        return self.position.rotate(q, k, positions)

    def forward(self, hidden_states: Tensor, positions: Union[Tensor, int],
                past_key_values: Optional[Cache] = None, query_from: int = 0,
                documents: Optional[Documents] = None) -> Tensor:
        """hidden_states [b, s, hidden] -> [b, s - query_from, hidden]: the outputs of the queries
        query_from..s-1 only (keys and values of all s tokens; the cache, if any, gets all).
        documents: packed documents (positions then come from them; no cache, query_from 0)."""
        b, s, _ = hidden_states.shape
        q, k, v = self._project(hidden_states, query_from)
        sq = s - query_from
        if documents is not None:
            if past_key_values is not None or query_from:
                raise NotImplementedError("lenext: document_ids need a full forward without cache")
            out = attend(q, k, v, self.head_scale, self.position, documents=documents)
        elif past_key_values is None and not query_from:
            out = attend(q, k, v, self.head_scale, self.position, positions)
        else:
            # the keys rotated once, before the cache (RoPE/XPOS rotate k independently of q);
            # attend then turns the queries only
            _, k_rot = self.position.rotate(k, k, positions)
            k_all, v_all = (k_rot, v) if past_key_values is None else \
                past_key_values.update(k_rot, v, self.layer_idx)
            q_pos = positions[query_from:] if isinstance(positions, Tensor) else positions + query_from
            out = attend(q, k_all, v_all, self.head_scale, self.position, q_pos, keys_rotated=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, sq, self.num_heads * self.head_dim))

    def extra_repr(self) -> str:
        return f"layer={self.layer_idx}, position={self.position!r}"


class LenextDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)) (megatron GPT / Llama)."""

    def __init__(self, config: LenextConfig, layer_idx: int, position, qk_norm=None):
        super().__init__()
        self.self_attn = LenextAttention(config, layer_idx, position, qk_norm)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: Tensor, positions, past_key_values=None,
                query_from: int = 0, documents=None) -> Tensor:
        """[b, s, hidden] -> [b, s - query_from, hidden] (see LenextAttention.forward)."""
        hidden_states = hidden_states[:, query_from:] + self.self_attn(
            self.input_layernorm(hidden_states), positions, past_key_values, query_from, documents)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class LenextPreTrainedModel(PreTrainedModel):
    config_class = LenextConfig
    config: LenextConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["LenextDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, LenextAttention):
            from transformers import initialization as init

            init.constant_(module.head_scale, float(self.config.scale_c))


def _positions(position_ids: Optional[Tensor], past: int, s: int) -> Union[Tensor, int]:
    if position_ids is None:
        return past
    if position_ids.dim() == 2:
        if position_ids.shape[0] > 1 and not bool((position_ids == position_ids[:1]).all()):
            raise NotImplementedError("lenext: rows of a batch must share position_ids (no padding)")
        position_ids = position_ids[0]
    if position_ids.shape[0] != s:
        raise ValueError(f"position_ids has {position_ids.shape[0]} positions for {s} tokens")
    return position_ids


class LenextModel(LenextPreTrainedModel):
    def __init__(self, config: LenextConfig):
        super().__init__(config)
        variants = layer_variants(config)  # raises on an unusable config
        norms = layer_qk_norms(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList([LenextDecoderLayer(config, i, variants[i], norms[i])
                                     for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, past_key_values: Optional[Cache] = None,
                inputs_embeds: Optional[Tensor] = None, use_cache: Optional[bool] = None,
                output_hidden_states: Optional[bool] = None, hidden_from: int = 0,
                document_ids: Optional[Tensor] = None, **kwargs) -> BaseModelOutputWithPast:
        """hidden_from > 0: last_hidden_state [b, s - hidden_from, hidden] of the positions
        hidden_from.. only; the last layer then runs its queries, attention output and MLP on
        those positions alone (what scoring the tail of a window, or a prefill, needs).
        document_ids [b, s]: packed documents (see the module docstring)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("specify exactly one of input_ids or inputs_embeds")
        if attention_mask is not None and getattr(attention_mask, "ndim", None) != 2:
            # attention is causal and reads a [batch, seq] padding mask only: any other mask (a
            # 4-D one, a dict of them) would be ignored, not applied
            got = (f"{attention_mask.ndim}-D" if isinstance(attention_mask, Tensor)
                   else type(attention_mask).__name__)
            raise ValueError(f"lenext: attention_mask must be 2-D [batch, seq] (ones then zeros), "
                             f"got {got}")
        # before the padding check: use_cache=None with config.use_cache builds a cache too
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if attention_mask is not None and not bool(attention_mask.all()):
            # right padding is harmless under causal attention; a zero before a one is not
            right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
            if not right_padded or past_key_values is not None or use_cache:
                raise NotImplementedError(
                    "lenext: only right padding without a KV cache is supported (attention_mask rows "
                    "of ones then zeros, use_cache=False); use padding_side='right' or batches of "
                    "equal length")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        cache = past_key_values if use_cache or past_key_values is not None else None
        past = cache.get_seq_length() if cache is not None else 0
        positions = _positions(position_ids, past, inputs_embeds.shape[1])
        documents = None
        if document_ids is not None:
            if cache is not None or hidden_from or position_ids is not None:
                raise NotImplementedError("lenext: document_ids need use_cache=False and no "
                                          "position_ids (positions count from each document)")
            documents = Documents(document_ids.to(inputs_embeds.device))
        hidden = inputs_embeds
        all_hidden = [] if output_hidden_states else None
        if not 0 <= hidden_from < inputs_embeds.shape[1]:
            raise ValueError(f"hidden_from={hidden_from} is not a position of the "
                             f"{inputs_embeds.shape[1]} inputs")
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if all_hidden is not None:
                all_hidden.append(hidden)
            hidden = layer(hidden, positions, cache, hidden_from if i == last else 0, documents)
        hidden = self.norm(hidden)
        if all_hidden is not None:
            all_hidden.append(hidden)
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache,
                                       hidden_states=tuple(all_hidden) if all_hidden else None)


class LenextForCausalLM(LenextPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: LenextConfig):
        super().__init__(config)
        self.model = LenextModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def document_ids(self, input_ids: Tensor) -> Tensor:
        """[b, s] document ids of packed input_ids: a new document after each EOS and at each BOS
        (config.eos_token_id / bos_token_id), as training with data.document_mask split them."""
        eos = self.config.eos_token_id
        eos = eos[0] if isinstance(eos, list) else eos
        bos = self.config.bos_token_id if getattr(self.config, "bos_at_document_start", None) \
            else None  # BOS starts documents only where training put one before each
        return document_ids(input_ids, eos_id=eos, bos_id=bos)

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, past_key_values: Optional[Cache] = None,
                inputs_embeds: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                use_cache: Optional[bool] = None, logits_to_keep: Union[int, Tensor] = 0,
                output_hidden_states: Optional[bool] = None, return_dict: Optional[bool] = None,
                document_ids: Optional[Tensor] = None, **kwargs) -> CausalLMOutputWithPast:
        s = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        # an int logits_to_keep (generate's prefill: 1) also spares the last layer the rest
        hidden_from = s - logits_to_keep if isinstance(logits_to_keep, int) and \
            0 < logits_to_keep < s and not output_hidden_states and document_ids is None else 0
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=past_key_values,
                         inputs_embeds=inputs_embeds, use_cache=use_cache,
                         output_hidden_states=output_hidden_states, hidden_from=hidden_from,
                         document_ids=document_ids)
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        else:
            hidden = hidden[:, logits_to_keep]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size,
                                      **kwargs)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=out.past_key_values,
                                        hidden_states=out.hidden_states)
        return result if return_dict is not False else result.to_tuple()


# ---------------------------------------------------------------- eval-time helpers


def attention_layers(model: nn.Module) -> list[LenextAttention]:
    """Every LenextAttention of `model` (LenextForCausalLM or LenextModel), in layer order.
    (Matched by class name, so models loaded through remote code work too.)"""
    return [m for m in model.modules() if type(m).__name__ == "LenextAttention"]


@torch.no_grad()
def set_uniform_scale(model: nn.Module, c: float) -> None:
    """Every head of every layer: m_h = c (lambda = c / sqrt(d)); also records config.scale_c."""
    for attn in attention_layers(model):
        attn.head_scale.fill_(float(c))
    model.config.scale_c = float(c)
    model.config.head_scale_source = "uniform"


@torch.no_grad()
def set_head_scales(model: nn.Module, scales: Tensor) -> None:
    """scales [layers, heads] (any float dtype) -> each layer's fp32 head_scale buffer."""
    layers = attention_layers(model)
    scales = torch.as_tensor(scales)
    if tuple(scales.shape) != (len(layers), layers[0].num_heads):
        raise ValueError(f"head scales must have shape [{len(layers)}, {layers[0].num_heads}], "
                         f"got {tuple(scales.shape)}")
    for attn, row in zip(layers, scales):
        attn.head_scale.copy_(row.to(torch.float32))
    model.config.head_scale_source = "file"


def get_head_scales(model: nn.Module) -> Tensor:
    """[layers, heads] fp32 copy of the current head scales."""
    return torch.stack([a.head_scale.detach().float().cpu() for a in attention_layers(model)])


def set_position(model: nn.Module, position: Optional[str] = None, *,
                 rope: Optional[dict] = None, **options):
    """Switch every layer to another position variant / options at eval time, e.g.
    `set_position(model, "rope", rope={"scaling": "yarn", "factor": 4.0})` or
    `set_position(model, window=128)`; under a layout (attention_options.layout) `position` is the
    variant of the layers the layout does not make NoPE, `rope` reaches the RoPE layers, and
    `layout={...}` replaces the layout. Updates model.config (position, rope (given keys only),
    attention_options) and rebuilds the variants; returns the first layer's variant.
    Unknown names raise ValueError (the config is left unchanged). A variant with learned state
    (KERPLE) keeps its per-layer parameters when the variant class is unchanged."""
    cfg = model.config
    if "qk_norm" in options or "fraction" in (rope or {}):
        # trained into the weights (a norm's learned w, which dims carry position): not an
        # eval-time knob; the layers would otherwise keep the trained ones silently
        raise ValueError("attention qk_norm and rope.fraction are part of how the model was "
                         "trained; they cannot change at evaluation (export another checkpoint)")
    old = (cfg.position, cfg.rope, cfg.attention_options)
    cfg.position = cfg.position if position is None else position
    cfg.rope = {**cfg.rope, **(rope or {})}
    cfg.attention_options = {**(cfg.attention_options or {}), **options}
    try:
        variants = layer_variants(cfg)
    except Exception:
        cfg.position, cfg.rope, cfg.attention_options = old
        raise
    for attn, new in zip(attention_layers(model), variants):
        if _has_state(new) and type(new) is type(attn.position):
            new.load_state_dict(attn.position.state_dict())
        dev = next((t.device for t in attn.parameters()), None)
        attn.position = new.to(dev) if dev is not None and isinstance(new, nn.Module) else new
    return attention_layers(model)[0].position


def attention_inputs(model: nn.Module, input_ids: Tensor) -> list[Tensor]:
    """Run `model` on input_ids (no cache) and return each layer's attention input
    [b, s, hidden] (after input_layernorm), for `LenextAttention.qk`."""
    captured: list[Tensor] = []
    hooks = [a.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))
             for a in attention_layers(model)]
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return captured


__all__ = ["LenextForCausalLM", "LenextModel", "LenextPreTrainedModel", "LenextAttention",
           "LenextDecoderLayer", "build_variant", "attention_layers", "set_uniform_scale",
           "set_head_scales", "get_head_scales", "set_position", "attention_inputs"]
