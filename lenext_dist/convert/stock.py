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
                    with floor_scale and attn_scale; q/k rows permuted to Meta's RoPE pair layout)

Every other set (ALiBi, KERPLE, Sandwich, XPOS in any layer, and any variant added later) has
no entry and is refused by `refusal()`, as are the options no stock form expresses (temperature
schedules other than a foldable uniform c and Llama 4's own, any other non-default attention
field).

Scales: a uniform c or HeadScale's m_h multiplies head h's logits m_h / sqrt(d) q.k; with
q = W_q x that is q' = (m_h W_q[h]) x, so the scales fold into q_proj's rows of head h
(`fold_head_scales`). RoPE rotations are linear, so the fold commutes with them. A `uniform`
temperature c folds the same way into the layers it scales (`folded_scales`).

The config records what was folded in under `lenext_provenance` (a field every stock loader
ignores): the variant, the layout and each layer's variant, rope settings, window, c, the per-head
scales (full table and summary), the training length and the source checkpoint. `verify` and `lenext eval` read it back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor

from lenext_dist.attention.temperature import applies, llama4_options

from .keymap import HF_HEAD_SCALE, HF_Q_PROJ

STOCK_FORMAT = 1
PROVENANCE = "lenext_provenance"
"""The config.json field of a stock export that records what was folded in (one home)."""

# ------------------------------------------------------------------ RoPE scalings -> HF


def _rope_none(r, head_dim: int, train_length: int) -> dict:
    return {"rope_type": "default", "rope_theta": float(r.base)}


def _rope_pi(r, head_dim: int, train_length: int) -> dict:
    # HF "linear": inv_freq / factor, our PI: base_inv_freq / factor (same expression)
    return {"rope_type": "linear", "rope_theta": float(r.base), "factor": float(r.factor)}


def _rope_ntk(r, head_dim: int, train_length: int) -> dict:
    # static NTK-aware = plain RoPE with base * s^(d/(d-2)); HF's "dynamic" is another method
    # (base recomputed from the running sequence length), so the base is folded instead
    d = head_dim
    return {"rope_type": "default", "rope_theta": float(r.base * r.factor ** (d / (d - 2)))}


def _rope_yarn(r, head_dim: int, train_length: int) -> dict:
    # transformers' _compute_yarn_parameters with our defaults (beta 32/1, truncate, mscale
    # 0.1 ln s + 1 on cos and sin) and original length = the training length L
    return {"rope_type": "yarn", "rope_theta": float(r.base), "factor": float(r.factor),
            "original_max_position_embeddings": int(train_length), "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": True}


ROPE_PARAMETERS: dict[str, Callable[..., dict]] = {
    "none": _rope_none, "pi": _rope_pi, "ntk": _rope_ntk, "yarn": _rope_yarn}
"""attention.rope.scaling (a name of lenext_dist.attention.rope.SCALINGS) -> transformers 5.23
`rope_parameters` giving the same inv_freq and cos/sin multiplier (tested against HF's own
functions); a scaling missing here is refused for stock."""

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


def _with_scaling(cfg, common: dict) -> tuple[dict, dict]:
    """(rope_parameters of attention.rope, common kwargs with the extended length when scaled)."""
    a, m = cfg.attention, cfg.model
    r = a.rope
    params = ROPE_PARAMETERS[r.scaling](r, m.head_dim, m.train_length)
    if r.scaling != "none":  # the extended length, informational (factor is given explicitly)
        common = {**common, "max_position_embeddings": int(m.train_length * r.factor)}
    return params, common


def _smollm3_config(cfg, common: dict):
    """SmolLM3ForCausalLM: `no_rope_layers[i]` 1 = RoPE layer, 0 = NoPE layer (modeling_smollm3:
    `self.use_rope`); the window W as `use_sliding_window` + `sliding_window` W with explicit
    `layer_types`: "sliding_attention" on every layer the window applies to (all of them, or
    local_global's local ones; SmolLM3's default would put it on its NoPE layers only)."""
    from transformers import SmolLM3Config

    a = cfg.attention
    params, common = _with_scaling(cfg, common)  # NoPE-only: unused, but the module is built
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
    params, common = _with_scaling(cfg, common)
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


def _llama_refuse(cfg) -> Optional[str]:
    if len(set(cfg.layer_windows)) > 1:  # Mistral's sliding_window is on every layer
        return "RoPE layers with different windows (attention.layout) have no Llama/Mistral form"
    return _rope_refuse(cfg)


def _llama4_claims(cfg) -> bool:
    return any(c is not None for c in cfg.layer_chunks) or cfg.attention.temperature.kind == "llama4"


def _llama4_refuse(cfg) -> Optional[str]:
    a, t = cfg.attention, cfg.attention.temperature
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
    (`moe_layers` [], so every layer is Llama4TextMLP of `intermediate_size_mlp`), no qk L2 norm
    (our layers have none), the temperature on the NoPE layers when attention.temperature is
    llama4."""
    from transformers import Llama4TextConfig

    a, m, t = cfg.attention, cfg.model, cfg.attention.temperature
    floor_scale, attn_scale = llama4_options(t)
    params, common = _with_scaling(cfg, common)
    common = {k: v for k, v in common.items() if k != "mlp_bias"}  # Llama 4 has no such field
    return Llama4TextConfig(
        **common, head_dim=m.head_dim, intermediate_size_mlp=m.ffn_hidden_size, moe_layers=[],
        use_qk_norm=False, no_rope_layers=[int(x == "rope") for x in cfg.layer_positions],
        # without attention.chunked no layer is chunked (layer_types), but Llama4TextModel builds
        # its chunked mask on every forward and fails on a null size: any size, read by no layer
        attention_chunk_size=a.chunked if a.chunked is not None else m.train_length,
        layer_types=["full_attention" if c is None else "chunked_attention" for c in cfg.layer_chunks],
        attn_temperature_tuning=t.kind == "llama4", floor_scale=int(floor_scale),
        attn_scale=attn_scale,
        rope_parameters=params)


def _meta_pairs(w: Tensor, heads: int, head_dim: int) -> Tensor:
    """Rows of q/k_proj [heads d, H] from our rotate-half RoPE pairs (i, i + d/2) to Meta's
    complex pairs (2i, 2i + 1) (modeling_llama4.apply_rotary_emb views the last dim as d/2
    complex numbers): new row 2i = old i, new 2i + 1 = old i + d/2, per head."""
    half = head_dim // 2
    perm = [j for i in range(half) for j in (i, i + half)]
    return w.view(heads, head_dim, -1)[:, perm].reshape(w.shape).contiguous()


def _llama4_weights(state: dict, cfg) -> dict:
    """Llama 4's names (`feed_forward` for `mlp`) and pair layout on its RoPE layers."""
    m = cfg.model
    out = {k.replace(".mlp.", ".feed_forward."): v for k, v in state.items()}
    for i, x in enumerate(cfg.layer_positions):
        if x != "rope":
            continue
        for proj, heads in (("q_proj", m.num_attention_heads), ("k_proj", m.kv_heads)):
            k = f"model.layers.{i}.self_attn.{proj}.weight"
            out[k] = _meta_pairs(out[k], heads, m.head_dim)
    return out


_LLAMA4 = StockForm("Llama4ForCausalLM", _llama4_config, _llama4_refuse, claims=_llama4_claims,
                    weights=_llama4_weights, temperatures=("none", "uniform", "llama4"))

STOCK_FORMS: dict[frozenset, tuple[StockForm, ...]] = {
    frozenset({"nope"}): (_LLAMA4, StockForm("SmolLM3ForCausalLM", _smollm3_config, _rope_refuse)),
    frozenset({"rope"}): (_LLAMA4, StockForm("LlamaForCausalLM", _rope_config, _llama_refuse)),
    frozenset({"nope", "rope"}): (_LLAMA4, StockForm("SmolLM3ForCausalLM", _smollm3_config,
                                                     _rope_refuse)),
}
"""The set of position variants a run's layers use (attention.layout over attention.position,
`RunConfig.layer_positions`) -> its stock forms, the first that claims the run wins (Llama 4 for
chunked attention or its temperature). Sets without an entry are refused."""


def stock_form(cfg) -> Optional[StockForm]:
    """The stock form of the run `cfg` by its layers' variants and options, or None."""
    forms = STOCK_FORMS.get(frozenset(cfg.layer_positions), ())
    return next((f for f in forms if f.claims(cfg)), None)


_INFERENCE_IRRELEVANT = ("impl", "chunk_size", "kerple", "sandwich", "xpos")
"""Attention fields that do not change the function of a NoPE/RoPE model: kernel choices, and
the option sections of variants that have no stock form (refused by name first)."""
_HANDLED = ("position", "scale_c", "head_scale", "rope", "window", "chunked", "temperature",
            "layout")


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
        if f.name in _HANDLED + _INFERENCE_IRRELEVANT:
            continue
        if getattr(a, f.name) != getattr(default, f.name):
            return (f"attention.{f.name}={getattr(a, f.name)!r} is not known to have a stock "
                    f"form{hint}")
    return None


# ------------------------------------------------------------------ weights


def folded_scales(cfg, scales: Tensor) -> Tensor:
    """The per-head scales [layers, heads] a stock export folds into q_proj: the run's (uniform
    c or learned m_h) times a `uniform` temperature's c on the layers it scales."""
    t = cfg.attention.temperature
    if t.kind != "uniform":
        return scales
    rows = [float(t.c) if applies(t, x) else 1.0 for x in cfg.layer_positions]
    return scales * scales.new_tensor(rows).view(-1, 1)


def stock_state(cfg, hf_state: dict, scales: Tensor) -> dict:
    """The HF Llama-named state as the run's stock form stores it: scales folded into q_proj
    (`folded_scales`), then the form's names and layouts."""
    m = cfg.model
    folded = fold_head_scales(hf_state, folded_scales(cfg, scales), m.num_attention_heads,
                              m.head_dim)
    return stock_form(cfg).weights(folded, cfg)


def fold_head_scales(hf_state: dict, scales: Tensor, num_heads: int, head_dim: int) -> dict:
    """Multiply q_proj rows of head h of layer l by scales[l, h] (fp32 product, then stored in
    the weight's dtype) and drop the `self_attn.head_scale` entries. q_proj.weight [h d, H]."""
    drop = {HF_HEAD_SCALE.format(i=i) for i in range(len(scales))}
    out = {k: v for k, v in hf_state.items() if k not in drop}
    for i, row in enumerate(scales):
        k = HF_Q_PROJ.format(i=i)
        w = out[k]
        hidden = w.shape[-1]
        folded = w.float().view(num_heads, head_dim, hidden) * row.float().view(-1, 1, 1)
        out[k] = folded.reshape(num_heads * head_dim, hidden).to(w.dtype).contiguous()
    return out


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
        "head_scale_source": head_scale_source, "head_scales_folded_into": "q_proj",
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
        hidden_act="silu", max_position_embeddings=m.train_length, rms_norm_eps=m.norm_epsilon,
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


__all__ = ["STOCK_FORMS", "ROPE_PARAMETERS", "StockForm", "PROVENANCE", "refusal",
           "fold_head_scales", "folded_scales", "stock_state", "build_stock_config", "provenance"]
