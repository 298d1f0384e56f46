"""The weights of a stock export (stock.py): head scales folded into q_proj (or into q_norm.weight
on QK-normed layers) and each form's layout of the rotated q/k rows and MLP.

Scales: a uniform c or HeadScale's m_h multiplies head h's logits m_h / sqrt(d) q.k; with
q = W_q x that is q' = (m_h W_q[h]) x, so the scales fold into q_proj's rows of head h
(`fold_head_scales`). RoPE rotations are linear, so the fold commutes with them. A `uniform`
temperature c folds the same way into the layers it scales (`folded_scales`). A QK-normed layer
would undo a scaled q_proj (`fold_into_qk_norm`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from lenext_dist.attention.qknorm import LEARNED, layer_kinds
from lenext_dist.attention.rope import rotary_dims
from lenext_dist.attention.temperature import applies

from .keymap import HF_HEAD_SCALE, HF_Q_PROJ, HF_QK_NORM


def folded_scales(cfg, scales: Tensor) -> Tensor:
    """The per-head scales [layers, heads] a stock export folds into q_proj: the run's (uniform
    c or learned m_h) times a `uniform` temperature's c on the layers it scales."""
    t = cfg.attention.temperature
    if t.kind != "uniform":
        return scales
    rows = [float(t.c) if applies(t, x) else 1.0 for x in cfg.layer_positions]
    return scales * scales.new_tensor(rows).view(-1, 1)


def fold_into_qk_norm(cfg, hf_state: dict, scales: Tensor) -> tuple[dict, Tensor]:
    """A QK-normed layer normalizes q after q_proj, undoing a scale folded into q_proj: its scale
    goes into q_norm.weight instead (rms: y = w * norm(q), so c y = (c w) * norm(q)), which one
    weight [d] shared by the heads can carry only when the layer's heads share it; the weightless
    l2 norm has no place at all (scales must be 1 there). -> (state, the scales [layers, heads]
    still to fold into q_proj: 1 on the normed layers)."""
    kinds = layer_kinds(cfg.attention, cfg.model.num_layers)
    if not any(kinds):
        return hf_state, scales
    out, rest = dict(hf_state), scales.clone()
    for i, kind in enumerate(kinds):
        if kind is None:
            continue
        row = scales[i]
        if kind in LEARNED and bool((row == row[0]).all()):
            key = HF_QK_NORM.format(i=i, qk="q")
            out[key] = (out[key].float() * float(row[0])).to(out[key].dtype)
        elif not bool((row == 1.0).all()):
            where = ("one q_norm weight shared by the heads cannot carry per-head scales"
                     if kind in LEARNED else "the weightless l2 norm has no weight to carry them")
            raise ValueError(f"layer {i}'s head scales {row.tolist()} cannot be folded into a "
                             f"stock form: its QK-norm undoes a scaled q_proj and {where}")
        rest[i] = 1.0
    return out, rest


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


# ------------------------------------------------------------------ form layouts


def meta_pairs(w: Tensor, heads: int, head_dim: int, inverse: bool = False) -> Tensor:
    """Rows of q/k_proj [heads d, H] from our rotate-half RoPE pairs (i, i + d/2) to Meta's
    complex pairs (2i, 2i + 1) (modeling_llama4.apply_rotary_emb views the last dim as d/2
    complex numbers): new row 2i = old i, new 2i + 1 = old i + d/2, per head; `inverse` maps
    Meta's rows back (the import, hf_import.py)."""
    half = head_dim // 2
    perm = [j for i in range(half) for j in (i, i + half)]
    if inverse:
        perm = sorted(range(head_dim), key=perm.__getitem__)
    return w.view(heads, head_dim, -1)[:, perm].reshape(w.shape).contiguous()


def interleave_pairs(w: Tensor, heads: int, head_dim: int, rotary: int) -> Tensor:
    """Rows of q/k_proj [heads d, H] from our rotate-half pairs (i, i + r/2) of the first r dims
    to interleaved pairs (2i, 2i + 1) (GLM's and Meta's layout): new row 2i = old i, new 2i + 1 =
    old i + r/2, per head; rows r..d-1 (not rotated) stay. q.k is unchanged (the same
    permutation on both)."""
    half = rotary // 2
    perm = [j for i in range(half) for j in (i, i + half)] + list(range(rotary, head_dim))
    return w.view(heads, head_dim, -1)[:, perm].reshape(w.shape).contiguous()


def glm_weights(state: dict, cfg) -> dict:
    """GLM's fused `mlp.gate_up_proj` ([gate; up], chunked in that order by GlmMLP) and its
    interleaved RoPE pairs on q_proj / k_proj."""
    m = cfg.model
    r = rotary_dims(m.head_dim, cfg.attention.rope.fraction)
    out = {}
    for k, v in state.items():
        if k.endswith(".mlp.up_proj.weight"):
            continue
        if k.endswith(".mlp.gate_proj.weight"):
            up = state[k.replace("gate_proj", "up_proj")]
            out[k.replace("gate_proj", "gate_up_proj")] = torch.cat((v, up), dim=0).contiguous()
        elif k.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = m.num_attention_heads if ".q_proj." in k else m.kv_heads
            out[k] = interleave_pairs(v, heads, m.head_dim, r)
        else:
            out[k] = v
    return out
