"""QK-norm (attention.qk_norm, lenext_dist/attention/qknorm.py) and partial RoPE
(attention.rope.fraction): the math against plain torch and against transformers' own modules
(Llama 4's L2 norm, Qwen3's RMSNorm, GPT-NeoX's partial rotation), every kernel path, the
config's one-line refusals, and the megatron model against the HF model of its custom export at
1x and 4x the training length (packed documents and the KV cache too)."""
import math
import os
from types import SimpleNamespace as NS

import pytest
import torch

from lenext_dist.attention import RoPE, attend
from lenext_dist.attention.qknorm import L2Norm, RMSNorm, layer_kinds
from lenext_dist.config import (AttentionConfig, ConfigError, HeadScaleConfig, LayoutConfig,
                                ModelConfig, QKNormConfig, RopeConfig, RunConfig,
                                TemperatureConfig, load_config)
from tiny_models import megatron_and_hf

os.environ.setdefault("DS_ACCELERATOR", "cpu")

B, H, G, D = 2, 4, 2, 16


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---- the norms ---------------------------------------------------------------------------------

def test_norms_against_the_formula_and_transformers():
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x = rand(B, H, 7, D, seed=1) * 3
    ref = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    ours = L2Norm(D, 1e-5)
    torch.testing.assert_close(ours(x).double(), ref, atol=1e-6, rtol=1e-6)
    assert not list(ours.parameters())  # weightless
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(ours(x.to(dtype)), Llama4TextL2Norm(1e-5)(x.to(dtype)))
    rms, qwen = RMSNorm(D, 1e-6), Qwen3RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        rms.weight.copy_(rand(D, seed=2))
        qwen.weight.copy_(rms.weight)
    torch.testing.assert_close(rms(x).double(), ref * rms.weight.double(), atol=1e-5, rtol=1e-5)
    assert torch.equal(rms(x), qwen(x))
    assert torch.equal(rms.to(torch.bfloat16)(x.bfloat16()), qwen.to(torch.bfloat16)(x.bfloat16()))


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_weightless_norm_commutes_with_rope_a_weighted_one_does_not(fraction):
    """Llama 4 normalizes after RoPE, we (and Qwen3) before: the same function for the
    weightless norm (a rotation keeps each pair's x_i^2 + x_{i+r/2}^2), not for a learned weight."""
    rope = RoPE(D, fraction=fraction)
    q, k = rand(B, H, 20, D, seed=3) * 2, rand(B, G, 20, D, seed=4) * 2
    l2 = L2Norm(D, 1e-5)
    before = rope.rotate(l2(q), l2(k), 0)
    after = [l2(t) for t in rope.rotate(q, k, 0)]
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    rms = RMSNorm(D, 1e-5)
    with torch.no_grad():
        rms.weight.copy_(torch.linspace(0.5, 2.0, D))
    assert (rope.rotate(rms(q), rms(k), 0)[0] - rms(rope.rotate(q, k, 0)[0])).abs().max() > 1e-2


# ---- partial RoPE ------------------------------------------------------------------------------

def plain_partial_rope(x, pos, r, base=10000.0):
    """The first r dims rotated in pairs (i, i + r/2) by p base^(-2i/r), float64; the rest as is."""
    theta = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = pos.double()[:, None] * theta  # [s, r/2]
    c, s = ang.cos(), ang.sin()
    x1, x2, rest = x[..., : r // 2].double(), x[..., r // 2: r].double(), x[..., r:].double()
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c, rest), dim=-1)


@pytest.mark.parametrize("fraction,r", [(0.5, 8), (0.25, 4), (0.3, 4), (1.0, 16)])
def test_partial_rope_against_plain_torch_and_gpt_neox(fraction, r):
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    rope = RoPE(D, fraction=fraction)
    assert rope.rotary_dim == r and rope.inv_freq.shape == (r // 2,)
    q, k = rand(B, H, 12, D, seed=5), rand(B, G, 12, D, seed=6)
    pos = torch.arange(3, 15)
    qr, kr = rope.rotate(q, k, pos)
    torch.testing.assert_close(qr.double(), plain_partial_rope(q, pos, r), atol=1e-6, rtol=1e-6)
    assert torch.equal(qr[..., r:], q[..., r:])  # the unrotated dims pass bit for bit
    cos, sin = rope.cos_sin(pos, 12, q.device, q.dtype)  # GPT-NeoX's function on our tables
    nq, nk = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    assert torch.equal(nq, qr) and torch.equal(nk, kr)


def plain_attention(q, k, v, m, *, rotate_dims=None, window=None):
    """softmax(m_h / sqrt(d) q.k + causal (window) mask) v in float64; q, k rotated on their
    first `rotate_dims` dims when given."""
    s, d = q.shape[2], q.shape[-1]
    pos = torch.arange(s)
    r = q.shape[1] // k.shape[1]
    qq, kk, vv = q.double(), k.repeat_interleave(r, 1).double(), v.repeat_interleave(r, 1).double()
    if rotate_dims:
        qq, kk = plain_partial_rope(qq, pos, rotate_dims), plain_partial_rope(kk, pos, rotate_dims)
    logits = qq @ kk.transpose(-1, -2) * (m.double() / math.sqrt(d)).view(1, -1, 1, 1)
    visible = pos[None, :] <= pos[:, None]
    if window is not None:
        visible &= pos[:, None] - pos[None, :] < window
    return torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ vv


@pytest.mark.parametrize("impl,window", [("auto", None), ("eager", None), ("chunked", 5),
                                         ("sdpa_mask", 5), ("flex", 5), ("eager", 5)])
def test_every_kernel_path_runs_partial_rope(impl, window):
    cfg = NS(position="rope", rope=NS(base=10000.0, scaling="none", factor=1.0, fraction=0.5),
             window=window, impl=impl, chunk_size=8)
    from lenext_dist.attention import build_position

    var = build_position(cfg, head_dim=D, train_length=8, num_heads=H)
    q, k, v = rand(B, H, 24, D, seed=7), rand(B, G, 24, D, seed=8), rand(B, G, 24, D, seed=9)
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    out = attend(q, k, v, m, var).double()
    torch.testing.assert_close(out, plain_attention(q, k, v, m, rotate_dims=8, window=window),
                               atol=1e-5, rtol=1e-5)
    full = plain_attention(q, k, v, m, rotate_dims=16, window=window)
    assert (out - full).abs().max() > 1e-2  # half the dims unrotated is another function


# ---- layers and config -------------------------------------------------------------------------

def test_layers_through_the_layout():
    irope = NS(position="rope", chunked=4, layout=NS(kind="irope", every=2))
    assert layer_kinds(NS(**vars(irope), qk_norm=NS(kind="l2", layers="rope")), 4) == \
        ["l2", None, "l2", None]  # Llama 4: RoPE layers only
    assert layer_kinds(NS(**vars(irope), qk_norm=NS(kind="rms", layers="all")), 4) == ["rms"] * 4
    assert layer_kinds(NS(position="rope"), 3) == [None] * 3  # exports made before QK-norm
    from lenext_dist.attention.layout import summary  # the run header's attention line

    cfg = NS(**vars(irope), qk_norm=NS(kind="l2", layers="rope"), rope=NS(fraction=0.5))
    assert summary(cfg, 4) == " (layout irope: rope + chunked 4, nope, rope + chunked 4, nope), " \
        "qk_norm l2 on rope layers, rope fraction 0.5"


@pytest.mark.parametrize("overrides,match", [
    (["attention.qk_norm.kind=layernorm"], "attention.qk_norm.kind"),
    (["attention.qk_norm.kind=rms", "attention.qk_norm.layers=nope"], "attention.qk_norm.layers"),
    (["attention.qk_norm.kind=l2", "attention.qk_norm.eps=0"], "attention.qk_norm.eps must be > 0"),
    (["attention.qk_norm.kind=rms", "attention.qk_norm.layers=rope"],  # a NoPE model: nothing
     "attention.qk_norm.layers: 'rope', but no layer runs RoPE \\(nope x4\\)"),
    (["attention.position=rope", "attention.rope.fraction=0"], "attention.rope.fraction: must be in"),
    (["attention.position=rope", "attention.rope.fraction=1.5"], "attention.rope.fraction: must be in"),
    (["attention.position=rope", "attention.rope.fraction=0.2"],  # 0.2 x 16 = 3 dims: odd
     "fraction 0.2 of head dim 16 rotates 3 dims"),
    (["attention.rope.fraction=0.5"], "position 'nope' has no RoPE rotation"),
    (["attention.position=rope", "attention.rope.fraction=0.125", "attention.rope.scaling=ntk",
      "attention.rope.factor=2"], "'ntk' .* needs >= 4 rotated dims r, got 2"),  # was ZeroDivisionError

    (["attention.position=alibi", "attention.layout.kind=nope_every", "attention.rope.fraction=0.5"],
     "no layer .* runs RoPE"),
])
def test_config_refusals_are_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, ["model.num_layers=4", "model.hidden_size=64",
                           "model.num_attention_heads=4", *overrides])
    assert "\n" not in str(e.value)


# ---- the megatron model and the HF model of the export -----------------------------------------

VOCAB, SEQ, EOS = 128, 16, 2
CASES = {
    # Qwen3-like: RMSNorm on q and k of every layer, half the dims rotate, GQA, uniform c
    "rms_all_partial": dict(position="rope", scale_c=1.3, rope=RopeConfig(fraction=0.5),
                            qk_norm=QKNormConfig(kind="rms")),
    # Llama 4: chunked RoPE layers with the weightless norm, global NoPE layers under its
    # temperature, no norm there
    "l2_irope": dict(position="rope", layout=LayoutConfig(kind="irope", every=2), chunked=5,
                     temperature=TemperatureConfig(kind="llama4", floor_scale=4, attn_scale=0.5),
                     qk_norm=QKNormConfig(kind="l2", layers="rope")),
    # interleaved NoPE/partial RoPE, a learned norm on the RoPE layers only, own eps, learned
    # head scales, a window
    "rms_rope_layers": dict(position="rope", layout=LayoutConfig(kind="nope_every", every=2),
                            window=10, rope=RopeConfig(fraction=0.25),
                            qk_norm=QKNormConfig(kind="rms", layers="rope", eps=1e-3),
                            head_scale=HeadScaleConfig(enabled=True)),
}
NORMED = {"rms_all_partial": [True] * 4, "l2_irope": [True, False] * 2,
          "rms_rope_layers": [True, False] * 2}


def case_cfg(**attn):
    return RunConfig(model=ModelConfig(num_layers=4, hidden_size=64, num_attention_heads=4,
                                       num_query_groups=2, ffn_hidden_size=96, vocab_size=VOCAB,
                                       seq_length=SEQ),
                     attention=AttentionConfig(**attn))


PAIR = dict(jitter=0.5, gain=4.0, tok={"eos": EOS})
"""megatron_and_hf's perturbation here (norms away from 1: a swapped key would show)."""


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_equals_the_hf_export(megatron_1rank, name):
    from lenext_dist.attention import document_ids
    from lenext_dist.hf.modeling_lenext import set_position
    from lenext_dist.model.counts import parameter_counts

    cfg = case_cfg(**CASES[name])
    meg, hf, state, _ = megatron_and_hf(cfg, megatron_1rank, **PAIR)
    kind = cfg.attention.qk_norm.kind
    learned = [f"decoder.layers.{i}.self_attention.core_attention.{qk}_norm.weight"
               for i, on in enumerate(NORMED[name]) if on for qk in "qk"]
    assert sorted(k for k in state if "_norm.weight" in k and "core_attention" in k) == \
        (sorted(learned) if kind == "rms" else [])
    assert [a.q_norm is not None for a in (x.self_attn for x in hf.model.layers)] == NORMED[name]
    assert parameter_counts(cfg) == parameter_counts(meg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mult in (1, 4):
            x = torch.randint(3, VOCAB, (2, mult * SEQ), generator=gen)
            a = meg(x, torch.arange(mult * SEQ).expand_as(x), attention_mask=None)
            b = hf(input_ids=x, use_cache=False).logits
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
            assert a.abs().max() > 1.0
        # packed documents, on both sides
        x[:, [6, 40]] = EOS
        ids = document_ids(x, eos_id=EOS)
        packed = meg(x, torch.arange(x.shape[1]).expand_as(x), attention_mask=ids)
        torch.testing.assert_close(hf(input_ids=x, use_cache=False, document_ids=ids).logits,
                                   packed, atol=1e-4, rtol=1e-4)
        # KV-cache decoding (keys normalized, then rotated, before they are cached) = full forward
        pre = hf(input_ids=x[:, :-3], use_cache=True)
        step = hf(input_ids=x[:, -3:], past_key_values=pre.past_key_values, use_cache=True)
        full = hf(input_ids=x, use_cache=False).logits
        with pytest.raises(ValueError, match="cannot change at evaluation"):  # trained, not a knob
            set_position(hf, qk_norm={"kind": "none"})
        with pytest.raises(ValueError, match="cannot change at evaluation"):
            set_position(hf, rope={"fraction": 1.0})
        torch.testing.assert_close(step.logits, full[:, -3:], atol=1e-4, rtol=1e-4)
        # the norm is the function: the same weights without it give other logits
        plain = dict(CASES[name], qk_norm=QKNormConfig())
        other = megatron_and_hf(case_cfg(**plain), megatron_1rank, **PAIR).meg
        other.load_state_dict(meg.state_dict(), strict=False)
        x = x[:, :SEQ]
        pos = torch.arange(SEQ).expand_as(x)
        assert not torch.allclose(other(x, pos, None), meg(x, pos, None), atol=1e-3)


def test_qk_norm_weights_train(megatron_1rank):
    """The rms weights get gradients (they are parameters of the trained model, no decay)."""
    from lenext_dist.train.optim import param_groups

    cfg = case_cfg(**CASES["rms_all_partial"])
    megatron_1rank(3)
    from lenext_dist.model import build_model

    meg = build_model(cfg, device="cpu")
    x = torch.randint(3, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    loss = meg(x, torch.arange(SEQ).expand_as(x), attention_mask=None, labels=x).mean()
    loss.backward()
    norms = {n: p for n, p in meg.named_parameters() if "_norm.weight" in n and "core_attention" in n}
    assert len(norms) == 8 and all(p.grad is not None and p.grad.abs().max() > 0 for p in norms.values())
    no_decay = {id(p) for g in param_groups(meg, 0.1) if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(p) in no_decay for p in norms.values())
