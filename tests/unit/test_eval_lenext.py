"""Evaluation on the HF export's model class (lenext_dist.hf): the adapter's q/k/m reproduce the
model's attention, scales go through the modeling helpers, PPL equals the brute-force loop, and
the CLI runs on an export-shaped folder loaded with trust_remote_code."""
import json

import numpy as np
import pytest
import torch

from lenext_dist.attention import eager_causal_attention
from lenext_dist.cli import main
from lenext_dist.eval.adapter import (capture_qk, head_scales, layout, restore_scales,
                                      set_uniform_scale, train_length)
from lenext_dist.eval.entropy import _position_hooks, evaluate_entropy
from lenext_dist.eval.passkey import greedy_generate
from lenext_dist.eval.ppl import evaluate_ppl
from tiny_models import REPO, random_docs, save_tiny_lenext, tiny_lenext

from test_eval_ppl import brute_force  # noqa: E402  (tests/unit is on sys.path under pytest)


@pytest.mark.parametrize("position", ["nope", "rope", "alibi", "kerple_log"])
def test_adapter_on_lenext(position):
    model = tiny_lenext(position, vocab_size=256, train_length=32)
    assert layout(model) == "lenext" and train_length(model) == 32
    ids = torch.randint(0, 256, (2, 20))
    attn = model.model.layers[1].self_attn
    cap, qk = {}, {}
    h1 = attn.register_forward_pre_hook(lambda mod, a: cap.__setitem__("h", a[0]))
    h2 = attn.register_forward_hook(lambda mod, a, out: cap.__setitem__("o", out))
    capture_qk(model, ids, lambda i, q, k, m: qk.__setitem__(i, (q, k, m)))
    h1.remove(), h2.remove()
    q, k, m = qk[1]
    with torch.no_grad():
        v = attn.v_proj(cap["h"]).view(2, 20, -1, 8).transpose(1, 2)
        qs, mod = _position_hooks(attn, 20, q.device)  # what entropy feeds iter_attention_probs
        o = eager_causal_attention(q, k, v, m, q_scale=qs, score_mod=mod)
        o = attn.o_proj(o.transpose(1, 2).reshape(2, 20, -1))
    torch.testing.assert_close(o, cap["o"], rtol=1e-4, atol=1e-5)
    with restore_scales(model):
        set_uniform_scale(model, 1.3)
        assert torch.allclose(head_scales(model), torch.full((2, 4), 1.3))
        assert torch.allclose(attn.head_scale, torch.full((4,), 1.3))
    assert torch.allclose(head_scales(model), torch.ones(2, 4))
    assert model.config.scale_c == 1.0 and model.config.head_scale_source == "uniform"


def test_ppl_and_entropy_on_lenext():
    model = tiny_lenext("rope", vocab_size=512, train_length=32)
    docs = random_docs([150, 97], vocab_size=512)
    for protocol in ("last-stride", "yarn"):
        ref, n = brute_force(model, docs, 32, 8, protocol)
        r = evaluate_ppl(model, docs, 32, stride=8, protocol=protocol, batch_size=3,
                         progress=False)
        assert r["scored_tokens"] == n and r["nll"] == pytest.approx(ref, rel=1e-5)
    e = evaluate_entropy(model, docs, 48, samples=2, chunk_size=7, progress=False)
    assert e["entropy"].shape == (2, 4, 48)
    assert np.all(e["entropy"] <= e["upper_bound"] + 1e-5)
    # greedy decoding through the lenext KV cache equals recomputation
    ids = torch.randint(3, 512, (1, 30))
    new = greedy_generate(model, ids, 4)
    seq = ids
    for _ in range(4):
        with torch.no_grad():
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert new.tolist() == seq[:, 30:].tolist()


def test_entropy_bound_under_a_window_is_ln_of_the_visible_keys():
    model = tiny_lenext("nope", vocab_size=512, train_length=32, attention_options={"window": 8})
    e = evaluate_entropy(model, random_docs([150], vocab_size=512), 40, samples=1, progress=False)
    assert np.allclose(e["upper_bound"], np.log(np.minimum(np.arange(1, 41), 8)))
    assert np.all(e["entropy"] <= e["upper_bound"] + 1e-5)
    assert e["entropy"][..., 20:].mean() > 0.5 * np.log(8)  # random weights: near uniform


def test_cli_on_export_folder(tmp_path):
    mdir = save_tiny_lenext(str(tmp_path / "lx"), position="nope", train_length=32)
    out = tmp_path / "res"
    data = f"{REPO}/data/sample/heldout/code.jsonl.zst"
    assert main(["eval", "ppl", "--model", mdir, "--data", data, "--lengths", "32,64",
                 "--stride", "16", "--budget-tokens", "64", "--scale-c", "1.2",
                 "--out", str(out), "--no-progress"]) == 0
    j = json.loads((out / "ppl_last-stride_c1.2.json").read_text())
    assert j["model"]["attention_layout"] == "lenext" and j["train_length"] == 32
    assert j["model"]["head_scale"]["min"] == pytest.approx(1.2)
    assert "NoPE" in j["model"]["position"] and j["diagnostics"][-1]["penalty_by_s"]
    assert main(["eval", "entropy", "--model", mdir, "--data", data, "--length", "64",
                 "--samples", "1", "--out", str(out), "--no-progress"]) == 0
    assert main(["eval", "passkey", "--model", mdir, "--lengths", "100", "--depths", "2",
                 "--keys", "2", "--max-new-tokens", "3", "--out", str(out),
                 "--no-progress"]) == 0
    assert main(["eval", "scale-sweep", "--model", mdir, "--data", data, "--length", "64",
                 "--c-min", "1.0", "--c-max", "1.2", "--c-step", "0.2", "--samples", "1",
                 "--out", str(out), "--no-progress"]) == 0
    for f in ("entropy_64.json", "passkey.json", "scale_sweep.json", "passkey.png"):
        assert (out / f).exists()


def test_eval_time_options_reach_the_layers_or_are_refused(monkeypatch):
    """--temperature / --window on a custom export go through the export's own set_position; an
    export whose shipped code predates an option would ignore it, so it is refused by name."""
    import lenext_dist.eval.adapter as adapter
    from lenext_dist.eval.adapter import set_variant

    model = tiny_lenext("nope", vocab_size=256, train_length=32)
    set_variant(model, temperature={"kind": "llama4", "floor_scale": 8.0}, window=16)
    got = [layer.self_attn.position for layer in model.model.layers]
    assert [(v.temperature.kind, v.temperature.floor_scale, v.window) for v in got] == \
        [("llama4", 8.0, 16)] * 2

    class OldNoPE(torch.nn.Module):  # a variant of an export made before temperature schedules
        def __init__(self, window):
            super().__init__()
            self.name, self.window = "nope", window

    def old_set_position(m, rope=None, **options):
        for layer in m.model.layers:
            layer.self_attn.position = OldNoPE(options.get("window"))

    monkeypatch.setattr(adapter, "_own", lambda m, name: old_set_position)
    set_variant(model, window=16)  # known to that code: fine
    with pytest.raises(ValueError, match="modeling code predates temperature: re-export"):
        set_variant(model, temperature={"kind": "log_fit", "a": 0.3}, window=16)


def test_train_length_reaches_the_temperature_schedule_and_a_schedule_on_no_layer_is_refused(tmp_path):
    """issue 40: `--train-length` set L for the plots only, while the schedule of i / L kept the
    export's; and a --temperature on the NoPE layers of a model with none scaled nothing while
    the result files were named after it."""
    from lenext_dist.eval.jobs import EvalError, PplJob

    data = [f"{REPO}/data/sample/heldout/code.jsonl.zst"]
    x = torch.randint(3, 512, (1, 64), generator=torch.Generator().manual_seed(0))

    def logits(mdir, **kw):
        job = PplJob(model=mdir, data=data, out=str(tmp_path / "res"), lengths=[64],
                     temperature="log_fit:a=0.5", **kw)
        model, L, _ = job._setup()
        with torch.no_grad():
            return model(input_ids=x, use_cache=False).logits, L

    long = save_tiny_lenext(str(tmp_path / "l32"), position="nope", vocab_size=512, train_length=32)
    short = save_tiny_lenext(str(tmp_path / "l8"), position="nope", vocab_size=512, train_length=8)
    a, la = logits(long, train_length=8)
    b, lb = logits(short)
    c, _ = logits(long)
    assert la == lb == 8 and torch.allclose(a, b, atol=1e-5) and not torch.allclose(a, c, atol=1e-3)
    rope = save_tiny_lenext(str(tmp_path / "rope"), position="rope", vocab_size=512, train_length=32)
    with pytest.raises(EvalError, match=r"--temperature log_fit: on nope layers, but this model has "
                                        r"no NoPE layer \(rope\)"):
        logits(rope)
