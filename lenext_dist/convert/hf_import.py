"""Hugging Face folder -> training checkpoint (`lenext convert --from-hf DIR --out RUN`).

The inverse of the exports, read from the same tables: `keymap.KEYMAP` (hf_to_megatron),
`stock.ROPE_PARAMETERS` (a rope_parameters dict is accepted only when our export of the scaling it
names writes exactly that dict back), `stock.LLAMA4_MLP` / `stock.llama4_rope_rows` (Llama 4's
names and Meta's RoPE pair layout, undone). `MODEL_TYPES` maps config.json's model_type to the
class transformers' AutoModelForCausalLM builds from it, `READERS` that class to the reader of its
config: LlamaForCausalLM (PI / NTK as a base / YaRN), MistralForCausalLM (sliding window),
SmolLM3ForCausalLM (no_rope_layers, layer_types), Llama4ForCausalLM (text model, dense MLPs, iRoPE,
chunks, attention temperature, its weightless QK-norm), Qwen3ForCausalLM (QK-norm with weights)
and our custom export (model_type lenext; learned head scales folded into q_proj). Anything our
model cannot express is refused by name from config.json and the weight NAMES (never a tensor
read): MoE, qk-norm weights a config does not announce, biases, partial rotary, another
activation, head_dim other than hidden / heads, unknown rope types.

Safety: safetensors only (a pickle can run code when loaded), config.json read as JSON or by
transformers' own config classes, never trust_remote_code. Weights are read tensor by tensor from
their shards (model.safetensors.index.json) while the megatron state is built, so one copy is held.

Output (a run folder `lenext extend --base` and `checkpoint.init_from` read):
    config.yaml                          the run config (checkpoint.init_from = the step below)
    checkpoints/latest, checkpoints/step_0000000/   mp_rank_00_model_states.pt (ZeRO-0 layout),
                                         config.yaml, COMPLETE
    tokenizer.model / tokenizer.json / tokenizer_config.json / special_tokens_map.json (copied)
    import.json                          source folder, architecture, what was mapped
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import yaml

from lenext_dist.attention.names import HEAD_SCALE_KEY
from lenext_dist.attention.temperature import LLAMA4_DEFAULTS
from lenext_dist.checkpoint.layout import COMPLETE, CONFIG, LATEST, tag_for
from lenext_dist.config import AttentionConfig, RopeConfig
from lenext_dist.errors import CheckpointError

from . import stock
from .export import qk_norm_keys
from .keymap import HF_HEAD_SCALE, HF_Q_PROJ, HF_QK_NORM, Shape, expected_shapes, hf_to_megatron
from .outdir import check_out, inside, staged

TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json")


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


# ------------------------------------------------------------------ config.json -> sections


def _refuse(where: Path, what: str) -> ImportRefused:
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


# ------------------------------------------------------------------ weights, lazily


class LazyWeights:
    """HF key -> tensor, read from its safetensors shard on lookup (the reader's names/layout
    applied); iteration gives the Llama-named keys without reading any tensor."""

    def __init__(self, folder: Path, reading: Reading):
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                files = dict(json.loads(index.read_bytes())["weight_map"])
            except (ValueError, KeyError, TypeError) as e:  # damaged, or not an index
                raise _refuse(index, f"not a safetensors index ({type(e).__name__}: {e})") from None
            _check_shards(folder, index.name, files)
        elif (folder / "model.safetensors").is_file():
            with _opened(folder / "model.safetensors") as f:
                files = {k: "model.safetensors" for k in f.keys()}
        else:
            pickles = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
            raise _refuse(folder, (f"{pickles[0]} is a pickle (loading it can run code): save the "
                                   "model as safetensors first" if pickles else
                                   "no model.safetensors or model.safetensors.index.json"))
        self.folder, self.reading = folder, reading
        # rotary_emb.inv_freq: a buffer older transformers saved, recomputed from the config
        self.names = {reading.key(k): (k, f) for k, f in files.items() if not k.endswith("rotary_emb.inv_freq")}

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def __contains__(self, k):
        return k in self.names

    def __getitem__(self, k):
        theirs, f = self.names[k]
        with _opened(self.folder / f) as h:  # one tensor, then the file is closed
            return self.reading.tensor(k, h.get_tensor(theirs))


def _check_shards(folder: Path, index: str, files: dict) -> None:
    """Every shard the index names is there and holds the tensors it puts there (headers only),
    before anything is written: a partial download is named as one; a name that is not a file of
    the folder ("../x", "/abs") is refused, never read."""
    bad = next((s for s in files.values() if not isinstance(s, str) or s in ("", "..")
                or Path(s).name != s), None)
    if bad is not None:
        raise _refuse(folder / index, f"weight_map names {bad!r}, not a file of this folder")
    for shard in sorted(set(files.values())):
        if not (folder / shard).is_file():
            raise _refuse(folder / shard, f"missing ({index} lists it): download it again")
        with _opened(folder / shard) as h:
            held = set(h.keys())
        lacking = sorted(k for k, s in files.items() if s == shard and k not in held)
        if lacking:
            more = f" and {len(lacking) - 1} more" if len(lacking) > 1 else ""
            raise _refuse(folder / shard, f"lacks {lacking[0]}{more} ({index} puts them there): download it again")


def _opened(path: Path):
    """safe_open(path): a file that is not safetensors (damaged, cut short) -> ImportRefused."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), "pt")
    except SafetensorError as e:
        raise _refuse(path, f"not a readable safetensors file ({e}); copy it again") from None


_HINTS = (("q_norm", "qk-norm weights its config does not announce"),
          ("k_norm", "qk-norm weights its config does not announce"), (".bias", "biases"),
          ("experts", "mixture-of-experts layers"),
          ("router", "mixture-of-experts layers"), ("vision", "a vision tower"))


def _unknown_names(weights: LazyWeights, shape: Shape, learned_qk_norm: bool) -> Optional[str]:
    """What the weight names say the key map cannot take (by name), or None (a tied model's copy
    of its embeddings as lm_head is dropped)."""
    for part, what in _HINTS:
        if learned_qk_norm and part in ("q_norm", "k_norm"):
            continue
        hit = next((k for k in weights if part in k), None)
        if hit:
            return f"{hit}: {what}"
    if "lm_head.weight" in weights and shape.tie_embeddings:
        # a tied model saved with its lm_head as well: the same tensor twice, or a contradiction
        if not torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"]):
            return "lm_head.weight differs from the embeddings, with tie_word_embeddings=true"
        del weights.names["lm_head.weight"]
    return None


# ------------------------------------------------------------------ the import


def read_config(folder: Path, overrides=()) -> tuple[dict, Reading, str]:
    """(config.json, its Reading, architecture): every refusal of the config, no weight read.
    A stock architecture with `auto_map` runs its own code (never run here), which may compute
    something else (a Llama-shaped NoPE checkpoint): refused unless an attention.* override says
    what it computes."""
    f = folder / "config.json"
    if not f.is_file():
        raise _refuse(folder, "no config.json (a Hugging Face model folder is needed)")
    try:
        c = json.loads(f.read_bytes())
    except ValueError as e:  # UnicodeDecodeError included: a damaged or binary file
        raise _refuse(f, f"not valid JSON ({e})") from None
    if not isinstance(c, dict):
        raise _refuse(f, f"not a JSON object (a {type(c).__name__})")
    named = (c.get("architectures") or [None])[0]
    # transformers picks the class by model_type; a folder without one, by its architecture
    kind = c.get("model_type") or {a: t for t, a in MODEL_TYPES.items()}.get(str(named))
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise _refuse(f, f"model_type {c.get('model_type')!r}, architecture {named!r} (importable "
                         f"model_types: {', '.join(MODEL_TYPES)})")
    if kind == "llama4" or "text_config" in c:  # AutoModelForCausalLM's text part of a Llama4Config
        raise _refuse(f, "a multimodal model (Llama4ForConditionalGeneration): import its text model "
                         "(model_type llama4_text, a Llama4ForCausalLM folder)")
    arch = MODEL_TYPES[kind]
    if named not in (None, arch):
        raise _refuse(f, f"architecture {named!r} with model_type {kind!r}, from which transformers "
                         f"builds {arch}: make the two agree")
    c = {**c, "model_type": kind}
    if c.get("auto_map") and arch != "LenextForCausalLM" and not any(
            o.startswith("attention.") for o in overrides):
        raise _refuse(f, f"auto_map {sorted(c['auto_map'].values())}: the model runs its own code, "
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
        raise _refuse(f, f"{arch} with {what}") from None
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
        raise _refuse(f, f"transformers cannot read it ({type(e).__name__}: {said})") from None
    return {**full, "architectures": c.get("architectures")}


def _tokenizer_adds_bos(folder: Path) -> bool:
    """`add_bos_token` of folder/tokenizer_config.json (False without one); a damaged file is
    refused by name (import_hf reads the source's before anything is written)."""
    tc = folder / "tokenizer_config.json"
    if not tc.is_file():
        return False
    try:
        return bool(json.loads(tc.read_bytes()).get("add_bos_token", False))
    except (ValueError, AttributeError) as e:  # not JSON, or not an object
        raise _refuse(tc, f"not a JSON object ({type(e).__name__}: {str(e)[:120]})") from None


def _tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files to copy. One linking outside the folder is refused (copyfile follows
    links: tokenizer.json -> ~/.cache/huggingface/token would copy a secret into the run), but
    the hub cache's snapshots/<rev>/file -> ../../blobs/<hash>."""
    root = folder.resolve()
    roots = [root] + ([root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [])
    found = [folder / t for t in TOKENIZER_FILES if (folder / t).is_file()]
    outside = next((t for t in found if not any(inside(t.resolve(), r) for r in roots)), None)
    if outside:
        raise _refuse(outside, f"links to {outside.resolve()}, outside {folder}: put the file itself there")
    return found


def run_config(c: dict, reading: Reading, out: Path, name: str, overrides: list[str], source: Path):
    """The RunConfig written with the import (strict loader, so a bad override is one line)."""
    from lenext_dist.config import ConfigError, load_config

    tok = (out / "tokenizer.model").resolve() if (out / "tokenizer.model").is_file() else ""
    bos = c.get("bos_at_document_start")
    if bos is None:
        bos = _tokenizer_adds_bos(out)
    # L stays the pretrained length when a model.seq_length override trains longer (YaRN's
    # original length, the temperature schedules, lenext extend's base L)
    tree = {"name": name, "model": {"name": name, **reading.model,
                                    "train_length": reading.model["seq_length"]},
            "attention": reading.attention,
            "data": {"tokenizer": str(tok), "bos": bool(bos)},  # "": no SentencePiece model
            "checkpoint": {"init_from": str((out / "checkpoints").resolve())}}
    f = out / CONFIG
    f.write_text(yaml.safe_dump(tree, sort_keys=False))
    try:
        return load_config(f, list(overrides))
    except ConfigError as e:  # it names the staged copy, deleted on the way out: name the source
        raise ConfigError(str(e).replace(str(f), str(source / "config.json"))) from None


def import_hf(folder, out, *, overrides: list[str] = (), name: Optional[str] = None) -> dict:
    """Import the HF model folder `folder` into the run folder `out` (see the module docstring);
    returns a summary. ImportRefused (one line) before any weight is read, for what we cannot
    express; OutputError for an --out that exists."""
    from lenext_dist.config import save_config, to_dict

    folder, final = Path(folder), Path(out)
    c, reading, arch = read_config(folder, overrides)
    tokenizer = _tokenizer_files(folder)  # before any is read
    _tokenizer_adds_bos(folder)
    if (folder / "tokenizer.model").is_file():  # the run's data.tokenizer: checked before copying
        from lenext_dist.errors import UserError
        from lenext_dist.prep.tokenizer import load_sentencepiece

        try:
            load_sentencepiece(str(folder / "tokenizer.model"))
        except UserError as e:
            raise _refuse(folder, f"{e}") from None
    replaces = check_out(final, None, [folder])  # no --overwrite: nothing replaced
    weights = LazyWeights(folder, reading)
    with staged(final, replaces) as tmp:
        for t in tokenizer:
            shutil.copyfile(t, tmp / t.name)
        cfg = run_config(c, reading, tmp, name or folder.resolve().name, overrides, folder)
        m = cfg.model
        shape = Shape.from_run_config(cfg)
        why = (_unknown_names(weights, shape, cfg.attention.qk_norm.kind == "rms")
               or _lacking_qk_norm(weights, cfg))
        if why:
            raise _refuse(folder, why)
        if arch == "LenextForCausalLM":  # learned/uniform scales: fold, keep scale_c = 1
            _fold_head_scales(weights, cfg)
        try:
            state = hf_to_megatron(weights, shape)
        except KeyError as e:
            raise _refuse(folder, e.args[0]) from None
        why = _misfit(state, cfg.model)
        if why:
            raise _refuse(folder, why)
        step = tmp / "checkpoints" / tag_for(0)
        step.mkdir(parents=True)
        torch.save({"module": state}, step / "mp_rank_00_model_states.pt")
        del state
        final_cfg = _relocated(cfg, tmp, final)
        save_config(final_cfg, step / CONFIG)  # resolved, as train writes a step's
        tree = to_dict(final_cfg)  # to train from: run_dir / checkpoint.dir follow `name`
        tree["run_dir"] = tree["checkpoint"]["dir"] = None
        (tmp / CONFIG).write_text(yaml.safe_dump(tree, sort_keys=False))
        (step / COMPLETE).write_text("1\n")
        (tmp / "checkpoints" / LATEST).write_text(tag_for(0) + "\n")
        summary = {"source": str(folder.resolve()), "architecture": arch, "out": str(final),
                   "layers": cfg.layer_positions, "windows": cfg.layer_windows,
                   "chunks": cfg.layer_chunks, "temperature": cfg.attention.temperature.kind,
                   "rope": cfg.attention.rope.scaling, "train_length": m.train_length,
                   "tokenizer": [t for t in TOKENIZER_FILES if (tmp / t).is_file()]}
        (tmp / "import.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _lacking_qk_norm(weights: LazyWeights, cfg) -> Optional[str]:
    """The learned QK-norm weights the config gives its layers that the folder lacks (by name,
    before a scale is folded into them): training would start from norms of 1."""
    lacking = qk_norm_keys(cfg, weights, HF_QK_NORM)
    if not lacking:
        return None
    more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
    return (f"no weight for {lacking[0]}{more}: its config normalizes q and k with learned "
            "weights (attention.qk_norm 'rms')")


def _misfit(state: dict, m) -> Optional[str]:
    """What in the converted weights does not fit the config read from config.json (a weight
    missing, or of another shape), or None: found here rather than when training starts."""
    for k, (want, keys) in expected_shapes(m).items():
        if k not in state:
            if HEAD_SCALE_KEY not in k:  # head scales are optional
                return (f"no weight for {k} (untied embeddings need lm_head.weight)" if k == "output_layer.weight"
                        else f"no weight for {k}")
        elif tuple(state[k].shape) != want:
            return f"{k} has shape {tuple(state[k].shape)}, but config.json gives {want} ({', '.join(keys)})"
    return None


def _relocated(cfg, tmp: Path, final: Path):
    """The config with the staging folder's paths replaced by the final ones."""
    import dataclasses

    fix = lambda p: p.replace(str(tmp.resolve()), str(final.resolve())) if p else p  # noqa: E731
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, tokenizer=fix(cfg.data.tokenizer)),
        checkpoint=dataclasses.replace(cfg.checkpoint, init_from=fix(cfg.checkpoint.init_from)))


def _fold_head_scales(weights: LazyWeights, cfg) -> None:
    """Our custom export's per-head scales [h] per layer (none in the weights: config.json's
    scale_c, read into attention.scale_c, as the HF model's buffers start): a uniform c stays
    attention.scale_c (unless the config has a head scale, SSMax's m_h, which starts at 1 instead); anything else
    is folded as the stock export folds it (stock_weights): into q_norm.weight on a layer with a
    learned QK-norm whose heads share one scale (the norm would undo a scaled q_proj), else into
    q_proj's rows, with scale_c 1; what no weight can carry is refused."""
    from .stock_weights import fold_into_qk_norm

    m = cfg.model
    keys = [HF_HEAD_SCALE.format(i=i) for i in range(m.num_layers)]
    lacking = [k for k in keys if k not in weights]
    if lacking and len(lacking) < len(keys):  # the HF model would run those layers at scale_c
        raise _refuse(weights.folder, f"no {lacking[0]} ({len(keys) - len(lacking)} of {len(keys)} "
                                      "layers have head scales): export it again")
    scales = (torch.full((m.num_layers, m.num_attention_heads), float(cfg.attention.scale_c))
              if lacking else torch.stack([weights[k].float() for k in keys]))  # [layers, heads]
    for k in keys:
        weights.names.pop(k, None)
    if not cfg.attention.head_scale.enabled and bool((scales == scales.flatten()[0]).all()):
        cfg.attention.scale_c = float(scales.flatten()[0])
        return
    cfg.attention.scale_c = 1.0
    norms = {k: weights[k] for i in range(m.num_layers) if (k := HF_QK_NORM.format(i=i, qk="q")) in weights}
    try:
        norms, scales = fold_into_qk_norm(cfg, norms, scales)  # [d] each; scales: 1 on the normed layers
    except ValueError as e:
        raise _refuse(weights.folder, str(e)) from None
    rows = {HF_Q_PROJ.format(i=i): r for i, r in enumerate(scales)}
    inner = weights.reading.tensor

    def tensor(k, w):
        if k in norms:  # already read (and mapped) above, then scaled
            return norms[k]
        w = inner(k, w)
        return stock.fold_head_scales({HF_Q_PROJ.format(i=0): w}, rows[k].view(1, -1), m.num_attention_heads,
                                      m.head_dim)[HF_Q_PROJ.format(i=0)] if k in rows else w

    weights.reading.tensor = tensor


__all__ = ["import_hf", "read_config", "READERS", "ImportRefused", "LazyWeights"]
