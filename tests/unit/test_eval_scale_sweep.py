"""Scale sweep: the fit recovers a known a; the sweep itself on a tiny model."""
import json
import math

import numpy as np
import pytest

from lenext_dist.eval.scale_sweep import (analyze, best_c_for_length, fit_log_scale, make_grid,
                                          position_bins, run_scale_sweep)
from lenext_dist.eval.data import DocSet
from tiny_models import random_docs, tiny_llama


def test_fit_exact():
    s = np.array([1.2, 1.5, 2, 3, 4, 8])
    f = fit_log_scale(s, 1 + 0.3973 * np.log(s))
    assert f["a"] == pytest.approx(0.3973) and f["r2"] == pytest.approx(1.0)


def test_grid():
    g = make_grid(0.8, 2.0, 0.01)
    assert len(g) == 121 and g[0] == 0.8 and g[-1] == 2.0 and g[20] == 1.0


@pytest.mark.parametrize("a_true", [0.301, 0.3973])
def test_sweep_analysis_recovers_a(a_true):
    """Synthetic per-position loss with its minimum at c*(s) = 1 + a ln s (+ noise)."""
    L, N = 64, 512
    grid = np.asarray(make_grid(0.8, 2.0, 0.01))
    s = (np.arange(N) + 1) / L
    c_star = np.where(s > 1, 1 + a_true * np.log(np.maximum(s, 1)), 1.0)
    rng = np.random.default_rng(0)
    loss = 3 + 2 * (grid[:, None] - c_star[None, :]) ** 2 + rng.normal(0, 1e-3, (len(grid), N))
    res = analyze(loss, grid, L)
    assert res["fit"]["a"] == pytest.approx(a_true, abs=0.01)
    assert res["fit"]["r2"] > 0.98
    assert all(b["best_c"] == pytest.approx(1.0, abs=0.011) for b in res["bins"] if b["s"] < 1)
    res["length"], res["train_length"] = N, L
    assert best_c_for_length(res, 4 * L) == pytest.approx(1 + res["fit"]["a"] * math.log(4))
    assert best_c_for_length(res, L) == 1.0


def test_bins_cover_positions():
    e = position_bins(1024, 128)
    assert e[0] == 0 and e[-1] == 1024 and 128 in e and np.all(np.diff(e) > 0)


def test_run_on_tiny_model(tmp_path):
    model = tiny_llama(vocab_size=512, train_length=16)
    docs = random_docs([200], vocab_size=512)
    res, loss = run_scale_sweep(model, DocSet(docs, "<none>"), 64, [0.5, 1.0, 1.5], 16,
                                samples=2, progress=False)
    assert loss.shape == (3, 64) and res["fit"]["n_points"] > 0 and res["windows"] == 2
    # brute force: row i is the per-position NLL of the first 2 full windows (doc[0:65] and
    # doc[64:129]) with every head's softmax scale set by hand to c_i / sqrt(d)
    import torch

    toks = torch.as_tensor(docs[0].tokens)
    for i, c in enumerate([0.5, 1.0, 1.5]):
        for layer in model.model.layers:
            layer.self_attn.scaling = c * 8 ** -0.5
        nll = []
        for a in (0, 64):
            with torch.no_grad():
                logits = model(input_ids=toks[None, a:a + 64]).logits[0].double()
            nll.append(torch.nn.functional.cross_entropy(logits, toks[a + 1:a + 65], reduction="none"))
        np.testing.assert_allclose(loss[i], torch.stack(nll).mean(0).numpy(), rtol=1e-4, atol=1e-5)
    for layer in model.model.layers:
        layer.self_attn.scaling = 8 ** -0.5
    assert np.ptp(loss.mean(1)) > 1e-3  # the scales change the losses
    assert res["best_c_mean"] == [0.5, 1.0, 1.5][int(np.argmin(loss.mean(1)))]
    # scales are restored after the sweep
    assert all(abs(layer.self_attn.scaling - 8 ** -0.5) < 1e-12 for layer in model.model.layers)
    p = tmp_path / "scale_sweep.json"
    p.write_text(json.dumps(res))
    assert best_c_for_length(str(tmp_path), 64) == pytest.approx(
        1 + res["fit"]["a"] * math.log(4))
    with pytest.raises(ValueError):
        best_c_for_length(res, 128, method="mean")
