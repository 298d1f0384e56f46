"""The one place that knows how a model's attention is laid out (so only this module changes when
the HF modeling code changes).

Two layouts are supported:

- **lenext** (`lenext_dist/hf/modeling_lenext.py`): each `model.model.layers[i].self_attn` is a
  `LenextAttention` with `head_scale` ([heads] fp32 multiplier m; lambda_h = m_h / sqrt(d)),
  `position` (the PositionVariant) and `qk(hidden_states, positions) -> (q [b, h, s, d],
  k [b, g, s, d])`, both already rotated. Scales and eval-time variants go through the modeling
  module's own API (`get_head_scales`, `set_uniform_scale`, `set_head_scales`, `set_position`),
  with no second copy here.
- **llama** (plain `transformers` Llama-like attention with `q_proj`/`k_proj`, `head_dim`,
  `scaling` and rotary `position_embeddings` passed to the attention module): q/k are recomputed
  from the projections and rotated with HF's `apply_rotary_pos_emb`; the uniform scale is set by
  overwriting `self_attn.scaling` (HF passes it to every attention backend).

- **stock** (a `--format stock` export of lenext_dist.convert: transformers' SmolLM3 or Llama,
  config field `lenext_provenance`): Llama-shaped attention whose head scales m [heads] are
  folded into q_proj's rows. q/k as for llama, except that a SmolLM3 layer with `use_rope` 0
  (NoPE) is not rotated. Scales are changed by re-folding: q_proj rows of head h times
  m_new / m_old (the current m per layer is kept on the module as `_lenext_folded`), so
  `--scale-c C` and sweeps give the custom export's numbers (to fp32 rounding). A QK-normed
  layer (Qwen3's q_norm, Llama 4's qk_norm) would undo a scaled q_proj: its per-layer scale goes
  into q_norm.weight or the attention `scaling` instead; attention entropy (q/k recomputed here)
  is refused on stock exports with QK-norm or partial RoPE.

Public API: `attention_layers`, `layout`, `capture_qk`, `head_scales`, `set_uniform_scale`,
`restore_scales`, `train_length`, `trained_with_bos`.
"""
from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from lenext_dist.attention.names import HEAD_SCALE

QKCallback = Callable[[int, Tensor, Tensor, Tensor], None]
"""on_layer(layer_index, q [b, h, s, d] rotated, k [b, g, s, d] rotated, m [h] fp32)."""


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every decoder layer, in order."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no `.model.layers`; not a Llama-shaped causal LM")
    return [layer.self_attn for layer in layers]


def layout(model: nn.Module) -> str:
    """'lenext' or 'llama' (see the module docstring); raises for anything else."""
    attn = attention_layers(model)[0]
    if hasattr(attn, "qk") and hasattr(attn, HEAD_SCALE):
        return "lenext"
    if all(hasattr(attn, a) for a in ("q_proj", "k_proj", "scaling", "head_dim")):
        return "stock" if _provenance(model) is not None else "llama"
    raise TypeError(f"unknown attention module {type(attn).__name__}: expected LenextAttention "
                    "(qk, head_scale) or a Llama attention (q_proj, k_proj, scaling, head_dim)")


def _provenance(model: nn.Module) -> Optional[dict]:
    # the key a stock export writes into its config (convert comes before eval in the pipeline,
    # so eval may read it); imported here, not at the top: the convert package loads its exporter
    from lenext_dist.convert.stock import PROVENANCE

    prov = getattr(getattr(model, "config", None), PROVENANCE, None)
    return prov if isinstance(prov, dict) else None


def _stock_folded(model: nn.Module) -> list[Tensor]:
    """The m [heads] fp32 currently folded into each layer's q_proj (from the provenance at
    first use, then whatever set_head_scales folded)."""
    layers = attention_layers(model)
    if not hasattr(layers[0], "_lenext_folded"):
        table = torch.tensor(_provenance(model)["head_scales"], dtype=torch.float32)
        for a, row in zip(layers, table):
            a._lenext_folded, a._lenext_loaded = row.clone(), row.clone()
    return [a._lenext_folded for a in layers]


def _loaded(a: nn.Module, name: str, w: Tensor) -> Tensor:
    """Weight `name` of attention `a` as loaded (copied at its first change): every refold scales
    it, never the last refold's bf16 result, so a sweep's steps do not compound roundings (the
    scale applied drifted by 0.005-0.035 over 120 steps, q_proj 10% off after restore)."""
    kept = a.__dict__.setdefault("_lenext_weights", {})
    if name not in kept:
        kept[name] = w.detach().clone()
    return kept[name]


def _stock_refold(model: nn.Module, m: Tensor) -> None:
    """q_proj rows of head h of layer l = the loaded rows times m[l, h] / (the m folded at load);
    on a layer whose QK-norm would undo that (Qwen3's q_norm, Llama 4's qk_norm),
    `_refold_normed`."""
    _stock_folded(model)  # at first use: each layer's _lenext_loaded, the m folded at load
    for a, new in zip(attention_layers(model), m.float().cpu()):
        w = a.q_proj.weight  # [h d, hidden]
        ratio = (new / a._lenext_loaded).to(device=w.device)
        if _refold_normed(a, ratio):
            continue
        with torch.no_grad():
            w.copy_((_loaded(a, "q_proj", w).float().view(ratio.numel(), a.head_dim, -1) * ratio.view(-1, 1, 1))
                    .reshape(w.shape).to(w.dtype))
        a._lenext_folded = new.clone()


def _refold_normed(a: nn.Module, ratio: Tensor) -> bool:
    """A QK-normed stock layer normalizes q after q_proj: a scale ratio to the loaded one (one per
    layer: the norm is shared by the heads) goes into q_norm.weight (Qwen3: the loaded weight
    times it), or into the attention `scaling` of a weightless norm (Llama 4, whose scaling
    set_head_scales has just reset; `_lenext_folded` then keeps the q_proj share, `head_scales`
    multiplies the two). False for a layer without QK-norm."""
    norm = getattr(a, "q_norm", None) or getattr(a, "qk_norm", None)
    if norm is None:
        return False
    if not bool((ratio == ratio[0]).all()):
        raise ValueError("per-head scales on a stock export's QK-normed layer (its norm is shared "
                         "by the heads): use the custom export (--format custom)")
    with torch.no_grad():
        if getattr(norm, "weight", None) is not None:
            w0 = _loaded(a, "q_norm", norm.weight)
            norm.weight.copy_((w0.float() * float(ratio[0])).to(w0.dtype))
            a._lenext_folded = a._lenext_loaded * float(ratio[0])
        else:
            a.scaling = float(a.scaling) * float(ratio[0])
    return True


def _num_heads(attn: nn.Module) -> int:
    n = getattr(attn, "num_heads", None)
    return int(n) if n is not None else int(attn.config.num_attention_heads)


def _llama_m(attn: nn.Module) -> Tensor:
    # HF logits are scaling * q.k; scaling = m / sqrt(d) -> m = scaling * sqrt(d)
    return torch.full((_num_heads(attn),), float(attn.scaling) * math.sqrt(attn.head_dim))


def head_scales(model: nn.Module) -> Tensor:
    """m [layers, heads] fp32 (lambda_h = m_h / sqrt(d))."""
    kind = layout(model)
    if kind == "stock":  # folded m times whatever scaling the attention applies on top
        return torch.stack([f * _llama_m(a) for a, f in zip(attention_layers(model),
                                                             _stock_folded(model))])
    if kind == "lenext":
        return _own(model, "get_head_scales")(model)
    return torch.stack([_llama_m(a) for a in attention_layers(model)])


def _own(model: nn.Module, name: str) -> Callable:
    """The lenext export's own eval API (`lenext_dist/hf/modeling_lenext.py`, shipped with the
    model: also under remote code), so the scale logic lives with the model it changes."""
    fn = getattr(inspect.getmodule(type(model)), name, None)  # the model class's own module
    if fn is None:
        raise TypeError(f"{type(model).__name__}: its modeling code has no `{name}`; re-export "
                        "the checkpoint with this lenext_dist (python -m lenext_dist.convert)")
    return fn


def set_uniform_scale(model: nn.Module, c: float) -> None:
    """Every head of every layer gets lambda = c / sqrt(d)."""
    kind = layout(model)
    if kind == "stock":
        n = len(attention_layers(model))
        set_head_scales(model, torch.full((n, _num_heads(attention_layers(model)[0])), float(c)))
        return
    if kind == "lenext":
        _own(model, "set_uniform_scale")(model, float(c))
        return
    for a in attention_layers(model):
        a.scaling = float(c) / math.sqrt(a.head_dim)


def set_variant(model: nn.Module, *, rope: Optional[dict] = None, **options) -> None:
    """Eval-time attention options on an exported lenext model, e.g. a sliding window on any
    variant (`window=128`), a RoPE extension (`rope={"scaling": "ntk", "factor": 4.0}`) or a
    temperature schedule (`temperature={"kind": "log_fit", "a": 0.3}`); uses the model's own
    shipped `set_position`."""
    if layout(model) != "lenext":
        raise ValueError("window / RoPE scaling / temperature options need a custom lenext "
                         "export (python -m lenext_dist.convert --format custom); a stock or "
                         "plain Llama model has its attention fixed by its config")
    _own(model, "set_position")(model, rope=rope, **options)
    # an export's own code predating an option ignores it: refuse rather than evaluate without it
    stale = sorted(k for k in options if not all(hasattr(a.position, k) for a in attention_layers(model)))
    if stale:
        raise ValueError(f"this export's modeling code predates {', '.join(stale)}: re-export the "
                         "checkpoint with this lenext_dist (python -m lenext_dist.convert)")


def set_head_scales(model: nn.Module, m: Tensor) -> None:
    """m [layers, heads]: lambda_{l,h} = m[l, h] / sqrt(d). Plain Llama supports one value only;
    a stock export re-folds them into q_proj (its attention `scaling` is reset to 1/sqrt(d))."""
    kind = layout(model)
    if kind == "stock":
        for a in attention_layers(model):
            a.scaling = 1.0 / math.sqrt(a.head_dim)
        _stock_refold(model, m)
        return
    if kind == "lenext":
        _own(model, "set_head_scales")(model, m)
        return
    if not torch.all(m == m.reshape(-1)[0]):
        raise ValueError("a plain Llama model has one scale for all heads; use a lenext model")
    set_uniform_scale(model, float(m.reshape(-1)[0]))


@contextmanager
def restore_scales(model: nn.Module) -> Iterator[None]:
    """Put the model's scales back after a block that changes them (scale sweeps)."""
    saved = head_scales(model)
    cfg = getattr(model, "config", None)
    meta = {k: getattr(cfg, k) for k in ("scale_c", "head_scale_source") if hasattr(cfg, k)}
    try:
        yield
    finally:
        set_head_scales(model, saved)
        for k, v in meta.items():  # the modeling helpers record what they did in the config
            setattr(cfg, k, v)


def train_length(model: nn.Module) -> Optional[int]:
    """The training context L, from the config: `train_length`, `seq_length`, the rope scaling's
    `original_max_position_embeddings`, else `max_position_embeddings`."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    prov = _provenance(model)
    if prov is not None and prov.get("train_length"):
        return int(prov["train_length"])
    for key in ("train_length", "seq_length", "original_max_position_embeddings"):
        v = getattr(cfg, key, None)
        if v:
            return int(v)
    for key in ("rope_scaling", "rope_parameters"):
        rs = getattr(cfg, key, None)
        if isinstance(rs, dict) and rs.get("original_max_position_embeddings"):
            return int(rs["original_max_position_embeddings"])
    v = getattr(cfg, "max_position_embeddings", None)
    return int(v) if v else None


def trained_with_bos(model: nn.Module, model_dir: Optional[str] = None) -> bool:
    """Whether training put BOS before every document: the config's `bos_at_document_start`
    (lenext exports, from data.bos); else `add_bos_token` of `model_dir`/tokenizer_config.json;
    else False (shards made before data.bos existed had none)."""
    v = getattr(getattr(model, "config", None), "bos_at_document_start", None)
    if v is not None:
        return bool(v)
    if model_dir:
        import json
        import os

        from lenext_dist.errors import UserError

        path = os.path.join(model_dir, "tokenizer_config.json")
        if os.path.isfile(path):
            try:
                with open(path, "rb") as f:
                    return bool(json.load(f).get("add_bos_token", False))
            except (ValueError, AttributeError) as e:  # not JSON, or not an object
                raise UserError(f"{path}: damaged ({type(e).__name__}: {str(e)[:120]}); copy the "
                                "model folder again, or pass --bos / --no-bos") from None
    return False


def _llama_qk(attn: nn.Module, hidden: Tensor, kwargs: dict) -> tuple[Tensor, Tensor]:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, s, _ = hidden.shape
    q = attn.q_proj(hidden).view(b, s, -1, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(hidden).view(b, s, -1, attn.head_dim).transpose(1, 2)
    pe = kwargs.get("position_embeddings")
    # SmolLM3 hands cos/sin to every layer; a NoPE layer (use_rope 0) ignores them
    if pe is not None and getattr(attn, "use_rope", 1):
        cos, sin = pe
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k


def capture_qk(model: nn.Module, input_ids: Tensor, on_layer: QKCallback) -> None:
    """Run one forward pass of `input_ids` [b, s] and call `on_layer(i, q, k, m)` for every
    layer, from inside the layer (so only one layer's q/k is alive at a time)."""
    kind = layout(model)
    if any(getattr(a, "sliding_window", None) for a in attention_layers(model)):
        raise ValueError("attention entropy of a model with a sliding window in its config "
                         "(a stock SmolLM3 export): use the custom export (--format custom), "
                         "whose window the entropy code applies")
    prov = _provenance(model) or {}
    if kind == "stock" and ((prov.get("qk_norm") or {}).get("kind", "none") != "none"
                            or (prov.get("rope") or {}).get("fraction", 1.0) != 1.0):
        raise ValueError("attention entropy of a stock export with QK-norm or partial RoPE: use "
                         "the custom export (--format custom), whose q/k the entropy code reads")
    handles = []
    # m [layers, heads]; q from q_proj already carries a stock export's folded m: only its
    # attention `scaling` is left to apply
    scales = (head_scales(model) if kind == "lenext"
              else torch.stack([_llama_m(a) for a in attention_layers(model)]))

    def make_hook(i: int, attn: nn.Module):
        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            if kind == "lenext":  # LenextAttention.forward(hidden_states, positions, cache)
                positions = args[1] if len(args) > 1 else kwargs.get("positions", 0)
                q, k = attn.qk(hidden, positions)
            else:
                q, k = _llama_qk(attn, hidden, kwargs)
            on_layer(i, q, k, scales[i].to(q.device))
        return hook

    for i, attn in enumerate(attention_layers(model)):
        handles.append(attn.register_forward_pre_hook(make_hook(i, attn), with_kwargs=True))
    try:
        with torch.inference_mode():
            base = getattr(model, "model", model)
            base(input_ids=input_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
