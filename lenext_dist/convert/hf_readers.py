"""Hugging Face config.json -> the run config's model and attention sections (the first half of
`lenext convert --from-hf`, hf_import.py; no weight is read here).

`MODEL_TYPES` maps config.json's model_type to the class transformers' AutoModelForCausalLM builds
from it, `READERS` that class to the reader of its config: LlamaForCausalLM (PI / NTK as a base /
YaRN), MistralForCausalLM (sliding window), SmolLM3ForCausalLM (no_rope_layers, layer_types),
Llama4ForCausalLM (text model, dense MLPs, iRoPE, chunks, attention temperature, its weightless
QK-norm), Qwen3ForCausalLM (QK-norm with weights) and our custom export (model_type lenext).
`stock.ROPE_PARAMETERS` is read backwards (a rope_parameters dict is accepted only when our export
of the scaling it names writes exactly that dict back). Anything our model cannot express is
refused by name from config.json: MoE, partial rotary, another activation, head_dim other than
hidden / heads, unknown rope types. config.json is read as JSON or by transformers' own config
classes, never with trust_remote_code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from lenext_dist.attention.temperature import LLAMA4_DEFAULTS
from lenext_dist.config import AttentionConfig, RopeConfig
from lenext_dist.errors import CheckpointError

from . import stock


class ImportRefused(CheckpointError):
    """The HF folder holds a model this project cannot express or read safely (one line)."""


@dataclass
class Reading:
    """What a reader makes of config.json: the run config's model and attention sections, each
    layer's (variant, window, chunk), and how an HF key/tensor becomes the Llama-named one."""

    model: dict
    attention: dict
    specs: list
    key: Callable[[str], str] = lambda k: k
    tensor: Callable[[str, torch.Tensor], torch.Tensor] = lambda k, w: w


def refuse(where: Path, what: str) -> ImportRefused:
    """The import's one-line refusal, naming the file or folder (hf_weights / hf_import too)."""
    return ImportRefused(f"{where}: cannot import: {what}; nothing written")


def _common(c: dict, ffn_key: str = "intermediate_size") -> dict:
    """The Llama-shaped fields every stock reader shares -> model section; refusals by name."""
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    c = {"partial_rotary_factor": (c.get("rope_parameters") or {}).get("partial_rotary_factor"), **c}
    for key, ok, what in (
            ("hidden_act", c.get("hidden_act", "silu") == "silu", "an activation other than SwiGLU (silu)"),
            ("attention_bias", not c.get("attention_bias"), "attention biases"),
            ("mlp_bias", not c.get("mlp_bias"), "MLP biases"),
            ("head_dim", c.get("head_dim") in (None, hidden // heads),
             f"head_dim other than hidden_size / num_attention_heads = {hidden // heads}"),
            # a rotary fraction: our partial RoPE exports to GLM, whose other parts (fused
            # gate_up, attention biases) no reader takes yet
            ("partial_rotary_factor", c.get("partial_rotary_factor", 1.0) in (None, 1.0),
             "partial rotary (importable from no architecture yet)")):
        if not ok:
            raise ValueError(f"{key}={c.get(key)!r}: {what}")
    kv = c.get("num_key_value_heads") or heads
    return {"num_layers": c["num_hidden_layers"], "hidden_size": hidden,
            "num_attention_heads": heads, "num_query_groups": None if kv == heads else kv,
            "ffn_hidden_size": c[ffn_key], "vocab_size": c["vocab_size"],
            "norm_epsilon": c.get("rms_norm_eps", 1e-5),
            "init_method_std": c.get("initializer_range", 0.02),
            "tie_embeddings": bool(c.get("tie_word_embeddings", False))}


def _rope(c: dict, head_dim: int) -> tuple[dict, int]:
    """(attention.rope, L) from rope_parameters, read through stock.ROPE_PARAMETERS: the guess
    for its rope_type is accepted only if our export writes the same dict back."""
    p = dict(c.get("rope_parameters") or {"rope_type": "default",
                                           "rope_theta": c.get("rope_theta", 10000.0)})
    legacy = dict(c.get("rope_scaling") or {})  # transformers < 5: `rope_scaling` {type, factor}
    if legacy:
        p.update(legacy, rope_type=legacy.pop("rope_type", legacy.pop("type", None)))
    legacy_type = p.pop("type", None)  # transformers' reading may keep the old key beside rope_type
    if p.get("partial_rotary_factor") == 1.0:  # every dim rotates: the default (_common refuses others)
        del p["partial_rotary_factor"]
    kind = p.setdefault("rope_type", legacy_type or "default")
    scaling = {"default": "none", "linear": "pi", "yarn": "yarn"}.get(kind)
    if scaling is None:
        raise ValueError(f"rope_type {kind!r}: no RoPE scaling of ours computes it "
                         f"(known: default, linear (PI), yarn; static NTK is a default base)")
    L = int(p.get("original_max_position_embeddings") or stock_length(c, p.get("factor") or 1.0))
    # YaRN without a factor: transformers' max_position_embeddings / original length
    factor = p.get("factor") or (c["max_position_embeddings"] / L if scaling == "yarn" else 1.0)
    r = {"base": float(p["rope_theta"]), "scaling": scaling, "factor": float(factor)}
    back = stock.ROPE_PARAMETERS[scaling](RopeConfig(**r), head_dim, L)
    extra = [k for k, v in p.items() if v is not None and (k not in back or back[k] != v)]
    if extra:
        raise ValueError(f"rope_parameters {', '.join(f'{k}={p[k]!r}' for k in extra)}: not "
                         f"computed by our {scaling!r} RoPE (it writes {back})")
    return r, L


def stock_length(c: dict, factor: float = 1.0) -> int:
    """L: the training length our stock export recorded, else max_position_embeddings (over the
    PI factor: our export writes the extended length there)."""
    prov = c.get(stock.PROVENANCE) or {}
    return int(prov.get("train_length") or c["max_position_embeddings"] // factor)


def _llama(c: dict, where: Path) -> Reading:
    m = _common(c)
    rope, L = _rope(c, m["hidden_size"] // m["num_attention_heads"])
    window = c.get("sliding_window") if c["model_type"] == "mistral" else None  # Llama has none
    return Reading({**m, "seq_length": L}, {"position": "rope", "rope": rope, "window": window},
                   [("rope", window, None)] * m["num_layers"])


def _smollm3(c: dict, where: Path) -> Reading:
    m = _common(c)
    rope, L = _rope(c, m["hidden_size"] // m["num_attention_heads"])
    n, w = m["num_layers"], c.get("sliding_window")
    types = c.get("layer_types") or ["full_attention"] * n
    if w is not None and not c.get("use_sliding_window") and "sliding_attention" in types:
        # transformers' eager and SDPA paths window these layers through their mask
        # (masking_utils.create_sliding_window_causal_mask reads sliding_window alone); its flash
        # path does not (the layer's own sliding_window needs use_sliding_window): two models
        raise ValueError(f"layer_types name sliding_attention layers and sliding_window={w}, but "
                         "use_sliding_window is false: transformers windows them or not by its "
                         "attention kernel; set use_sliding_window")
    flags = c.get("no_rope_layers") or [int((i + 1) % c.get("no_rope_layer_interval", 4) != 0)
                                        for i in range(n)]
    specs = [("rope" if f else "nope",
              w if c.get("use_sliding_window") and t == "sliding_attention" else None, None)
             for f, t in zip(flags, types)]
    return Reading({**m, "seq_length": L}, {"rope": rope}, specs)


def _llama4(c: dict, where: Path) -> Reading:
    c = {"use_qk_norm": True, **c}  # Llama4TextConfig's default
    n = c["num_hidden_layers"]
    moe = c.get("moe_layers")
    if moe is None or moe:
        raise ValueError(f"moe_layers={moe!r}: mixture-of-experts layers (dense MLPs only: "
                         "moe_layers [])")
    m = _common(c, "intermediate_size_mlp")
    rope, L = _rope(c, m["hidden_size"] // m["num_attention_heads"])
    if rope["scaling"] != "none":  # as the export refuses it (convert/stock.py); YaRN's attention
        # factor is in its cos/sin, which Llama 4's QK-norm after the rotation divides out again
        # and ours (before it) keeps: logits mscale^2 too large on every RoPE layer
        raise ValueError(f"RoPE scaling {rope['scaling']!r} (rope_parameters) with Llama 4 (its "
                         "chunked layers, its QK-norm after the rotation) is not verified")
    flags = c.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)]
    types = c.get("layer_types") or ["chunked_attention" if f else "full_attention" for f in flags]
    specs = [("rope" if f else "nope", None,
              c.get("attention_chunk_size") if t == "chunked_attention" else None)
             for f, t in zip(flags, types)]
    # transformers tunes the NoPE layers' temperature only (modeling_llama4: `not self.use_rope`),
    # and has it on by default: without a NoPE layer it tunes nothing
    temp = ({"kind": "llama4", "layers": "nope",
             **{k: float(c.get(k, v)) for k, v in LLAMA4_DEFAULTS.items()}}
            if c.get("attn_temperature_tuning", True) and not all(flags) else {"kind": "none"})
    positions = [x for x, *_ in specs]
    model = {**m, "seq_length": L}
    theirs, ours = stock.LLAMA4_MLP[1], stock.LLAMA4_MLP[0]
    shape = type("M", (), {"num_attention_heads": m["num_attention_heads"],
                           "kv_heads": m["num_query_groups"] or m["num_attention_heads"],
                           "head_dim": m["hidden_size"] // m["num_attention_heads"]})
    # Llama4TextL2Norm (weightless, eps rms_norm_eps) on q and k of the RoPE layers; it runs after
    # the rotation, ours before: a rotation keeps each head's norm, so the same function
    qk = {"kind": "l2", "layers": "rope"} if c["use_qk_norm"] else {"kind": "none"}
    return Reading(model, {"rope": rope, "temperature": temp, "qk_norm": qk}, specs,
                   key=lambda k: k.replace(theirs, ours),
                   tensor=lambda k, w: stock.llama4_rope_rows(k, w, shape, positions, inverse=True))


def _qwen3(c: dict, where: Path) -> Reading:
    """Qwen3ForCausalLM: Llama + an RMSNorm with a weight [head_dim] on q and on k of every layer
    (q_norm / k_norm, before RoPE: our `rms` QK-norm, same weight names)."""
    if c.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true (Qwen3's windowed layers are not verified)")
    m = _common(c)
    rope, L = _rope(c, m["hidden_size"] // m["num_attention_heads"])
    return Reading({**m, "seq_length": L}, {"position": "rope", "rope": rope,
                                            "qk_norm": {"kind": "rms", "layers": "all"}},
                   [("rope", None, None)] * m["num_layers"])


def _lenext(c: dict, where: Path) -> Reading:
    """Our custom export: every attention option is in config.json (attention_options) but the
    head scales (_fold_head_scales); the kernel choices an older export kept there are left
    behind (they were the training machine's)."""
    from lenext_dist.hf.configuration_lenext import LENEXT_FORMAT

    if (c.get("lenext_format") or 0) > LENEXT_FORMAT:
        raise ValueError(f"lenext_format {c['lenext_format']}, newer than this lenext_dist reads "
                         f"({LENEXT_FORMAT}): update lenext_dist")
    m = _common(c)
    options = {k: v for k, v in (c.get("attention_options") or {}).items()
               if k not in AttentionConfig.KERNEL_FIELDS}
    # scale_c: each head's m_h where the weights hold no head scales (as the HF model's buffers)
    attn = {"position": c["position"], "rope": c["rope"], "scale_c": float(c["scale_c"]), **options}
    if (options.get("temperature") or {}).get("kind") == "ssmax":
        # SSMax's learned m_h are the export's head scales, folded into the weights: the head
        # scale it needs starts at 1
        attn["head_scale"] = {"enabled": True, "init": 1.0}
    model = {**m, "seq_length": int(c["train_length"])}
    return Reading(model, attn, [])


READERS: dict[str, Callable[[dict, Path], Reading]] = {
    "LlamaForCausalLM": _llama, "MistralForCausalLM": _llama, "SmolLM3ForCausalLM": _smollm3,
    "Llama4ForCausalLM": _llama4, "Qwen3ForCausalLM": _qwen3, "LenextForCausalLM": _lenext}
"""The class transformers builds -> the reader of its config.json; any other is refused by name."""
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "smollm3": "SmolLM3ForCausalLM", "llama4": "Llama4ForCausalLM",
               "llama4_text": "Llama4ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "lenext": "LenextForCausalLM"}
"""config.json `model_type` -> the class AutoModelForCausalLM builds (lenext: by its auto_map)."""


def _layout(specs: list, attention: dict) -> dict:
    """Each layer's (variant, window, chunk) -> attention.position / window / chunked / layout:
    uniform when all layers agree, else `explicit` with the local layers sharing one span."""
    if not specs:
        return attention
    local = sorted({(w, ch) for _, w, ch in specs if (w, ch) != (None, None)}, key=str)
    if len(local) > 1:
        raise ValueError(f"layers with different windows / chunks {local}: one span per model")
    w, ch = local[0] if local else (None, None)
    names = [x for x, *_ in specs]
    out = {**attention, "position": "rope" if "rope" in names else "nope", "window": w, "chunked": ch}
    if len(set(specs)) > 1:
        out["layout"] = {"kind": "explicit", "layers": names,
                         "global_layers": [i + 1 for i, (_, a, b) in enumerate(specs)
                                           if (a, b) == (None, None)] if local else []}
    return out



def read_config(folder: Path, overrides=()) -> tuple[dict, Reading, str]:
    """(config.json, its Reading, architecture): every refusal of the config, no weight read.
    A stock architecture with `auto_map` runs its own code (never run here), which may compute
    something else (a Llama-shaped NoPE checkpoint): refused unless an attention.* override says
    what it computes."""
    f = folder / "config.json"
    if not f.is_file():
        raise refuse(folder, "no config.json (a Hugging Face model folder is needed)")
    try:
        c = json.loads(f.read_bytes())
    except ValueError as e:  # UnicodeDecodeError included: a damaged or binary file
        raise refuse(f, f"not valid JSON ({e})") from None
    if not isinstance(c, dict):
        raise refuse(f, f"not a JSON object (a {type(c).__name__})")
    named = (c.get("architectures") or [None])[0]
    # transformers picks the class by model_type; a folder without one, by its architecture
    kind = c.get("model_type") or {a: t for t, a in MODEL_TYPES.items()}.get(str(named))
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise refuse(f, f"model_type {c.get('model_type')!r}, architecture {named!r} (importable "
                         f"model_types: {', '.join(MODEL_TYPES)})")
    if kind == "llama4" or "text_config" in c:  # AutoModelForCausalLM's text part of a Llama4Config
        raise refuse(f, "a multimodal model (Llama4ForConditionalGeneration): import its text model "
                         "(model_type llama4_text, a Llama4ForCausalLM folder)")
    arch = MODEL_TYPES[kind]
    if named not in (None, arch):
        raise refuse(f, f"architecture {named!r} with model_type {kind!r}, from which transformers "
                         f"builds {arch}: make the two agree")
    c = {**c, "model_type": kind}
    if c.get("auto_map") and arch != "LenextForCausalLM" and not any(
            o.startswith("attention.") for o in overrides):
        raise refuse(f, f"auto_map {sorted(c['auto_map'].values())}: the model runs its own code, "
                      f"not stock {arch} (code is never run here); read it and say what it "
                      "computes with attention.* overrides, e.g. attention.position=nope")
    if arch != "LenextForCausalLM":
        c = _as_transformers_reads(c, f)
    try:
        reading = READERS[arch](c, folder)
        reading.attention = _layout(reading.specs, reading.attention)
    except (ValueError, KeyError, TypeError) as e:
        what = (e.args[0] if isinstance(e, ValueError) else f"config.json lacks {e.args[0]!r}"
                if isinstance(e, KeyError) else f"a value of the wrong type in config.json ({e})")
        raise refuse(f, f"{arch} with {what}") from None
    return c, reading, arch


def _as_transformers_reads(c: dict, f: Path) -> dict:
    """config.json as transformers reads it: what it lacks takes its config class's default or
    what the class derives from the rest (Mistral's window of 4096, SmolLM3's windowed NoPE
    layers, YaRN's original length = max_position_embeddings, SmolLM3's tied embeddings), so the
    import computes what transformers would compute from the same folder."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import CONFIG_MAPPING

    if c.get("model_type") not in CONFIG_MAPPING:
        return c
    try:
        full = CONFIG_MAPPING[c["model_type"]](**c).to_dict()
    # StrictDataclassError: its config classes are strict dataclasses (a float for an int field)
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError) as e:
        said = " ".join(str(e).split())  # the strict dataclass's message spans lines
        raise refuse(f, f"transformers cannot read it ({type(e).__name__}: {said})") from None
    return {**full, "architectures": c.get("architectures")}

