"""Stock exports: a checkpoint as a transformers architecture that loads WITHOUT remote code.

`STOCK_FORMS` maps the set of position variants a run's layers use (attention.position over
attention.layout, `RunConfig.layer_positions`) to the stock architecture that computes exactly
the same function (DESIGN.md section 10):

    {nope}       -> SmolLM3ForCausalLM, `no_rope_layers` all 0 (every layer NoPE); a sliding
                    window W as SmolLM3's `use_sliding_window` + `sliding_window` W with every
                    layer "sliding_attention" (both mask q - k < W: the last W tokens, itself
                    included; transformers.masking_utils.sliding_window_overlay)
    {rope}       -> LlamaForCausalLM with `rope_parameters` from `ROPE_PARAMETERS` (PI, NTK,
                    YaRN); with a window W, MistralForCausalLM (`sliding_window` W on every layer)
    {nope, rope} -> SmolLM3ForCausalLM with `no_rope_layers[i]` = 1 for a RoPE layer, 0 for a
                    NoPE one (interleaved NoPE: SmolLM3's own pattern, any other layout too),
                    `rope_parameters` as for Llama, the window as `layer_types`
                    "sliding_attention" on the layers it applies to (every layer, or
                    local_global's local RoPE layers with full-attention global NoPE layers)
    any of these with chunked attention or the llama4 temperature (Llama 4's iRoPE: chunked RoPE
    layers, global NoPE layers scaled by its temperature) -> Llama4ForCausalLM (text model, dense
                    MLPs: `moe_layers` [], `intermediate_size_mlp`; `no_rope_layers`,
                    `attention_chunk_size` C on exactly the RoPE layers, `attn_temperature_tuning`
                    with floor_scale and attn_scale; q/k rows permuted to Meta's RoPE pair layout);
                    also for Llama 4's weightless QK-norm on exactly the RoPE layers (`use_qk_norm`)
    {rope} with attention.qk_norm `rms` on every layer -> Qwen3ForCausalLM (q_norm / k_norm)
    {rope} with attention.rope.fraction < 1 -> GlmForCausalLM (partial_rotary_factor, its
                    interleaved pairs, fused gate_up_proj)

Every other set (ALiBi, KERPLE, Sandwich, XPOS in any layer, and any variant added later) has
no entry and is refused by `refusal()`, as are the options no stock form expresses (temperature
schedules other than a foldable uniform c and Llama 4's own, any other non-default attention
field).

Scales fold into q_proj (or q_norm.weight on QK-normed layers), and each form's weight layout is
applied, in stock_weights.py; RoPE settings map to transformers' rope_parameters in stock_rope.py.

The config records what was folded in under `lenext_provenance` (a field every stock loader
ignores): the variant, the layout and each layer's variant, rope settings, window, c, the per-head
scales (full table and summary), the training length and the source checkpoint. `verify` and `lenext eval` read it back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor

from lenext_dist.attention.qknorm import layer_kinds
from lenext_dist.attention.temperature import llama4_options

from .stock_rope import ROPE_PARAMETERS, with_scaling
from .stock_weights import (fold_head_scales, fold_into_qk_norm, folded_scales, glm_weights,
                            meta_pairs as _meta_pairs)

STOCK_FORMAT = 1
PROVENANCE = "lenext_provenance"
"""The config.json field of a stock export that records what was folded in (one home)."""

# ------------------------------------------------------------------ the forms


@dataclass(frozen=True)
class StockForm:
    architecture: str
    """transformers class name written to config.json `architectures` (`config` may choose a
    sibling: RoPE with a window is MistralForCausalLM)."""
    config: Callable[..., object]
    """(run cfg, common kwargs) -> the transformers config object."""
    refuse: Callable[..., Optional[str]]
    """run cfg -> why this form cannot express it, or None."""
    claims: Callable[..., bool] = lambda cfg: True
    """run cfg -> whether this form is the one for it (the first claiming form of its set wins)."""
    weights: Callable[[dict, object], dict] = lambda state, cfg: state
    """(HF Llama-named state, run cfg) -> the state under this architecture's names/layouts."""
    temperatures: tuple[str, ...] = ("none", "uniform")
    """attention.temperature kinds it expresses (uniform: folded into q_proj)."""


def _smollm3_config(cfg, common: dict):
    """SmolLM3ForCausalLM: `no_rope_layers[i]` 1 = RoPE layer, 0 = NoPE layer (modeling_smollm3:
    `self.use_rope`); the window W as `use_sliding_window` + `sliding_window` W with explicit
    `layer_types`: "sliding_attention" on every layer the window applies to (all of them, or
    local_global's local ones; SmolLM3's default would put it on its NoPE layers only)."""
    from transformers import SmolLM3Config

    a = cfg.attention
    params, common = with_scaling(cfg, common)  # NoPE-only: unused, but the module is built
    return SmolLM3Config(
        **common, no_rope_layers=[int(x == "rope") for x in cfg.layer_positions],
        use_sliding_window=a.window is not None, sliding_window=a.window,
        layer_types=["full_attention" if w is None else "sliding_attention"
                     for w in cfg.layer_windows],
        rope_parameters=params)


def _rope_config(cfg, common: dict):
    """LlamaForCausalLM; with a window MistralForCausalLM (Llama-shaped, `sliding_window` on
    every layer, the same mask q - k < W)."""
    from transformers import LlamaConfig, MistralConfig

    a, m = cfg.attention, cfg.model
    params, common = with_scaling(cfg, common)
    if a.window is not None:
        common = {**common, "architectures": ["MistralForCausalLM"]}
        return MistralConfig(**common, head_dim=m.head_dim, rope_parameters=params,
                             sliding_window=a.window)
    return LlamaConfig(**common, head_dim=m.head_dim, rope_parameters=params)


def _rope_refuse(cfg) -> Optional[str]:
    r = cfg.attention.rope
    if r.scaling not in ROPE_PARAMETERS:
        return f"rope.scaling {r.scaling!r} has no transformers rope_parameters equivalent"
    return None


def _refuse_qk_norm(cfg, arch: str) -> Optional[str]:
    q = cfg.attention.qk_norm
    if q.kind != "none":
        return (f"{arch} has no QK-norm (attention.qk_norm {q.kind!r} on {q.layers} layers; "
                "stock forms: Llama4ForCausalLM for l2 on the RoPE layers, Qwen3ForCausalLM for "
                "rms on every RoPE layer)")
    return None


def _refuse_partial(cfg, arch: str) -> Optional[str]:
    f = cfg.attention.rope.fraction
    if f != 1.0:
        return (f"{arch} rotates every dim of a head (attention.rope.fraction {f}; the stock form "
                "of partial RoPE is GlmForCausalLM, every layer RoPE without QK-norm or window)")
    return None


def _qk_norm_eps(cfg, arch: str) -> Optional[str]:
    """The stock qk norms use config.rms_norm_eps (model.norm_epsilon)."""
    eps = cfg.attention.qk_norm.eps
    if eps is not None and eps != cfg.model.norm_epsilon:
        return (f"{arch}'s QK-norm epsilon is rms_norm_eps: attention.qk_norm.eps {eps} differs "
                f"from model.norm_epsilon {cfg.model.norm_epsilon}")
    return None


def _plain(arch: str, refuse: Callable[..., Optional[str]]) -> Callable[..., Optional[str]]:
    """`refuse` after the refusals of a form without QK-norm and partial RoPE."""
    return lambda cfg: _refuse_qk_norm(cfg, arch) or _refuse_partial(cfg, arch) or refuse(cfg)


def _llama_refuse(cfg) -> Optional[str]:
    if len(set(cfg.layer_windows)) > 1:  # Mistral's sliding_window is on every layer
        return "RoPE layers with different windows (attention.layout) have no Llama/Mistral form"
    return _rope_refuse(cfg)


def _llama4_claims(cfg) -> bool:
    return (any(c is not None for c in cfg.layer_chunks) or cfg.attention.temperature.kind == "llama4"
            or cfg.attention.qk_norm.kind == "l2")


def _llama4_refuse(cfg) -> Optional[str]:
    a, t, q = cfg.attention, cfg.attention.temperature, cfg.attention.qk_norm
    arch = "Llama4ForCausalLM"
    if q.kind == "rms":
        return (f"{arch}'s QK-norm is weightless (attention.qk_norm.kind l2), not 'rms' (a "
                "learned weight: Qwen3ForCausalLM, every layer RoPE)")
    normed = [k is not None for k in layer_kinds(a, cfg.model.num_layers)]
    if q.kind == "l2" and normed != [x == "rope" for x in cfg.layer_positions]:
        return (f"{arch} normalizes q and k on exactly its RoPE layers (use_qk_norm and not a "
                "NoPE layer): attention.qk_norm.layers rope")
    why = _qk_norm_eps(cfg, arch) or _refuse_partial(cfg, arch)
    if why:
        return why
    if a.window is not None:
        return "Llama4ForCausalLM has no sliding window (attention.window)"
    if a.rope.scaling != "none":
        return f"rope.scaling {a.rope.scaling!r} with Llama 4's chunked layers is not verified"
    chunks = {c for x, _, c in cfg.layer_specs if x == "rope"}
    if chunks - {a.chunked} or any(c is not None for x, _, c in cfg.layer_specs if x == "nope"):
        return ("Llama4ForCausalLM chunks exactly its RoPE layers (attention.chunked on the RoPE "
                "layers, none on the NoPE ones: attention.layout irope)")
    if t.kind == "llama4" and (t.layers != "nope" or llama4_options(t)[0] % 1):
        return ("Llama 4's temperature scales its NoPE layers with an integer floor_scale "
                "(attention.temperature.layers nope)")
    return None


def _llama4_config(cfg, common: dict):
    """Llama4ForCausalLM (transformers modeling_llama4): `no_rope_layers[i]` 1 = RoPE, explicit
    `layer_types` ("chunked_attention" on the chunked RoPE layers), dense MLP layers
    (`moe_layers` [], so every layer is Llama4TextMLP of `intermediate_size_mlp`), `use_qk_norm`
    as trained (attention.qk_norm l2 on the RoPE layers: Llama4TextL2Norm there, eps rms_norm_eps;
    it normalizes after RoPE, ours before: the same function, see attention/qknorm.py), the
    temperature on the NoPE layers when attention.temperature is llama4."""
    from transformers import Llama4TextConfig

    a, m, t = cfg.attention, cfg.model, cfg.attention.temperature
    floor_scale, attn_scale = llama4_options(t)
    params, common = with_scaling(cfg, common)
    common = {k: v for k, v in common.items() if k != "mlp_bias"}  # Llama 4 has no such field
    return Llama4TextConfig(
        **common, head_dim=m.head_dim, intermediate_size_mlp=m.ffn_hidden_size, moe_layers=[],
        use_qk_norm=a.qk_norm.kind == "l2",
        no_rope_layers=[int(x == "rope") for x in cfg.layer_positions],
        # no chunked layer (QK-norm alone claims Llama 4): transformers builds the chunked mask
        # anyway and needs a size; its default stays, unused (every layer full_attention)
        **({} if a.chunked is None else {"attention_chunk_size": a.chunked}),
        layer_types=["full_attention" if c is None else "chunked_attention" for c in cfg.layer_chunks],
        attn_temperature_tuning=t.kind == "llama4", floor_scale=int(floor_scale),
        attn_scale=attn_scale,
        rope_parameters=params)


LLAMA4_MLP = (".mlp.", ".feed_forward.")
"""Our (Llama) name of the MLP module and Llama 4's, read both ways (export and import)."""


def llama4_rope_rows(key: str, w: Tensor, m, positions: list, inverse: bool = False) -> Tensor:
    """q/k_proj of a RoPE layer in Meta's pair layout (or back, `inverse`); others unchanged.
    m: the ModelConfig; positions: each layer's variant (RunConfig.layer_positions)."""
    for i, x in enumerate(positions):
        if x != "rope":
            continue
        for proj, heads in (("q_proj", m.num_attention_heads), ("k_proj", m.kv_heads)):
            if key == f"model.layers.{i}.self_attn.{proj}.weight":
                return _meta_pairs(w, heads, m.head_dim, inverse)
    return w


def _llama4_weights(state: dict, cfg) -> dict:
    """Llama 4's names (`feed_forward` for `mlp`) and pair layout on its RoPE layers."""
    ours, theirs = LLAMA4_MLP
    return {k.replace(ours, theirs): llama4_rope_rows(k, v, cfg.model, cfg.layer_positions)
            for k, v in state.items()}


def _qwen3_claims(cfg) -> bool:
    return cfg.attention.qk_norm.kind == "rms"


def _qwen3_refuse(cfg) -> Optional[str]:
    arch = "Qwen3ForCausalLM"
    if not all(layer_kinds(cfg.attention, cfg.model.num_layers)):
        return f"{arch} normalizes q and k on every layer (attention.qk_norm.layers all)"
    if cfg.attention.window is not None:
        return f"{arch} with a sliding window (attention.window) is not verified"
    return _qk_norm_eps(cfg, arch) or _refuse_partial(cfg, arch) or _rope_refuse(cfg)


def _qwen3_config(cfg, common: dict):
    """Qwen3ForCausalLM (transformers modeling_qwen3): Llama + `q_norm` / `k_norm`
    (Qwen3RMSNorm(head_dim), eps rms_norm_eps) on every layer's q and k per head, before RoPE,
    as our `rms` QK-norm; the same weight names."""
    from transformers import Qwen3Config

    m = cfg.model
    params, common = with_scaling(cfg, common)
    common = {k: v for k, v in common.items() if k != "mlp_bias"}  # Qwen3 has no such field
    return Qwen3Config(**common, head_dim=m.head_dim, rope_parameters=params,
                       use_sliding_window=False, layer_types=["full_attention"] * m.num_layers)


def _glm_claims(cfg) -> bool:
    return cfg.attention.rope.fraction != 1.0


def _glm_refuse(cfg) -> Optional[str]:
    if cfg.attention.window is not None:
        return "GlmForCausalLM has no sliding window (attention.window)"
    return _refuse_qk_norm(cfg, "GlmForCausalLM") or _rope_refuse(cfg)


def _glm_config(cfg, common: dict):
    """GlmForCausalLM (transformers modeling_glm): Llama-shaped (RMSNorm pre-norm, SwiGLU with a
    fused gate_up_proj, GQA) with partial RoPE: the first r = int(head_dim
    partial_rotary_factor) dims rotate, as ours, in interleaved pairs (2i, 2i + 1) (its
    `rotate_half` over x[..., 0::2], x[..., 1::2]): the weights are permuted to that (`_glm_weights`)."""
    from transformers import GlmConfig

    a, m = cfg.attention, cfg.model
    params, common = with_scaling(cfg, common)
    common = {k: v for k, v in common.items() if k != "mlp_bias"}  # GLM has no such field
    config = GlmConfig(**common, head_dim=m.head_dim,
                       rope_parameters={**params, "partial_rotary_factor": float(a.rope.fraction)})
    # its __post_init__ puts GLM's own eos ids (151329, ...: outside a small vocabulary) for a None
    config.eos_token_id = common["eos_token_id"]
    return config


_LLAMA4 = StockForm("Llama4ForCausalLM", _llama4_config, _llama4_refuse, claims=_llama4_claims,
                    weights=_llama4_weights, temperatures=("none", "uniform", "llama4"))

_SMOLLM3 = StockForm("SmolLM3ForCausalLM", _smollm3_config, _plain("SmolLM3ForCausalLM", _rope_refuse))
_QWEN3 = StockForm("Qwen3ForCausalLM", _qwen3_config, _qwen3_refuse, claims=_qwen3_claims)
_GLM = StockForm("GlmForCausalLM", _glm_config, _glm_refuse, claims=_glm_claims,
                 weights=glm_weights)

STOCK_FORMS: dict[frozenset, tuple[StockForm, ...]] = {
    frozenset({"nope"}): (_LLAMA4, _SMOLLM3),
    frozenset({"rope"}): (_LLAMA4, _QWEN3, _GLM,
                          StockForm("LlamaForCausalLM", _rope_config,
                                    _plain("LlamaForCausalLM", _llama_refuse))),
    frozenset({"nope", "rope"}): (_LLAMA4, _SMOLLM3),
}
"""The set of position variants a run's layers use (attention.layout over attention.position,
`RunConfig.layer_positions`) -> its stock forms, the first that claims the run wins (Llama 4 for
chunked attention, its temperature or its l2 QK-norm; Qwen3 for rms QK-norm; GLM for partial
RoPE). Sets without an entry are refused."""


def stock_form(cfg) -> Optional[StockForm]:
    """The stock form of the run `cfg` by its layers' variants and options, or None."""
    forms = STOCK_FORMS.get(frozenset(cfg.layer_positions), ())
    return next((f for f in forms if f.claims(cfg)), None)


_INFERENCE_IRRELEVANT = ("kerple", "sandwich", "xpos")
"""Attention fields that do not change the function of a NoPE/RoPE model besides the kernel
choices (AttentionConfig.KERNEL_FIELDS): the option sections of variants that have no stock form
(refused by name first)."""
_HANDLED = ("position", "scale_c", "head_scale", "rope", "window", "chunked", "temperature",
            "layout", "qk_norm")


def refusal(cfg) -> Optional[str]:
    """Why the run `cfg` (RunConfig) cannot be exported stock, or None. The message names the
    variant/option and points to the custom-code export."""
    from lenext_dist.attention.layout import describe, is_uniform
    from lenext_dist.config import AttentionConfig

    a = cfg.attention
    hint = "; export it with --format custom (loads with trust_remote_code=True)"
    form = stock_form(cfg)
    if form is None:
        names = cfg.layer_positions
        known = sorted("+".join(sorted(k)) for k in STOCK_FORMS)
        what = (f"attention.position {names[0]!r}" if is_uniform(names) else
                f"attention.layout {a.layout.kind!r} (layers: {describe(names)})")
        return (f"{what} has no exact stock transformers architecture (stock forms exist for "
                f"layers of {known}){hint}")
    if a.temperature.kind not in form.temperatures:
        return (f"attention.temperature {a.temperature.kind!r} (a per-position logit multiplier) "
                f"has no {form.architecture} form (it expresses {list(form.temperatures)}){hint}")
    if a.chunked is not None and form is not _LLAMA4:
        return f"attention.chunked has no {form.architecture} form{hint}"
    why = form.refuse(cfg)
    if why:
        return why + hint
    default = AttentionConfig(position=a.position)
    for f in dataclasses.fields(a):
        if f.name in _HANDLED + _INFERENCE_IRRELEVANT + AttentionConfig.KERNEL_FIELDS:
            continue
        if getattr(a, f.name) != getattr(default, f.name):
            return (f"attention.{f.name}={getattr(a, f.name)!r} is not known to have a stock "
                    f"form{hint}")
    return None


# ------------------------------------------------------------------ weights


def stock_state(cfg, hf_state: dict, scales: Tensor) -> dict:
    """The HF Llama-named state as the run's stock form stores it: scales folded into q_proj
    (`folded_scales`; into q_norm.weight on QK-normed layers, `fold_into_qk_norm`), then the
    form's names and layouts. ValueError when a scale has nowhere to go."""
    m = cfg.model
    state, rest = fold_into_qk_norm(cfg, hf_state, folded_scales(cfg, scales))
    folded = fold_head_scales(state, rest, m.num_attention_heads, m.head_dim)
    return stock_form(cfg).weights(folded, cfg)


# ------------------------------------------------------------------ config


def build_stock_config(cfg, *, scales: Tensor, scale_c: float, head_scale_source: str,
                       tok: Optional[dict], source: dict, dtype: str, tokenizer_note: str):
    """The transformers config (SmolLM3Config / LlamaConfig) of the run, provenance included."""
    m, a = cfg.model, cfg.attention
    form = stock_form(cfg)
    tok = tok or {}
    provenance = {
        "format": STOCK_FORMAT, "position": a.position,
        "layout": dataclasses.asdict(a.layout), "layer_positions": cfg.layer_positions,
        "layer_windows": cfg.layer_windows, "layer_chunks": cfg.layer_chunks,
        "temperature": dataclasses.asdict(a.temperature),
        "rope": dataclasses.asdict(a.rope), "window": a.window, "scale_c": float(scale_c),
        "head_scale_source": head_scale_source, "qk_norm": dataclasses.asdict(a.qk_norm),
        "head_scales_folded_into": ("q_proj" if not any(layer_kinds(a, m.num_layers)) else
                                    "q_proj, q_norm.weight on the QK-normed layers"),
        "head_scales_summary": {"min": float(scales.min()), "max": float(scales.max()),
                                "mean": float(scales.mean())},
        "head_scales": scales.tolist(), "train_length": m.train_length,
        "bos_at_document_start": bool(cfg.data.bos), "document_mask": bool(cfg.data.document_mask),
        "tokenizer": tokenizer_note, "source": source,
    }
    common = dict(
        architectures=[form.architecture], vocab_size=m.vocab_size, hidden_size=m.hidden_size,
        intermediate_size=m.ffn_hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads, num_key_value_heads=m.kv_heads,
        hidden_act="silu", rms_norm_eps=m.norm_epsilon,
        # the longest context trained: a staged run's last stage (seq_length) beyond its L
        # (train_length, stage 0's); serving engines read this as the model's length
        max_position_embeddings=max(m.seq_length, m.train_length),
        initializer_range=m.init_method_std, tie_word_embeddings=m.tie_embeddings,
        attention_bias=False, mlp_bias=False,
        # ids inside the vocabulary (SmolLM3's defaults are 128000+): None when no tokenizer
        bos_token_id=tok.get("bos"), eos_token_id=tok.get("eos"), pad_token_id=tok.get("pad"),
        # read by `lenext eval` for its BOS default (stock loaders ignore it)
        bos_at_document_start=bool(cfg.data.bos), dtype=dtype, **{PROVENANCE: provenance})
    config = form.config(cfg, common)
    setattr(config, PROVENANCE, {**provenance, "exported_as": config.architectures[0]})
    return config


def provenance(config) -> Optional[dict]:
    """The lenext_provenance dict of a loaded stock export's config (or a config.json dict)."""
    if isinstance(config, dict):
        return config.get(PROVENANCE)
    return getattr(config, PROVENANCE, None)


__all__ = ["STOCK_FORMS", "ROPE_PARAMETERS", "StockForm", "PROVENANCE", "refusal", "stock_form",
           "fold_head_scales", "fold_into_qk_norm", "folded_scales", "stock_state", "build_stock_config", "provenance"]
