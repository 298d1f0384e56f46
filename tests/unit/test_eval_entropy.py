"""Attention entropy: known patterns, chunked == unchunked, and the per-layer capture of q/k."""
import math

import numpy as np
import torch

from lenext_dist.attention import eager_causal_attention
from lenext_dist.eval.adapter import capture_qk, head_scales, set_uniform_scale
from lenext_dist.eval.entropy import (entropy_by_position, entropy_from_probs,
                                      evaluate_entropy, summarize_entropy)
from tiny_models import random_docs, tiny_llama


def test_uniform_and_one_hot():
    s = 50
    causal = torch.tril(torch.ones(s, s))
    uniform = causal / causal.sum(-1, keepdim=True)
    np.testing.assert_allclose(entropy_from_probs(uniform).numpy(), np.log(np.arange(1, s + 1)),
                               rtol=1e-6, atol=1e-6)
    one_hot = torch.eye(s)
    assert entropy_from_probs(one_hot).abs().max() == 0


def test_zero_logits_give_log_i():
    # q = 0 -> every visible key has the same logit -> H_i = log(i+1) exactly
    q = torch.zeros(1, 2, 40, 8)
    k = torch.randn(1, 1, 40, 8)
    ent = entropy_by_position(q, k, torch.ones(2), chunk_size=7)
    np.testing.assert_allclose(ent[0, 1].numpy(), np.log(np.arange(1, 41)), rtol=1e-5, atol=1e-6)


def test_chunked_equals_unchunked():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 37, 8) * 3, torch.randn(2, 2, 37, 8) * 3
    m = torch.tensor([1.0, 1.5, 0.8, 2.0])
    full = entropy_by_position(q, k, m, chunk_size=37)
    for c in (1, 5, 16):
        torch.testing.assert_close(entropy_by_position(q, k, m, chunk_size=c), full)
    # and equals the entropy of explicitly materialized probabilities
    kk = k.repeat_interleave(2, 1)
    logits = (q * m.view(1, -1, 1, 1)) @ kk.transpose(-1, -2) / math.sqrt(8)
    logits = logits.masked_fill(~torch.ones(37, 37, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(entropy_from_probs(torch.softmax(logits, -1)), full)


def test_capture_qk_reproduces_attention():
    """The q/k the adapter recomputes for HF Llama give the layer's own attention output."""
    model = tiny_llama(vocab_size=256, train_length=32)
    ids = torch.randint(0, 256, (1, 20))
    cap, qk = {}, {}
    layer = model.model.layers[1].self_attn
    h1 = layer.register_forward_pre_hook(
        lambda mod, a, kw: cap.__setitem__("h", kw["hidden_states"]), with_kwargs=True)
    h2 = layer.register_forward_hook(lambda mod, a, out: cap.__setitem__("o", out[0]))
    capture_qk(model, ids, lambda i, q, k, m: qk.__setitem__(i, (q, k, m)))
    h1.remove(), h2.remove()
    assert sorted(qk) == [0, 1]
    q, k, m = qk[1]
    assert q.shape == (1, 4, 20, 8) and k.shape == (1, 2, 20, 8)
    torch.testing.assert_close(m, torch.ones(4))
    with torch.no_grad():
        v = layer.v_proj(cap["h"]).view(1, 20, -1, 8).transpose(1, 2)
        o = eager_causal_attention(q, k, v, m)
        o = layer.o_proj(o.transpose(1, 2).reshape(1, 20, -1))
    torch.testing.assert_close(o, cap["o"], rtol=1e-4, atol=1e-5)
    set_uniform_scale(model, 1.5)
    assert torch.allclose(head_scales(model), torch.full((2, 4), 1.5))


def test_evaluate_entropy_and_summary():
    model = tiny_llama(vocab_size=512, train_length=32)
    docs = random_docs([200, 100], vocab_size=512)
    r = evaluate_entropy(model, docs, 64, samples=3, batch_size=2, progress=False)
    assert r["entropy"].shape == (2, 4, 64) and r["samples"] == 3
    assert np.all(r["entropy"] <= r["upper_bound"] + 1e-5) and np.all(r["entropy"] >= -1e-6)
    assert r["entropy"][:, :, 0].max() < 1e-6  # position 0 sees one key
    r2 = evaluate_entropy(model, docs, 64, samples=3, batch_size=1, chunk_size=5, progress=False)
    np.testing.assert_allclose(r["entropy"], r2["entropy"], rtol=1e-5, atol=1e-5)
    s = summarize_entropy(r, 32, bins=8)
    assert len(s["mean"]) == len(s["positions"]) and len(s["per_head"]) == 2
    assert 0 < s["normalized_at_L"] <= 1
