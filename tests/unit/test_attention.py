"""lenext_dist.attention: the core function against an independent explicit-softmax reference,
causality, scale semantics, and RoPE (+ PI / NTK / YaRN) against direct formulas."""
import math

import pytest
import torch

from lenext_dist.attention import (POSITIONS, NoPE, RoPE, attend, build_position,
                                   causal_attention, eager_causal_attention, iter_attention_probs)
from lenext_dist.config import AttentionConfig, ConfigError, RopeConfig

B, S, D = 2, 12, 8


def naive_attention(q, k, v, m):
    """Independent reference: loops over heads, explicit lambda_h = m_h / sqrt(d), triu mask."""
    b, h, s, d = q.shape
    r = h // k.shape[1]
    out = torch.empty(b, h, s, d, dtype=torch.float64)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    for j in range(h):
        kj, vj = k[:, j // r].double(), v[:, j // r].double()  # head j reads group j // r
        scores = (m[j].double() / math.sqrt(d)) * q[:, j].double() @ kj.transpose(-1, -2)
        out[:, j] = torch.softmax(scores.masked_fill(mask, -math.inf), -1) @ vj
    return out


def rand_qkv(h, g, s=S, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, h, s, D, generator=gen), torch.randn(B, g, s, D, generator=gen),
            torch.randn(B, g, s, D, generator=gen))


def variant(name):
    return NoPE() if name == "nope" else RoPE(D, train_length=S)


@pytest.mark.parametrize("name", ["nope", "rope"])
@pytest.mark.parametrize("h,g", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("scale", ["uniform", "per_head"])
def test_attend_matches_reference(name, h, g, scale):
    q, k, v = rand_qkv(h, g)
    m = torch.full((h,), 1.3) if scale == "uniform" else torch.tensor([0.7, 1.0, 1.6, 2.5])[:h]
    var = variant(name)
    qr, kr = var.rotate(q, k, torch.arange(S))
    ref = naive_attention(qr, kr, v, m).float()
    torch.testing.assert_close(attend(q, k, v, m, var), ref, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(attend(q, k, v, m, var, eager=True), ref, atol=2e-6, rtol=1e-5)


def test_uniform_equals_sdpa_scale_and_per_head_equal_is_bitwise():
    q, k, v = rand_qkv(4, 2)
    c = 1.37
    uniform = causal_attention(q, k, v, torch.full((4,), c))
    per_head = causal_attention(q, k, v, torch.tensor([c, c, c, c]))
    assert torch.equal(uniform, per_head)
    # m = c means lambda = c / sqrt(d): SDPA's own scale argument gives the same function
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True,
        scale=c / math.sqrt(D))
    torch.testing.assert_close(uniform, sdpa, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["nope", "rope"])
def test_causal_future_tokens_change_nothing(name):
    q, k, v = rand_qkv(4, 2)
    m = torch.tensor([0.9, 1.1, 1.3, 1.5])
    t = 5  # rows 0..t see only positions 0..t
    out = attend(q, k, v, m, variant(name))
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:]) * 10
    out2 = attend(q2, k2, v2, m, variant(name))
    torch.testing.assert_close(out[:, :, :t + 1], out2[:, :, :t + 1], atol=0, rtol=0)
    assert not torch.allclose(out[:, :, t + 1:], out2[:, :, t + 1:])


def test_gradient_reaches_head_scale():
    q, k, v = rand_qkv(4, 2)
    m = torch.full((4,), 1.2, requires_grad=True)
    attend(q, k, v, m, NoPE()).square().sum().backward()
    assert m.grad is not None and torch.all(m.grad != 0)


@pytest.mark.parametrize("name", ["nope", "rope"])
def test_kv_cache_decoding_matches_full(name):
    q, k, v = rand_qkv(4, 2)
    m = torch.full((4,), 1.2)
    var = variant(name)
    full = attend(q, k, v, m, var)
    for new in (1, 3):  # decode one token / prefill a few with a cache
        past = S - new
        _, k_all = var.rotate(q, k, torch.arange(S))  # the cache's keys and the new ones, rotated
        out = attend(q[:, :, past:], k_all, v, m, var, keys_rotated=True)
        torch.testing.assert_close(out, full[:, :, past:], atol=2e-6, rtol=1e-5)
        with pytest.raises(ValueError, match="keys_rotated"):  # which keys are turned: never a guess
            attend(q[:, :, past:], k_all, v, m, var)


def test_attention_probs_by_chunks():
    q, k, _ = rand_qkv(4, 2)
    m = torch.full((4,), 1.0)
    whole = torch.cat([p for _, p in iter_attention_probs(q, k, m, chunk_size=S)], dim=2)
    chunks = list(iter_attention_probs(q, k, m, chunk_size=5))
    assert [s for s, _ in chunks] == [0, 5, 10]
    torch.testing.assert_close(torch.cat([p for _, p in chunks], dim=2), whole)
    assert whole.shape == (B, 4, S, S) and whole.dtype == torch.float32
    torch.testing.assert_close(whole.sum(-1), torch.ones(B, 4, S))
    assert torch.all(whole.triu(diagonal=1) == 0)


def test_eager_score_mod_hook():
    """The seam for additive biases: an ALiBi-like bias through score_mod in the eager path."""
    q, k, v = rand_qkv(4, 4)
    m = torch.ones(4)
    slope = 0.5
    out = eager_causal_attention(
        q, k, v, m, score_mod=lambda s, qp, kp: s - slope * (qp[:, None] - kp[None, :]).abs())
    # reference: explicit logits with the same bias
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    pos = torch.arange(S)
    scores = scores - slope * (pos[:, None] - pos[None, :]).abs()
    scores = scores.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), -math.inf)
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=2e-6, rtol=1e-5)


# ---- RoPE ------------------------------------------------------------------------------------

def test_rope_equals_complex_rotation():
    """rotate_half layout: pair i = (x[i], x[i + d/2]) rotates by p * base^(-2i/d)."""
    d, s = 8, 6
    x = torch.randn(1, 1, s, d, dtype=torch.float64).float()
    rope = RoPE(d, base=100.0)
    rx, _ = rope.rotate(x, x, torch.arange(s))
    for p in range(s):
        for i in range(d // 2):
            theta = p * 100.0 ** (-2 * i / d)
            z = complex(x[0, 0, p, i], x[0, 0, p, i + d // 2]) * complex(math.cos(theta),
                                                                       math.sin(theta))
            assert abs(rx[0, 0, p, i].item() - z.real) < 1e-5
            assert abs(rx[0, 0, p, i + d // 2].item() - z.imag) < 1e-5


def test_rope_scores_are_relative():
    d = 8
    rope = RoPE(d)
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
    def score(i, j):
        qi, _ = rope.rotate(q, q, torch.tensor([i]))
        _, kj = rope.rotate(k, k, torch.tensor([j]))
        return (qi * kj).sum().item()
    assert abs(score(7, 3) - score(24, 20)) < 1e-4


def test_pi_divides_positions():
    s_factor = 4.0
    pi, plain = RoPE(D, scaling="pi", factor=s_factor), RoPE(D)
    x = torch.randn(1, 2, 10, D)
    pos = torch.arange(10)
    torch.testing.assert_close(pi.rotate(x, x, pos)[0], plain.rotate(x, x, pos / s_factor)[0])


def test_ntk_changes_base():
    s_factor, d, base = 8.0, 16, 10000.0
    ntk = RoPE(d, base=base, scaling="ntk", factor=s_factor)
    direct = RoPE(d, base=base * s_factor ** (d / (d - 2)))
    torch.testing.assert_close(ntk.inv_freq, direct.inv_freq)
    plain = RoPE(d, base=base)
    # NTK-aware: the highest frequency is kept, the lowest one is interpolated by exactly 1/s
    assert ntk.inv_freq[0] == plain.inv_freq[0] == 1.0
    torch.testing.assert_close(ntk.inv_freq[-1], plain.inv_freq[-1] / s_factor)


@pytest.mark.parametrize("scaling,factor", [("yarn", 4.0), ("yarn", 16.0), ("pi", 4.0)])
def test_rope_scalings_match_transformers(scaling, factor):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, L = 64, 2048
    params = {"rope_type": "yarn" if scaling == "yarn" else "linear", "factor": factor,
              "rope_theta": 10000.0, "original_max_position_embeddings": L}
    hf_cfg = LlamaConfig(hidden_size=d * 4, num_attention_heads=4, head_dim=d,
                         max_position_embeddings=int(L * factor), rope_parameters=params)
    inv_freq, attn_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_cfg, "cpu")
    ours = RoPE(d, scaling=scaling, factor=factor, train_length=L)
    torch.testing.assert_close(ours.inv_freq, inv_freq.float(), atol=0, rtol=1e-6)
    assert ours.mscale == pytest.approx(attn_factor)
    if scaling == "yarn":
        assert ours.mscale == pytest.approx(0.1 * math.log(factor) + 1)  # logits x mscale^2
    # how the attribute is applied: transformers' rotary module returns cos/sin already multiplied
    # by attention_scaling, and its apply_rotary_pos_emb rotates q and k with them
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    pos = torch.arange(0, 3 * L, 97)[None]  # [1, s] positions inside and beyond L
    x = torch.randn(1, pos.shape[1], d, generator=torch.Generator().manual_seed(1))
    cos, sin = LlamaRotaryEmbedding(hf_cfg)(x, pos)  # [1, s, d] each
    q = torch.randn(1, 2, pos.shape[1], d, generator=torch.Generator().manual_seed(2))
    k = torch.randn(1, 2, pos.shape[1], d, generator=torch.Generator().manual_seed(3))
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = ours.rotate(q, k, pos[0])
    torch.testing.assert_close(oq, hq, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ok, hk, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("factor", [4.0, 16.0])
def test_yarn_logits_are_the_complex_rotation_times_mscale_squared(factor):
    """q_m . k_n after YaRN = mscale^2 * Re[sum_i qc_i conj(kc_i) e^{i (m - n) theta_i}] (arXiv:
    2309.00071 eq. 2 with sec. 3.4's temperature), pairs (x1_i, x2_i) as complex numbers, computed
    in float64 from YaRN's inv_freq only: a temperature applied to cos but not sin, or once instead
    of twice, fails."""
    d, L = 16, 64
    y = RoPE(d, scaling="yarn", factor=factor, train_length=L)
    gen = torch.Generator().manual_seed(0)
    pos = torch.tensor([0, 5, 63, 64, 200, 255])
    q = torch.randn(1, 1, len(pos), d, generator=gen)
    k = torch.randn(1, 1, len(pos), d, generator=gen)
    rq, rk = y.rotate(q, k, pos)
    got = (rq[0, 0].double() @ rk[0, 0].double().T)  # [s, s] logits (before 1/sqrt(d))
    qc = torch.complex(q[0, 0, :, : d // 2].double(), q[0, 0, :, d // 2:].double())  # [s, d/2]
    kc = torch.complex(k[0, 0, :, : d // 2].double(), k[0, 0, :, d // 2:].double())
    theta = y.inv_freq.double()  # [d/2]
    dpos = (pos[:, None] - pos[None, :]).double()  # [s, s] m - n
    rot = torch.exp(1j * dpos[..., None] * theta)  # [s, s, d/2]
    ref = (qc[:, None, :] * kc.conj()[None, :, :] * rot).sum(-1).real
    mscale = 0.1 * math.log(factor) + 1
    torch.testing.assert_close(got, mscale ** 2 * ref, atol=1e-4, rtol=1e-5)


# ---- registry ---------------------------------------------------------------------------------

def test_registry_builds_from_config():
    assert {"nope", "rope"} <= set(POSITIONS)
    v = build_position(AttentionConfig(position="rope", rope=RopeConfig(scaling="ntk", factor=2.0)),
                       head_dim=16, train_length=128)
    assert isinstance(v, RoPE) and v.scaling == "ntk" and v.factor == 2.0
    assert isinstance(build_position(AttentionConfig(), head_dim=16, train_length=128), NoPE)
    with pytest.raises(ConfigError, match="attention.position"):
        AttentionConfig(position="alibi-not-yet")
    with pytest.raises(ValueError, match="rope scaling"):
        RoPE(8, scaling="nope")


def test_rope_int_start_equals_tensor_positions_and_is_cached():
    rope = RoPE(D)
    x = torch.randn(1, 2, 6, D)
    a, _ = rope.rotate(x, x, 3)
    cos_cached = rope._cache[1]
    b, _ = rope.rotate(x, x, torch.arange(3, 9))
    assert torch.equal(a, b)
    rope.rotate(x, x, 3)
    assert rope._cache[1] is cos_cached  # same range: no recomputation


def test_the_reference_path_reads_a_mask_without_documents():
    """eager_causal_attention(mask=MaskSpec(window=2)) hides keys 2+ back (the mask was read
    with packed documents only): equal to the window's own eager path."""
    from lenext_dist.attention import MaskSpec, eager_causal_attention

    g = torch.Generator().manual_seed(0)
    q, v = torch.randn(1, 2, 8, D, generator=g), torch.randn(1, 2, 8, D, generator=g)
    m = torch.ones(2)
    plain = eager_causal_attention(q, q, v, m)
    windowed = eager_causal_attention(q, q, v, m, mask=MaskSpec(window=2))
    assert not torch.allclose(plain[:, :, 2:], windowed[:, :, 2:])
    torch.testing.assert_close(windowed[:, :, :2], plain[:, :, :2])  # nothing hidden yet
    nope = NoPE()
    nope.configure({"window": 2}, train_length=8)
    torch.testing.assert_close(windowed, attend(q, q, v, m, nope, eager=True))


def test_a_forward_with_grad_after_an_inference_mode_one_trains():
    """An evaluation under torch.inference_mode, then training at the same length (the HF model
    evaluated, then fine-tuned in one process): the cached cos/sin were inference tensors, which
    autograd refused to save ("Inference tensors cannot be saved for backward")."""
    rope = RoPE(D)
    x = torch.randn(1, 2, 6, D)
    with torch.inference_mode():
        rope.rotate(x, x, 0)
    q = x.clone().requires_grad_()
    out, _ = rope.rotate(q, x, 0)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_head_scale_multiplies_bf16_queries_in_fp32():
    """m_h = 1.2 is 1.203125 in bf16: the scaled query is rounded once, from the fp32 product."""
    from lenext_dist.attention.paths import scaled_query

    q = torch.randn(2, 4, 16, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    m = torch.full((4,), 1.2)
    got = scaled_query(q, m, None)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, (q.float() * 1.2).bfloat16())
    assert not torch.equal(got, q * m.bfloat16().view(1, -1, 1, 1))  # the old double rounding
