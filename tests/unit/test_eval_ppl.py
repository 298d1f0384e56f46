"""Sliding-window PPL equals a brute-force loop over windows, for every protocol."""
import math

import numpy as np
import pytest
import torch

from lenext_dist.eval.ppl import (context_diagnostics, evaluate_ppl, plan_document, run_ppl,
                                  plan_windows)
from lenext_dist.eval.scoring import Window, score_windows
from tiny_models import random_docs, tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=512, train_length=32)


@pytest.fixture(scope="module")
def docs():
    return random_docs([150, 40, 97, 20], vocab_size=512)  # doc of 20 tokens is too short for W=32


def token_nll(model, ids):
    """Brute force: one window, batch 1, full logits -> nll of predicting ids[p+1] at p."""
    with torch.no_grad():
        logits = model(torch.as_tensor(ids)[None]).logits[0, :-1].double()
    lp = torch.log_softmax(logits, -1)
    tgt = torch.as_tensor(ids[1:])
    return (-lp[torch.arange(len(tgt)), tgt]).numpy()


def brute_force(model, docs, W, S, protocol):
    """The protocols written as the plain loops of their descriptions."""
    total, n = 0.0, 0
    for d in docs:
        t = d.tokens
        if len(t) < W + 1:
            continue
        if protocol == "last-stride":
            for a in range(0, len(t), S):
                if a + W + 1 > len(t):
                    break
                nll = token_nll(model, t[a:a + W + 1])  # W predictions
                total += nll[-S:].sum()
                n += S
        elif protocol == "full":
            for a in range(0, len(t) - W, W):
                nll = token_nll(model, t[a:a + W + 1])
                total += nll.sum()
                n += W
        else:  # yarn: HF perplexity guide loop, targets scored once
            prev_end = 0
            for a in range(0, len(t), S):
                end = min(a + W + 1, len(t))  # input+target tokens t[a:end]
                trg = end - max(prev_end, a + 1)
                nll = token_nll(model, t[a:end])
                total += nll[-trg:].sum()
                n += trg
                prev_end = end
                if end == len(t):
                    break
    return total / n, n


@pytest.mark.parametrize("protocol", ["last-stride", "yarn", "full"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_ppl_matches_brute_force(model, docs, protocol, batch_size):
    W, S = 32, 8
    ref_nll, ref_n = brute_force(model, docs, W, S, protocol)
    r = evaluate_ppl(model, docs, W, stride=S, protocol=protocol, batch_size=batch_size,
                     progress=False)
    assert r["scored_tokens"] == ref_n
    assert r["nll"] == pytest.approx(ref_nll, rel=1e-5)
    assert r["ppl"] == pytest.approx(math.exp(ref_nll), rel=1e-5)
    assert r["documents_skipped"] == ["doc3"]


def test_yarn_scores_every_target_once():
    for n in (33, 40, 64, 100, 129):
        seen = []
        for a, length, lo, hi in plan_document(n, 32, 8, "yarn"):
            seen += [a + p + 1 for p in range(lo, hi)]
            assert a + length + 1 <= n
        assert seen == list(range(1, n))


def test_last_stride_context_and_budget(docs):
    for _a, length, lo, hi in plan_document(150, 32, 8, "last-stride"):
        assert (length, lo, hi) == (32, 24, 32)  # context >= W - S + 1 for every scored token
    ws, skipped = plan_windows(docs, 32, 8, "last-stride", budget_tokens=20)
    assert sum(w.scored for w in ws) == 24 and [w.doc for w in ws] == [0, 1, 2]  # round robin


def test_hidden_path_equals_logits_path(model, docs):
    ws = [Window(0, 5, 32, 0, 32), Window(2, 0, 20, 4, 20)]
    a = score_windows(model, docs, ws, batch_size=2)

    class LogitsOnly(torch.nn.Module):  # no .model/.lm_head: the generic fallback path
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids)

    b = score_windows(LogitsOnly(model), docs, ws, batch_size=1)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_curve_all_and_penalty(model, docs):
    r = evaluate_ppl(model, docs, 32, stride=8, protocol="last-stride", curve_all=True,
                     progress=False)
    loss = r["position_curve"]["loss"]
    assert len(loss) == 32 and all(v is not None for v in loss)
    ref_nll, _ = brute_force(model, docs, 32, 8, "last-stride")
    assert r["nll"] == pytest.approx(ref_nll, rel=1e-5)
    d = context_diagnostics(model, docs, 64, 32, penalty_stride=8, progress=False)
    assert d["context_use"]["gain"] is not None and d["windows"] == 3
    # penalty by brute force on one window: positions 48..63 (s in (1.5, 2]); the baseline of
    # position p is the window of L=32 tokens starting at the multiple of the stride (8) that
    # puts p among its last 8 positions (context 25..32)
    d1 = context_diagnostics(model, [docs[0]], 64, 32, penalty_stride=8, budget_tokens=1,
                             progress=False)
    assert d1["windows"] == 1 and d1["baseline_windows"] == 4
    t = docs[0].tokens
    full = token_nll(model, t[0:65])
    pens = []
    for p in range(48, 64):
        b0 = ((p - 32) // 8 + 1) * 8
        assert 25 <= p - b0 + 1 <= 32
        pens.append(full[p] - token_nll(model, t[b0:b0 + 33])[p - b0])
    row = [x for x in d1["penalty_by_s"] if x["s_from"] == 1.5][0]
    assert row["penalty"] == pytest.approx(float(np.mean(pens)), abs=1e-4)
    cu = d1["context_use"]
    assert cu["loss_pos_4_8"] == pytest.approx(float(full[4:8].mean()), abs=1e-4)
    assert cu["loss_pos_halfL_L"] == pytest.approx(float(full[16:32].mean()), abs=1e-4)
    # paired: the targets of positions 16..31 again, from windows t[p0-4 : p0+4] (p0 = 16, 20, ..)
    short = [token_nll(model, t[p0 - 4:p0 + 5])[4:8] for p0 in range(16, 32, 4)]
    assert cu["targets"] == 16
    assert cu["loss_short_context"] == pytest.approx(float(np.mean(short)), abs=1e-4)
    assert cu["gain"] == pytest.approx(float(np.mean(short) - full[16:32].mean()), abs=1e-4)
    assert cu["gain_unpaired"] == pytest.approx(float(full[4:8].mean() - full[16:32].mean()),
                                                abs=1e-4)


class _Bigram(torch.nn.Module):
    """Logits from the current token only: a model that uses no context at all."""

    def __init__(self, vocab_size):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, vocab_size)

    def forward(self, input_ids):
        return type("Out", (), {"logits": self.emb(input_ids)})()


def test_paired_context_use_is_zero_without_context_use_where_unpaired_is_not():
    """Documents whose first tokens are drawn from another distribution than their middles: the
    unpaired gain (positions [4, 8) vs [L/2, L): other tokens) reports context use by a model that
    has none; the paired gain (the same targets with 5..8 vs 17..32 tokens) is 0."""
    from lenext_dist.eval.data import EvalDoc

    torch.manual_seed(0)
    model = _Bigram(64).eval()
    rng = np.random.default_rng(0)
    docs = [EvalDoc(f"d{i}", "<test>", np.concatenate([rng.integers(3, 8, 12),
                                                       rng.integers(8, 64, 28)]).astype(np.int64))
            for i in range(4)]
    cu = context_diagnostics(model, docs, 32, 32, progress=False)["context_use"]
    assert cu["targets"] == 4 * 16
    assert cu["gain"] == pytest.approx(0.0, abs=1e-6)
    assert abs(cu["gain_unpaired"]) > 0.1


def test_penalty_stride_checked_for_every_length_before_any_work(docs):
    """W - L = 13 is no multiple of the default stride L/4 = 8: refused before the first length is
    scored (model=None would fail on use), naming the length and what to do."""
    docset = type("D", (), {"docs": docs, "describe": lambda self: {}})()
    with pytest.raises(ValueError, match=r"\[45\].*--penalty-stride"):
        run_ppl(None, docset, [32, 45], stride=8, train_length=32, progress=False)
