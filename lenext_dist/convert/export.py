"""DeepSpeed/megatron checkpoint -> Hugging Face folder (safetensors + config + modeling code).

    export(checkpoint="runs/x/checkpoints", out="hf/x")            # latest complete checkpoint
    export(checkpoint="runs/x/checkpoints/step_0000100", out=...)  # a given one
    export(..., scale_c=1.2)                                       # uniform scale c for all heads
    export(..., head_scales="runs/hs/checkpoints")                 # per-head scales of another run

Weights: the fp32 master weights whenever the checkpoint has ZeRO optimizer partitions (stages 1-3,
any precision; through deepspeed.utils.zero_to_fp32), so the export is exact; otherwise (ZeRO-0)
the module weights of `mp_rank_00_model_states.pt`. A ZeRO-3 module file holds only empty
placeholders, which is detected and never exported.

Output folder:
    model.safetensors      Llama-named weights + model.layers.N.self_attn.head_scale [heads] fp32
                           (and KERPLE's self_attn.position.* fp32 at any --dtype)
    config.json            model_type `lenext`, auto_map -> the shipped classes, position / rope /
                           scale_c / train_length / head_scale_source, lenext_source (provenance)
    generation_config.json
    configuration_lenext.py, modeling_lenext.py, tokenization_lenext.py   (from lenext_dist/hf)
    lenext_attention.py, lenext_attention_*.py   (flattened copy of lenext_dist/attention)
    tokenizer.model, tokenizer_config.json, special_tokens_map.json
    lenext_run_config.yaml (the run's resolved config)

With fmt="stock" (stock.py): a stock transformers config (SmolLM3 / Llama) with
`lenext_provenance`, Llama-named weights with the head scales folded into q_proj, no code files,
tokenizer.json (+ tokenizer.model) when it reproduces SentencePiece.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor

from lenext_dist.checkpoint import layout, safe_load, weights
from lenext_dist.errors import CheckpointError

from . import stock
from .tokenizer_json import write_stock_tokenizer
from lenext_dist.attention.names import HEAD_SCALE_KEY
from lenext_dist.dtypes import TORCH_NAMES, canonical, torch_dtype

from .keymap import (HF_HEAD_SCALE, IGNORED, MEGATRON_HEAD_SCALE, MEGATRON_QK_NORM, Shape,
                     expected_shapes, megatron_key, megatron_to_hf)
from .outdir import OutputError, check_out, inside, staged

HF_DIR = Path(__file__).resolve().parents[1] / "hf"
ATTENTION_DIR = Path(__file__).resolve().parents[1] / "attention"
SHIPPED = ("configuration_lenext.py", "modeling_lenext.py", "tokenization_lenext.py")


class ExportError(CheckpointError):
    """The checkpoint cannot be exported as asked (message says why and what to do)."""


# ------------------------------------------------------------------ reading checkpoints


def checked_head_scales(t: Tensor, num_layers: int, num_heads: int, where: str = "") -> Tensor:
    """Head scales given to an export (a tensor, or read by head_scales_from from `where`) as the
    [layers, heads] fp32 CPU tensor it writes, or ExportError."""
    t = t.detach().float().cpu()
    if tuple(t.shape) != (num_layers, num_heads):
        raise ExportError(f"{where}head scales have shape {tuple(t.shape)}, the model needs "
                          f"[{num_layers}, {num_heads}]")
    if not torch.isfinite(t).all() or (t <= 0).any():
        raise ExportError(f"{where}head scales must be finite and > 0")
    return t


def head_scales_from(path: Union[str, Path], num_layers: int, num_heads: int) -> Tensor:
    """[layers, heads] fp32 from a checkpoint (folder or step_*; its learned head scales), a .pt
    file (a tensor, or a dict with 'head_scales') or a .json file (a list of lists)."""
    p = Path(path)
    if p.is_dir():
        state, _ = weights.read_state(layout.resolve(p))
        keys = [MEGATRON_HEAD_SCALE.format(i=i) for i in range(num_layers)]
        if not all(k in state for k in keys):
            raise ExportError(f"{p}: checkpoint has no learned head scales "
                              "(attention.head_scale.enabled was off)")
        t = torch.stack([state[k].float() for k in keys])
    elif p.suffix == ".json":
        try:  # {"head_scales": [[...], ...]} or the bare [layers, heads] list of numbers
            data = json.loads(p.read_bytes())
            t = torch.tensor(data["head_scales"] if isinstance(data, dict) else data, dtype=torch.float32)
        except (ValueError, KeyError, TypeError) as e:
            raise ExportError(f"{p}: not head scales ({type(e).__name__}: {str(e)[:120]}); pass a "
                              'JSON list [layers][heads] of numbers, or {"head_scales": that list}') from None
    elif p.suffix in (".pt", ".pth"):
        data = safe_load.load(p)
        t = data.get("head_scales") if isinstance(data, dict) else data
        if not isinstance(t, Tensor):
            what = (f"a {type(data).__name__}" if not isinstance(data, dict) else
                    f"its 'head_scales' is a {type(t).__name__}" if "head_scales" in data else
                    f"a dict without 'head_scales' (keys: {', '.join(map(str, list(data)[:5]))})")
            raise ExportError(f"{p}: not head scales ({what}); torch.save a tensor [layers, heads], "
                              "or {'head_scales': that tensor}")
    else:
        raise ExportError(f"{p}: head scales must be a checkpoint folder, .json or .pt")
    return checked_head_scales(t, num_layers, num_heads, f"{p}: ")


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def qk_norm_keys(cfg, state, template: str = MEGATRON_QK_NORM) -> list[str]:
    """The learned QK-norm weights the run's config gives its layers (attention.qk_norm `rms`)
    that `state` lacks (a norm left at its init would be exported, or imported, silently
    otherwise), named by `template` (megatron's keys, or keymap.HF_QK_NORM for an HF folder)."""
    from lenext_dist.attention.qknorm import LEARNED, layer_kinds

    kinds = layer_kinds(cfg.attention, cfg.model.num_layers)
    want = [template.format(i=i, qk=qk) for i, kind in enumerate(kinds) if kind in LEARNED
            for qk in "qk"]
    return [k for k in want if k not in state]


def check_weights(state: dict, cfg, step_dir: Path) -> None:
    """Every tensor against the shape the step's config.yaml gives it, before anything is
    written: a disagreement (a hand-edited or copied config.yaml) would export a folder that
    does not load, or fail deep in the key map; ExportError names the key."""
    m = cfg.model
    want = expected_shapes(m)
    keys = [k for k in state if not IGNORED.search(k)]
    layers = sorted({int(x.group(1)) for k in keys if (x := _LAYER.match(k))})
    problem = None
    if layers and layers[-1] + 1 != m.num_layers:
        problem = (f"the weights have {layers[-1] + 1} layers (decoder.layers.0-{layers[-1]}), "
                   f"config.yaml has model.num_layers={m.num_layers}")
    elif m.tie_embeddings and "output_layer.weight" in state:
        problem = "the weights have output_layer.weight, config.yaml has model.tie_embeddings=true"
    elif not m.tie_embeddings and "output_layer.weight" not in state:
        problem = "the weights have no output_layer.weight, config.yaml has model.tie_embeddings=false"
    else:
        optional = MEGATRON_HEAD_SCALE.split("{i}")[1]
        missing = [k for k in want if k not in state and not k.endswith(optional)]
        missing += qk_norm_keys(cfg, state)
        if missing:
            problem = f"the weights lack {missing[0]}" + (f" (and {len(missing) - 1} more)"
                                                          if len(missing) > 1 else "")
        for k in keys:
            if problem:
                break
            if k in want and tuple(state[k].shape) != want[k][0]:
                dims, names = want[k]
                off = [n for n, a, b in zip(names, state[k].shape, dims) if a != b]
                problem = (f"{k} is {list(state[k].shape)} in the weights, {list(dims)} by "
                           f"config.yaml ({', '.join(dict.fromkeys(off or names))})")
    if problem:
        raise ExportError(f"{step_dir}: its config.yaml disagrees with its weights: {problem}; "
                          "nothing exported. Export a step whose config.yaml is the one it was "
                          "trained with")


# ------------------------------------------------------------------ writing the folder


_REL_IMPORT = re.compile(r"^(\s*from\s+)\.(\w+)(\s+import\b)", re.MULTILINE)
_BAD_REL = re.compile(r"^\s*(from\s+\.(\s|\.|\w+\.)|import\s+\.)", re.MULTILINE)


def ship_code(out: Path) -> None:
    """The modeling code a custom export loads with (trust_remote_code): lenext_dist/hf's classes
    and the flattened attention copy. Also what a kept model (weights and config only, as
    experiments keep finished runs in git) gets back before it loads."""
    for f in SHIPPED:
        shutil.copyfile(HF_DIR / f, out / f)
    write_attention_copy(out)


def write_attention_copy(out: Path, src: Path = ATTENTION_DIR) -> list[str]:
    """Flatten the attention package into out/lenext_attention.py (its __init__) and
    out/lenext_attention_<module>.py, rewriting `from .x import` to `from .lenext_attention_x
    import` (transformers' remote-code loader copies only flat relative imports)."""
    written = []
    for f in sorted(src.glob("*.py")):
        text = f.read_text()
        if _BAD_REL.search(text):
            raise ExportError(f"{f}: only `from .module import ...` relative imports can be "
                              "shipped with remote code (no `from . import x`, no sub-packages)")
        name = "lenext_attention.py" if f.stem == "__init__" else f"lenext_attention_{f.stem}.py"
        body = _REL_IMPORT.sub(r"\1.lenext_attention_\2\3", text)
        header = (f"# Verbatim copy of lenext_dist/attention/{f.name} written by lenext_dist.convert "
                  "(relative imports flattened). Do not edit.\n")
        (out / name).write_text(header + body)
        written.append(name)
    return written


def _tokenizer_files(out: Path, tokenizer: Path, bos: bool = False) -> dict:
    from lenext_dist.prep.tokenizer import load_sentencepiece

    sp = load_sentencepiece(str(tokenizer), "tokenizer")
    shutil.copyfile(tokenizer, out / "tokenizer.model")
    ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id(), "unk": sp.unk_id()}
    piece = {k: (sp.id_to_piece(v) if v >= 0 else None) for k, v in ids.items()}
    special = {f"{k}_token": v for k, v in piece.items() if v is not None}
    tok_cfg = {
        "tokenizer_class": "LenextTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_lenext.LenextTokenizer", None]},
        # as training read the shards: sp.encode(text) + [eos], with BOS before it if data.bos
        "add_bos_token": bool(bos),
        "add_eos_token": False,
        "model_max_length": 1_000_000_000,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return {"size": sp.get_piece_size(), **{k: (v if v >= 0 else None) for k, v in ids.items()}}


def build_hf_config(cfg, *, scale_c: float, head_scale_source: str, tok: Optional[dict],
                    source: dict, dtype: str):
    from lenext_dist.hf.configuration_lenext import LENEXT_FORMAT, LENEXT_ROPE_GUARD, LenextConfig

    m, a = cfg.model, cfg.attention
    tok = tok or {}
    # not the kernels training chose: `auto` picks for the length evaluated (sdpa_mask, fine at a
    # training L, builds [h, s, s]: 256 GiB at 64K x 32 heads), and whoever loads it for their GPU
    options = {k: v for k, v in dataclasses.asdict(a).items()
               if k not in ("position", "rope", "scale_c", "head_scale", *a.KERNEL_FIELDS)}
    return LenextConfig(
        architectures=["LenextForCausalLM"],
        auto_map={"AutoConfig": "configuration_lenext.LenextConfig",
                  "AutoModel": "modeling_lenext.LenextModel",
                  "AutoModelForCausalLM": "modeling_lenext.LenextForCausalLM"},
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.kv_heads, head_dim=m.head_dim, hidden_act="silu",
        max_position_embeddings=m.seq_length, rms_norm_eps=m.norm_epsilon,
        initializer_range=m.init_method_std, tie_word_embeddings=m.tie_embeddings,
        bos_token_id=tok.get("bos"), eos_token_id=tok.get("eos"), pad_token_id=tok.get("pad"),
        rope_parameters=dict(LENEXT_ROPE_GUARD),
        position=a.position, rope=dataclasses.asdict(a.rope), scale_c=float(scale_c),
        train_length=m.train_length, head_scale_source=head_scale_source,
        attention_options=options,
        bos_at_document_start=bool(cfg.data.bos), document_mask=bool(cfg.data.document_mask),
        lenext_format=LENEXT_FORMAT, lenext_source=source, dtype=dtype,
    )


def export(checkpoint: Union[str, Path], out: Union[str, Path], *, tag: Optional[str] = None,
           scale_c: Optional[float] = None, head_scales: Union[str, Path, Tensor, None] = None,
           tokenizer: Union[str, Path, None] = None, dtype: str = "fp32",
           overwrite: bool = False, fmt: str = "custom") -> dict:
    """Export one checkpoint to an HF folder; returns a summary dict (also written to
    config.json's lenext_source, or lenext_provenance for a stock export).

    fmt: `custom` (model_type lenext + our modeling code, every variant, trust_remote_code) or
    `stock` (a transformers architecture without remote code, scales folded into q_proj; see
    stock.py; variants without an exact stock form raise ExportError naming them).

    Head scales of the export, in order of precedence: `head_scales` (a [layers, heads] tensor or
    a path, see head_scales_from), `scale_c` (uniform), the run's learned head scales (when it
    had attention.head_scale.enabled), else the run's attention.scale_c.
    tokenizer: default the run's data.tokenizer; None found -> ExportError (use --no-tokenizer
    by passing tokenizer="" to skip).
    """
    if scale_c is not None and head_scales is not None:
        raise ExportError("give either scale_c or head_scales, not both")
    if scale_c is not None and not 0 < scale_c < float("inf"):  # nan too
        raise ExportError(f"scale_c must be finite and > 0, got {scale_c}")
    if tag is not None and not str(tag).strip():  # "" would name the checkpoint folder itself
        raise ExportError("tag is empty: name a step_NNNNNNN folder, or None for the latest")
    try:
        dtype = canonical(dtype)
    except ValueError as e:
        raise ExportError(str(e)) from None
    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
    step_dir = layout.resolve(checkpoint, tag)
    cfg = layout.run_config(step_dir)
    why = stock.refusal(cfg) if fmt == "stock" else None
    if why:  # before reading any weights
        raise ExportError(f"{step_dir}: no stock export: {why}")
    final = Path(out)
    replaces = check_out(final, overwrite, [step_dir, step_dir.parent, Path(cfg.checkpoint.dir),
                                            Path(cfg.run_dir)] + ([Path(head_scales)] if isinstance(
                                                head_scales, (str, Path)) else []))
    if any(inside(final.resolve(), p.resolve()) for p in (step_dir.parent, Path(cfg.checkpoint.dir))):
        raise OutputError(f"--out {final} lies inside the checkpoint folder {step_dir.parent}; "
                          "choose an output folder outside it")
    m = cfg.model
    shape = Shape.from_run_config(cfg)
    state, weights_source = weights.read_state(step_dir)
    check_weights(state, cfg, step_dir)
    try:
        hf_state = megatron_to_hf(state, shape)
    except KeyError as e:  # a tensor the key map does not know (not a lenext checkpoint?)
        raise ExportError(f"{step_dir}: {e.args[0]}") from None

    learned = HF_HEAD_SCALE.format(i=0) in hf_state
    if head_scales is not None:
        scales = (checked_head_scales(head_scales, m.num_layers, m.num_attention_heads)
                  if isinstance(head_scales, Tensor)
                  else head_scales_from(head_scales, m.num_layers, m.num_attention_heads))
        hs_source, c = "file", float(cfg.attention.scale_c)
    elif scale_c is not None:
        scales = torch.full((m.num_layers, m.num_attention_heads), float(scale_c))
        hs_source, c = "uniform", float(scale_c)
    elif learned:
        scales = torch.stack([hf_state[HF_HEAD_SCALE.format(i=i)].float()
                              for i in range(m.num_layers)])
        hs_source, c = "learned", float(cfg.attention.scale_c)
    else:
        scales = torch.full((m.num_layers, m.num_attention_heads), float(cfg.attention.scale_c))
        hs_source, c = "uniform", float(cfg.attention.scale_c)
    bad = [k for k, v in hf_state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ExportError(f"{step_dir}: {len(bad)} weight tensors hold NaN or inf (e.g. {bad[0]}); "
                          "the run diverged: export an earlier step (--tag step_NNNNNNN)")
    tok_path = cfg.data.tokenizer if tokenizer is None else tokenizer
    if tok_path:
        tok_path = Path(tok_path)
        if not tok_path.is_file():
            raise ExportError(f"tokenizer {tok_path} not found (the run's data.tokenizer is relative "
                              "to where it was launched; pass --tokenizer PATH)")
    source = {"checkpoint": str(step_dir.resolve()), "tag": step_dir.name, "run": cfg.name,
              "weights": weights_source, "zero_stage": cfg.parallel.zero_stage,
              "train_precision": cfg.train.precision, "exported_dtype": dtype}

    # written beside the target and renamed at the end: a killed or failed export never looks
    # finished (to `lenext extend`'s resume or anyone else) and replaces only a previous export
    with staged(final, replaces) as out:
        hf_cfg, tensors = FORMATS[fmt](
            out, cfg, hf_state, scales, tok_path or None, scale_c=c, head_scale_source=hs_source,
            source=source, dtype=dtype)
        hf_cfg.to_json_file(str(out / "config.json"), use_diff=False)

        from safetensors.torch import save_file
        from transformers import GenerationConfig

        gen = GenerationConfig(bos_token_id=hf_cfg.bos_token_id, eos_token_id=hf_cfg.eos_token_id,
                               pad_token_id=hf_cfg.pad_token_id if hf_cfg.pad_token_id is not None
                               else hf_cfg.eos_token_id, do_sample=False)
        gen.save_pretrained(str(out))
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        shutil.copyfile(step_dir / "config.yaml", out / "lenext_run_config.yaml")
    return {**source, "out": str(final), "format": fmt, "architecture": hf_cfg.architectures[0],
            "position": cfg.attention.position, "scale_c": c, "head_scale_source": hs_source,
            "head_scales": scales.tolist()}


def _tokenizer_info(info: Optional[dict], vocab_size: int) -> Optional[dict]:
    if info is not None and info["size"] > vocab_size:
        raise ExportError(f"tokenizer has {info['size']} pieces > model vocab {vocab_size}")
    return info


def _custom_payload(out: Path, cfg, hf_state: dict, scales: Tensor, tok_path: Optional[Path], *,
                    scale_c: float, head_scale_source: str, source: dict, dtype: str):
    """model_type lenext: head scales as fp32 buffers, our modeling code + attention copy."""
    from lenext_dist.model.build import documented_fp32

    for i, row in enumerate(scales):
        hf_state[HF_HEAD_SCALE.format(i=i)] = row
    # what training keeps fp32 (m_h, KERPLE's r1/r2) stays fp32, as the HF model's _apply keeps it
    tensors = {k: v.to(torch.float32 if documented_fp32(megatron_key(k) or "") else torch_dtype(dtype))
               .contiguous() for k, v in hf_state.items()}
    tok = _tokenizer_info(_tokenizer_files(out, tok_path, bos=cfg.data.bos) if tok_path else None,
                          cfg.model.vocab_size)
    ship_code(out)
    return build_hf_config(cfg, scale_c=scale_c, head_scale_source=head_scale_source, tok=tok,
                           source=source, dtype=TORCH_NAMES[dtype]), tensors


def _stock_payload(out: Path, cfg, hf_state: dict, scales: Tensor, tok_path: Optional[Path], *,
                   scale_c: float, head_scale_source: str, source: dict, dtype: str):
    """A stock transformers architecture (stock.STOCK_FORMS): scales folded into q_proj (in
    fp32, before the cast), no code files, tokenizer.json when it reproduces SentencePiece."""
    m = cfg.model
    try:
        folded = stock.stock_state(cfg, hf_state, scales)
    except ValueError as e:  # a scale a QK-normed layer cannot carry
        raise ExportError(f"no stock export: {e}; export it with --format custom") from None
    tensors = {k: v.to(torch_dtype(dtype)).contiguous() for k, v in folded.items()}
    tok, note = (write_stock_tokenizer(out, tok_path, bos=cfg.data.bos) if tok_path
                 else (None, "no tokenizer shipped"))
    _tokenizer_info(tok, m.vocab_size)
    return stock.build_stock_config(cfg, scales=scales, scale_c=scale_c,
                                    head_scale_source=head_scale_source, tok=tok, source=source,
                                    dtype=TORCH_NAMES[dtype], tokenizer_note=note), tensors


FORMATS = {"custom": _custom_payload, "stock": _stock_payload}
"""--format name -> (out dir, run cfg, HF state, scales [layers, heads], tokenizer, ...) ->
(transformers config, tensors to save); each payload writes its own tokenizer / code files."""


# ------------------------------------------------------------------ verification


def megatron_reference(step_dir: Union[str, Path], head_scales: Optional[Tensor] = None):
    """The run's megatron GPTModel in fp32 on CPU with the checkpoint's weights (1-rank gloo group
    made if needed), eval mode; head_scales [layers, heads] override the per-head multipliers."""
    from lenext_dist.model import build_model, init_megatron, init_single_process_group

    step_dir = Path(step_dir)
    cfg = layout.run_config(step_dir)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision="fp32"))
    state, _ = weights.read_state(step_dir)
    init_single_process_group()
    init_megatron(cfg.train.seed)
    model = build_model(cfg, device="cpu")
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not k.endswith(("_extra_state", HEAD_SCALE_KEY))]
    if missing or unexpected:
        raise ExportError(f"megatron reference: missing {missing}, unexpected {unexpected}")
    if head_scales is not None:
        attn = [mod for name, mod in model.named_modules() if name.endswith("core_attention")]
        with torch.no_grad():
            for mod, row in zip(attn, head_scales):
                mod.head_scale.copy_(row)
                mod.uniform_scale = None  # the layer reads the per-head values just written
    return model.eval()


@torch.no_grad()
def verify(out: Union[str, Path], *, tokens: Optional[Tensor] = None, seed: int = 0) -> float:
    """Max |logits_HF - logits_megatron| on `tokens` [b, s] (default: 2 random sequences of the
    training length) for an exported folder, against the checkpoint it came from (both fp32).
    A stock export is loaded as plain transformers (no trust_remote_code); the megatron model
    then gets the scales its provenance says were folded in."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    info = json.loads((out / "config.json").read_text())
    prov = stock.provenance(info)
    if prov is not None:  # stock: plain transformers, no remote code; scales are in q_proj
        hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        scales, source, length = (torch.tensor(prov["head_scales"], dtype=torch.float32),
                                  prov["source"], prov["train_length"])
    else:
        hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True,
                                                  dtype=torch.float32).eval()
        from lenext_dist.hf.modeling_lenext import get_head_scales

        scales, source, length = get_head_scales(hf), info["lenext_source"], info["train_length"]
    ref = megatron_reference(source["checkpoint"], scales)
    if tokens is None:
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, info["vocab_size"], (2, length), generator=gen)
    pos = torch.arange(tokens.shape[1]).expand_as(tokens)
    a = ref(tokens, pos, attention_mask=None).float()
    b = hf(input_ids=tokens, use_cache=False).logits.float()
    return (a - b).abs().max().item()


__all__ = ["ExportError", "export", "verify", "megatron_reference", "head_scales_from",
           "checked_head_scales", "qk_norm_keys", "ship_code", "write_attention_copy", "build_hf_config"]
