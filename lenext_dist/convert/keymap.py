"""The declarative map between megatron-core GPTModel (local spec) keys and the HF lenext/Llama keys.

One table, `KEYMAP`; both directions are derived from it (`megatron_to_hf`, `hf_to_megatron`).
Layouts (DESIGN.md section 8, checked by tests against real megatron modules):

- `linear_qkv.weight` [(h + 2g) d, H] is grouped per query group: for group j the rows are
  [q heads j*h/g .. (j+1)*h/g - 1 (d rows each), k_j (d rows), v_j (d rows)]. -> q/k/v_proj.
- `linear_fc1.weight` [2F, H] is [gate; up] (SwiGLU: silu(gate) * up). -> gate_proj, up_proj.
- `core_attention.head_scale` [h] exists only when the run learned per-head scales (HeadScale);
  otherwise the uniform scale is config (attention.scale_c) and the exporter fills it.
- `core_attention.position.<name>`: learned state of a position variant (KERPLE's r1, r2), one
  set per layer, same relative name on both sides (`self_attn.position.<name>`).
- `core_attention.{q,k}_norm.weight` [d]: QK-norm's learned weights (attention.qk_norm `rms`), on
  the layers it normalizes; `self_attn.{q,k}_norm.weight` on the HF side.
- `output_layer.weight` is absent with tied embeddings (lm_head is then tied in HF too).
- `*._extra_state` entries (Transformer Engine metadata; None in the local spec) are dropped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor

from lenext_dist.attention.names import HEAD_SCALE, HEAD_SCALE_KEY


@dataclass(frozen=True)
class Shape:
    """What the non-trivial transforms need to know about the model."""

    num_layers: int
    num_heads: int
    num_groups: int
    head_dim: int
    tie_embeddings: bool = False

    @classmethod
    def from_run_config(cls, cfg) -> "Shape":
        m = cfg.model
        return cls(m.num_layers, m.num_attention_heads, m.kv_heads, m.head_dim, m.tie_embeddings)


def split_qkv(w: Tensor, s: Shape) -> tuple[Tensor, Tensor, Tensor]:
    """megatron fused [(h + 2g) d, H] (grouped per query group) -> q [h d, H], k [g d, H], v [g d, H]."""
    per = s.num_heads // s.num_groups
    hidden = w.shape[-1]
    w = w.reshape(s.num_groups, per + 2, s.head_dim, hidden)
    q = w[:, :per].reshape(s.num_heads * s.head_dim, hidden)
    k = w[:, per].reshape(s.num_groups * s.head_dim, hidden)
    v = w[:, per + 1].reshape(s.num_groups * s.head_dim, hidden)
    return q.contiguous(), k.contiguous(), v.contiguous()


def merge_qkv(q: Tensor, k: Tensor, v: Tensor, s: Shape) -> Tensor:
    """Inverse of split_qkv."""
    per = s.num_heads // s.num_groups
    hidden = q.shape[-1]
    q = q.reshape(s.num_groups, per, s.head_dim, hidden)
    k = k.reshape(s.num_groups, 1, s.head_dim, hidden)
    v = v.reshape(s.num_groups, 1, s.head_dim, hidden)
    return torch.cat((q, k, v), dim=1).reshape(-1, hidden).contiguous()


def split_gate_up(w: Tensor, s: Shape) -> tuple[Tensor, Tensor]:
    gate, up = w.chunk(2, dim=0)
    return gate.contiguous(), up.contiguous()


def merge_gate_up(gate: Tensor, up: Tensor, s: Shape) -> Tensor:
    return torch.cat((gate, up), dim=0).contiguous()


def _copy(w: Tensor, s: Shape) -> tuple[Tensor]:
    return (w.contiguous(),)


def _uncopy(w: Tensor, s: Shape) -> Tensor:
    return w.contiguous()


@dataclass(frozen=True)
class Rule:
    """megatron key pattern -> HF key pattern(s); `{i}` is the layer index."""

    megatron: str
    hf: tuple[str, ...]
    split: Callable[..., tuple] = _copy  # megatron tensor -> HF tensors (in `hf` order)
    merge: Callable[..., Tensor] = _uncopy  # HF tensors -> megatron tensor
    optional: bool = False  # may be absent (head_scale of a uniform-scale run, tied output layer)
    # `{name}` in a pattern matches a dotted suffix ([\w.]+): such rules are always optional


HF_Q_PROJ = "model.layers.{i}.self_attn.q_proj.weight"
"""q_proj [h d, hidden]: the stock export folds head scales into its rows (stock.py)."""
HF_HEAD_SCALE = "model.layers.{i}.self_attn." + HEAD_SCALE
"""The custom export's fp32 per-head multipliers [h] (absent from stock exports)."""
MEGATRON_HEAD_SCALE = "decoder.layers.{i}.self_attention." + HEAD_SCALE_KEY
"""The training checkpoint's learned per-head multipliers [h] (absent for a uniform scale)."""

MEGATRON_QK_NORM = "decoder.layers.{i}.self_attention.core_attention.{qk}_norm.weight"
"""QK-norm's learned weight [head_dim] of q (qk = q) or k (qk = k), rms kind only."""
HF_QK_NORM = "model.layers.{i}.self_attn.{qk}_norm.weight"
"""The same on the HF side (Qwen3's names: the stock Qwen3 export keeps them)."""

KEYMAP: tuple[Rule, ...] = (
    Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",)),
    Rule("decoder.layers.{i}.input_layernorm.weight", ("model.layers.{i}.input_layernorm.weight",)),
    Rule("decoder.layers.{i}.self_attention.linear_qkv.weight",
         (HF_Q_PROJ, "model.layers.{i}.self_attn.k_proj.weight",
          "model.layers.{i}.self_attn.v_proj.weight"), split_qkv, merge_qkv),
    Rule("decoder.layers.{i}.self_attention.linear_proj.weight",
         ("model.layers.{i}.self_attn.o_proj.weight",)),
    Rule(MEGATRON_HEAD_SCALE, (HF_HEAD_SCALE,), optional=True),
    Rule("decoder.layers.{i}.self_attention.core_attention.position.{name}",
         ("model.layers.{i}.self_attn.position.{name}",), optional=True),
    Rule(MEGATRON_QK_NORM.format(i="{i}", qk="q"), (HF_QK_NORM.format(i="{i}", qk="q"),),
         optional=True),
    Rule(MEGATRON_QK_NORM.format(i="{i}", qk="k"), (HF_QK_NORM.format(i="{i}", qk="k"),),
         optional=True),
    Rule("decoder.layers.{i}.pre_mlp_layernorm.weight",
         ("model.layers.{i}.post_attention_layernorm.weight",)),
    Rule("decoder.layers.{i}.mlp.linear_fc1.weight",
         ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
         split_gate_up, merge_gate_up),
    Rule("decoder.layers.{i}.mlp.linear_fc2.weight", ("model.layers.{i}.mlp.down_proj.weight",)),
    Rule("decoder.final_layernorm.weight", ("model.norm.weight",)),
    Rule("output_layer.weight", ("lm_head.weight",), optional=True),
)

IGNORED = re.compile(r"(^|\.)_extra_state$")

_H, _V, _F = "model.hidden_size", "model.vocab_size", "model.ffn_hidden_size"
_QKV = "model.num_attention_heads, num_query_groups or hidden_size"
SHAPES: dict[str, Callable] = {
    "embedding.word_embeddings.weight": lambda m: ((m.vocab_size, m.hidden_size), (_V, _H)),
    "decoder.layers.{i}.input_layernorm.weight": lambda m: ((m.hidden_size,), (_H,)),
    "decoder.layers.{i}.self_attention.linear_qkv.weight": lambda m: (
        ((m.num_attention_heads + 2 * m.kv_heads) * m.head_dim, m.hidden_size), (_QKV, _H)),
    "decoder.layers.{i}.self_attention.linear_proj.weight": lambda m: (
        (m.hidden_size, m.num_attention_heads * m.head_dim), (_H, _QKV)),
    MEGATRON_HEAD_SCALE: lambda m: ((m.num_attention_heads,), ("model.num_attention_heads",)),
    "decoder.layers.{i}.pre_mlp_layernorm.weight": lambda m: ((m.hidden_size,), (_H,)),
    "decoder.layers.{i}.mlp.linear_fc1.weight": lambda m: ((2 * m.ffn_hidden_size, m.hidden_size),
                                                           (_F, _H)),
    "decoder.layers.{i}.mlp.linear_fc2.weight": lambda m: ((m.hidden_size, m.ffn_hidden_size),
                                                           (_H, _F)),
    "decoder.final_layernorm.weight": lambda m: ((m.hidden_size,), (_H,)),
    "output_layer.weight": lambda m: ((m.vocab_size, m.hidden_size), (_V, _H)),
}
"""megatron key pattern (of KEYMAP) -> (ModelConfig -> (shape, the model.* key(s) behind each
dim)): the shapes a run's config gives its tensors (a position variant's learned state is not
listed: its shapes are the variant's own)."""


def expected_shapes(m) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Every megatron key the model of ModelConfig `m` has (the optional head scales included;
    output_layer.weight only when untied) -> (shape, the model.* keys behind its dims)."""
    out = {}
    for pattern, shape in SHAPES.items():
        if pattern == "output_layer.weight" and m.tie_embeddings:
            continue
        for i in range(m.num_layers) if "{i}" in pattern else [None]:
            out[pattern if i is None else pattern.format(i=i)] = shape(m)
    return out


def _regex(pattern: str) -> re.Pattern:
    rx = re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{name\}", r"(?P<name>[\w.]+)")
    return re.compile("^" + rx + "$")


def _fmt(pattern: str, groups: dict) -> str:
    for k, v in groups.items():
        pattern = pattern.replace("{%s}" % k, str(v))
    return pattern


def _convert(src: dict, s: Shape, from_side: str, to_side: str) -> dict[str, Tensor]:
    """Map every key of `src` by the first KEYMAP rule whose `from_side` pattern matches it.
    Multi-tensor rules (fused QKV, gate/up) are joined on the HF side by their first name."""
    out: dict[str, Tensor] = {}
    seen: dict[tuple, set] = {}  # (rule index, groups) -> matched source names
    unknown = []
    for key in src:
        for n, rule in enumerate(KEYMAP):
            pats = (rule.megatron,) if from_side == "megatron" else rule.hf
            hit = next(((j, m) for j, p in enumerate(pats) if (m := _regex(p).match(key))), None)
            if hit is None:
                continue
            j, m = hit
            groups = m.groupdict()
            if "i" in groups and int(groups["i"]) >= s.num_layers:
                unknown.append(key)
                break
            seen.setdefault((n, tuple(sorted(groups.items()))), set()).add(key)
            break
        else:
            unknown.append(key)
    if unknown:
        raise KeyError(f"{from_side} keys not in the key map (or layers beyond num_layers="
                       f"{s.num_layers}): {unknown[:8]}{' ...' if len(unknown) > 8 else ''}")
    for (n, groups), keys in seen.items():
        rule, g = KEYMAP[n], dict(groups)
        if from_side == "megatron":
            tensors = rule.split(src[_fmt(rule.megatron, g)], s)
            for name, t in zip(rule.hf, tensors):
                out[_fmt(name, g)] = t
        else:
            names = [_fmt(p, g) for p in rule.hf]
            if not all(k in src for k in names):
                raise KeyError(f"HF state has {sorted(keys)} but lacks {[k for k in names if k not in src]}")
            out[_fmt(rule.megatron, g)] = rule.merge(*(src[k] for k in names), s)
    # required keys: every non-optional rule, for every layer
    for rule in KEYMAP:
        if rule.optional:
            continue
        for i in (range(s.num_layers) if "{i}" in rule.megatron else [None]):
            g = {} if i is None else {"i": str(i)}
            want = [_fmt(rule.megatron, g)] if to_side == "megatron" else [_fmt(p, g) for p in rule.hf]
            miss = [k for k in want if k not in out]
            if miss:
                raise KeyError(f"{from_side} checkpoint lacks the source of {miss}")
    return out


def megatron_key(hf_key: str) -> str | None:
    """The megatron key an HF key is a plain copy of (None for a part of a fused tensor, or an
    unknown key)."""
    for rule in KEYMAP:
        if len(rule.hf) == 1 and (m := _regex(rule.hf[0]).match(hf_key)):
            return _fmt(rule.megatron, m.groupdict())
    return None


def megatron_to_hf(state: dict, s: Shape) -> dict[str, Tensor]:
    """megatron GPTModel state dict -> HF state dict. Raises KeyError on an unmapped key or a
    missing required one (a converter must never silently drop or invent weights)."""
    src = {k: v for k, v in state.items() if not IGNORED.search(k)}
    out = _convert(src, s, "megatron", "hf")
    if s.tie_embeddings and "lm_head.weight" in out:
        raise KeyError("tie_embeddings but the checkpoint has an output_layer.weight")
    if not s.tie_embeddings and "lm_head.weight" not in out:
        raise KeyError("untied embeddings but the checkpoint has no output_layer.weight")
    return out


def hf_to_megatron(state: Mapping, s: Shape) -> dict[str, Tensor]:
    """Inverse of megatron_to_hf (the import, hf_import.py). `state` may be a lazy mapping (one
    tensor read per lookup): each source tensor is read once, when its target is built, so only
    the megatron state is held whole."""
    return _convert(state, s, "hf", "megatron")


__all__ = ["Shape", "Rule", "KEYMAP", "SHAPES", "expected_shapes", "HF_Q_PROJ", "HF_HEAD_SCALE",
           "MEGATRON_HEAD_SCALE", "MEGATRON_QK_NORM", "HF_QK_NORM", "megatron_key", "megatron_to_hf",
           "hf_to_megatron", "split_qkv", "merge_qkv", "split_gate_up", "merge_gate_up"]
