"""Per-layer attention layouts (attention.layout, lenext_dist/attention/layout.py): the registry's
presets, the config's one-line refusals, each layer's math against plain torch (a NoPE layer is
not rotated, a RoPE layer is, with its PI scaling; local_global's local layers are windowed, its
global ones not), and the megatron model with a layout: each layer holds its variant, and the HF
custom model built from the same config (the export's class) gives the same logits, with packed
documents, a KV cache and eval-time RoPE scaling too; the entropy bound under per-layer windows;
the dry run reports the layout."""
import math
import os
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from lenext_dist.attention import LAYOUTS, NoPE, RoPE, attend, layer_names, layer_variants
from lenext_dist.attention.layout import layer_specs
from lenext_dist.config import (AttentionConfig, ConfigError, LayoutConfig, ModelConfig, RopeConfig,
                                RunConfig, TemperatureConfig, load_config)
from tiny_models import megatron_and_hf

os.environ.setdefault("DS_ACCELERATOR", "cpu")

B, H, G, D = 2, 4, 2, 8
L = 8


def names(kind, n=4, position="rope", **lay):
    return layer_names(NS(position=position, layout=NS(kind=kind, **lay)), n)


# ---- the registry ------------------------------------------------------------------------------

def test_presets():
    assert sorted(LAYOUTS) == ["explicit", "irope", "local_global", "nope_every", "smollm3", "uniform"]
    assert names("uniform") == ["rope"] * 4
    assert names("nope_every", every=2) == ["rope", "nope", "rope", "nope"]  # layers 2, 4 (1-based)
    assert names("nope_every", n=8, every=3) == ["rope", "rope", "nope"] * 2 + ["rope"] * 2
    # SmolLM3-3B: transformers' SmolLM3Config default no_rope_layers (interval 4), 1 = RoPE
    from transformers import SmolLM3Config

    smol = SmolLM3Config(num_hidden_layers=36).no_rope_layers
    assert names("smollm3", n=36) == ["rope" if x else "nope" for x in smol]
    # `every` is its no_rope_layer_interval (it was read as 4 whatever it said)
    smol = SmolLM3Config(num_hidden_layers=6, no_rope_layer_interval=2).no_rope_layers
    assert names("smollm3", n=6, every=2) == ["rope" if x else "nope" for x in smol]
    assert names("explicit", layers=["rope", "alibi", "nope", "rope"]) == \
        ["rope", "alibi", "nope", "rope"]
    # an export made before layouts: no layout section at all = every layer `position`
    assert layer_names(NS(position="xpos"), 3) == ["xpos"] * 3
    # Cohere Command R7B: three local (windowed) RoPE layers, then a global NoPE one
    cfg = NS(position="rope", window=16, layout=NS(kind="local_global"))
    assert layer_specs(cfg, 8) == ([("rope", 16, None)] * 3 + [("nope", None, None)]) * 2
    # Llama 4's iRoPE: three chunked RoPE layers, then a global NoPE one (transformers'
    # Llama4TextConfig: no_rope_layer_interval 4, layer_types chunked_attention on RoPE layers)
    from transformers import Llama4TextConfig

    llama4 = Llama4TextConfig(num_hidden_layers=8, attention_chunk_size=32)
    cfg = NS(position="rope", chunked=32, layout=NS(kind="irope"))
    assert layer_specs(cfg, 8) == [("rope" if r else "nope", None, 32 if t == "chunked_attention"
                                    else None) for r, t in zip(llama4.no_rope_layers,
                                                               llama4.layer_types)]
    # explicit per-layer spans: the global_layers attend to everything, the others take the window
    cfg = NS(position="rope", window=16, layout=NS(kind="explicit", layers=["rope", "nope"] * 2,
                                                   global_layers=[2, 3]))
    assert layer_specs(cfg, 4) == [("rope", 16, None), ("nope", None, None), ("rope", None, None),
                                   ("nope", 16, None)]
    # every other layout: the window (if any) on every layer
    assert layer_specs(NS(position="rope", window=16, layout=NS(kind="nope_every", every=2)), 2) \
        == [("rope", 16, None), ("nope", 16, None)]


@pytest.mark.parametrize("overrides,match", [
    (["attention.layout.kind=sometimes"], "attention.layout.kind: unknown layout 'sometimes'"),
    (["attention.layout.kind=nope_every", "attention.layout.every=0"], "every: must be >= 1"),
    (["attention.layout.kind=explicit"], "needs one position name per layer"),
    (["attention.layout.kind=explicit", "attention.layout.layers=[rope,nope]"],
     "2 entries for 4 layers"),
    (["attention.layout.kind=explicit", "attention.layout.layers=[rope,nope,alibo,rope]"],
     "unknown variants \\['alibo'\\]"),
    (["attention.layout.layers=[rope,nope,rope,nope]"], "read by kind 'explicit' only"),
    (["attention.layout.kind=smollm3"], "needs attention.position 'rope'"),
    (["attention.position=kerple_log", "attention.layout.kind=nope_every"],
     "learned variants \\['kerple_log'\\] in a non-uniform layout"),
    (["attention.layout.kind=explicit", "attention.layout.layers=[nope,alibi,nope,alibi]",
      "attention.rope.scaling=yarn", "attention.rope.factor=2"], "no layer .* has one"),
    (["attention.position=rope", "attention.layout.kind=local_global"],
     "'local_global' needs attention.window"),
    (["attention.position=rope", "attention.layout.kind=irope"], "'irope' needs attention.chunked"),
    (["attention.layout.global_layers=[1]"], "global_layers: is read by kind 'explicit' only"),
    (["attention.layout.kind=explicit", "attention.layout.layers=[rope,nope,rope,nope]",
      "attention.layout.global_layers=[5]"], "global_layers \\[5\\] are not layers 1..4"),
    (["attention.layout.kind=irope", "attention.chunked=8"], "needs attention.position 'rope'"),
    # issue 40: a period past the last layer makes no layer NoPE: the layout would do nothing
    (["attention.position=rope", "attention.layout.kind=nope_every", "attention.layout.every=5"],
     "attention.layout: 'nope_every' \\(every 5\\) over model.num_layers 4 leaves every layer rope"),
    (["attention.position=rope", "attention.layout.kind=irope", "attention.chunked=8",
      "attention.layout.every=8"], "'irope' \\(every 8\\) .* leaves every layer rope"),
])
def test_config_refusals_are_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, ["model.num_layers=4", *overrides])
    assert "\n" not in str(e.value)


def test_rope_scaling_needs_one_rope_layer_not_all():
    cfg = load_config(None, ["model.num_layers=4", "attention.position=rope",
                             "attention.layout.kind=nope_every", "attention.layout.every=2",
                             "attention.rope.scaling=yarn", "attention.rope.factor=4"])
    assert cfg.layer_positions == ["rope", "nope", "rope", "nope"]
    with pytest.raises(ConfigError, match="rope.scaling"):  # the uniform check is unchanged
        AttentionConfig(position="nope", rope=RopeConfig(scaling="yarn", factor=2.0))


# ---- each layer's math against plain torch ---------------------------------------------------------

def plain_rope(x, pos, base=10000.0, factor=1.0):
    """Rotary embedding written out: pair (x_k, x_{k+d/2}) turned by angle p theta_k / factor."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / factor
    ang = pos.double()[:, None] * theta  # [s, d/2]
    c, s = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2].double(), x[..., d // 2:].double()
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


def plain_attention(q, k, v, m, rotate, factor=1.0, window=None):
    """softmax(m_h / sqrt(d) q.k + causal (and window) mask) v in float64, GQA by repetition."""
    s = q.shape[2]
    pos = torch.arange(s)
    r = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(r, 1).double(), v.repeat_interleave(r, 1).double()
    qq = q.double()
    if rotate:
        qq, kk = plain_rope(qq, pos, factor=factor), plain_rope(kk, pos, factor=factor)
    logits = qq @ kk.transpose(-1, -2) * (m.double() / math.sqrt(D)).view(1, -1, 1, 1)
    visible = pos[None, :] <= pos[:, None]
    if window is not None:
        visible &= pos[:, None] - pos[None, :] < window
    logits = logits.masked_fill(~visible, float("-inf"))
    return torch.softmax(logits, -1) @ vv


@pytest.mark.parametrize("scaling,factor,window", [("none", 1.0, None), ("pi", 4.0, None),
                                                   ("none", 1.0, 5)])
def test_each_layer_against_plain_torch(scaling, factor, window):
    """nope_every k=2 over RoPE: layers 0, 2 rotate (with the PI scaling), layers 1, 3 do not;
    both kinds share the window and the per-head scale."""
    cfg = NS(position="rope", rope=NS(base=10000.0, scaling=scaling, factor=factor),
             window=window, layout=NS(kind="nope_every", every=2))
    variants = layer_variants(cfg, num_layers=4, head_dim=D, train_length=L, num_heads=H)
    assert [type(v) for v in variants] == [RoPE, NoPE, RoPE, NoPE]
    assert variants[0] is variants[2] and variants[1] is variants[3]  # one object per name
    assert variants[0].scaling == scaling and variants[1].window == variants[0].window == window
    gen = torch.Generator().manual_seed(3)
    s = 24
    q, k, v = (torch.randn(B, n, s, D, generator=gen) for n in (H, G, G))
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    for i, var in enumerate(variants):
        out = attend(q, k, v, m, var).double()
        rope = i % 2 == 0
        ref = plain_attention(q, k, v, m, rotate=rope, factor=factor, window=window)
        other = plain_attention(q, k, v, m, rotate=not rope, factor=factor, window=window)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert (out - other).abs().max() > 1e-2, f"layer {i}: rotation made no difference"


def test_local_global_layers_against_plain_torch():
    """local_global k=2: RoPE under the window on layers 0, 2; NoPE over every earlier token on
    layers 1, 3 (Cohere Command R7B's pattern with k = 4)."""
    cfg = NS(position="rope", rope=NS(base=10000.0, scaling="none", factor=1.0), window=5,
             layout=NS(kind="local_global", every=2))
    variants = layer_variants(cfg, num_layers=4, head_dim=D, train_length=L, num_heads=H)
    assert [(v.name, v.window) for v in variants] == [("rope", 5), ("nope", None)] * 2
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, n, 24, D, generator=gen) for n in (H, G, G))
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    torch.testing.assert_close(attend(q, k, v, m, variants[0]).double(),
                               plain_attention(q, k, v, m, rotate=True, window=5),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attend(q, k, v, m, variants[1]).double(),
                               plain_attention(q, k, v, m, rotate=False), atol=1e-5, rtol=1e-5)


def test_nope_layers_of_a_yarn_model_are_not_scaled():
    """rope.scaling applies to the RoPE layers; a NoPE layer's variant is plain NoPE."""
    cfg = NS(position="rope", rope=NS(base=10000.0, scaling="yarn", factor=4.0),
             layout=NS(kind="explicit", layers=["nope", "rope"]))
    nope, rope = layer_variants(cfg, num_layers=2, head_dim=D, train_length=L)
    assert type(nope) is NoPE and rope.scaling == "yarn" and rope.mscale > 1
    for layout in (NS(kind="uniform"), NS(kind="explicit", layers=["nope", "alibi"])):
        with pytest.raises(ValueError, match="rope.scaling.*'yarn' scales a RoPE rotation"):
            layer_variants(NS(position="nope", rope=cfg.rope, layout=layout), num_layers=2,
                           head_dim=D, train_length=L, num_heads=H)


# ---- the megatron model and the HF model of the export ---------------------------------------------

VOCAB, SEQ, EOS = 128, 24, 2


def layout_cfg(**attn):
    attn = {"position": "rope", "scale_c": 1.3,
            "layout": LayoutConfig(kind="nope_every", every=2), **attn}
    return RunConfig(model=ModelConfig(num_layers=4, hidden_size=64, num_attention_heads=4,
                                       num_query_groups=2, ffn_hidden_size=96, vocab_size=VOCAB,
                                       seq_length=SEQ),
                     attention=AttentionConfig(**attn))


PAIR = dict(jitter=0.2, gain=4.0, tok={"eos": EOS})
"""megatron_and_hf's perturbation here (position-dependent attention: larger projections)."""


LLAMA4_T = TemperatureConfig(kind="llama4", floor_scale=4, attn_scale=0.5)


@pytest.mark.parametrize("kind,extra,windows,chunks", [
    ("nope_every", dict(window=10), [10] * 4, [None] * 4),
    ("local_global", dict(window=10), [10, None, 10, None], [None] * 4),
    # Llama 4's iRoPE with its temperature on the NoPE layers (steps at 4, 8, 12, ... tokens)
    ("irope", dict(chunked=5, temperature=LLAMA4_T), [None] * 4, [5, None, 5, None]),
])
def test_megatron_and_hf_run_the_layout(megatron_1rank, kind, extra, windows, chunks):
    from lenext_dist.attention import document_ids

    cfg = layout_cfg(layout=LayoutConfig(kind=kind, every=2), **extra)
    meg, hf, *_ = megatron_and_hf(cfg, megatron_1rank, **PAIR)
    megs = [layer.self_attention.core_attention.position for layer in meg.decoder.layers]
    hfs = [layer.self_attn.position for layer in hf.model.layers]
    assert [v.name for v in megs] == [v.name for v in hfs] == ["rope", "nope", "rope", "nope"]
    assert [v.window for v in megs] == [v.window for v in hfs] == windows == cfg.layer_windows
    assert [v.chunked for v in megs] == [v.chunked for v in hfs] == chunks == cfg.layer_chunks
    tuned = [v.temperature is not None for v in hfs]
    assert [v.temperature is not None for v in megs] == tuned == [False, "temperature" in extra] * 2
    assert hf.config.attention_options["layout"] == {"kind": kind, "every": 2, "layers": [],
                                                     "global_layers": []}
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(3, VOCAB, (2, SEQ), generator=gen)
    pos = torch.arange(SEQ).expand_as(x)
    with torch.no_grad():
        a = meg(x, pos, attention_mask=None)
        b = hf(input_ids=x, use_cache=False).logits
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        # packed documents: each document as alone, on both sides
        x[:, [6, 15]] = EOS
        ids = document_ids(x, eos_id=EOS)
        packed = meg(x, pos, attention_mask=ids)
        torch.testing.assert_close(hf(input_ids=x, use_cache=False, document_ids=ids).logits,
                                   packed, atol=1e-5, rtol=1e-5)
        seg = x[:1, 7:16]
        torch.testing.assert_close(packed[:1, 7:16], meg(seg, torch.arange(9)[None], None),
                                   atol=1e-5, rtol=1e-5)
        # KV-cache decoding (each layer rotates its cached keys, or not) = the full forward
        pre = hf(input_ids=x[:, :-3], use_cache=True)
        step = hf(input_ids=x[:, -3:], past_key_values=pre.past_key_values, use_cache=True)
        torch.testing.assert_close(step.logits, hf(input_ids=x, use_cache=False).logits[:, -3:],
                                   atol=1e-5, rtol=1e-5)
        # the layout is the function: the same weights with every layer RoPE differ
        # (without the temperature: on no NoPE layer it would be refused as doing nothing)
        same = {k: v for k, v in extra.items() if k != "temperature"}
        uniform = megatron_and_hf(layout_cfg(layout=LayoutConfig(), **same), megatron_1rank, **PAIR).meg
        uniform.load_state_dict(meg.state_dict(), strict=False)
        assert not torch.allclose(uniform(x, pos, None), meg(x, pos, None), atol=1e-3)


def test_eval_time_rope_scaling_reaches_the_rope_layers_only(megatron_1rank):
    from lenext_dist.hf.modeling_lenext import set_position

    hf = megatron_and_hf(layout_cfg(), megatron_1rank, **PAIR).hf
    x = torch.randint(3, VOCAB, (1, 4 * SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = hf(input_ids=x, use_cache=False).logits
        set_position(hf, rope={"scaling": "yarn", "factor": 4.0})
        after = hf(input_ids=x, use_cache=False).logits
    got = [layer.self_attn.position for layer in hf.model.layers]
    assert [v.name for v in got] == ["rope", "nope", "rope", "nope"]
    assert got[0].scaling == "yarn" and got[0].factor == 4.0 and type(got[1]) is NoPE
    assert not torch.allclose(before, after)
    with pytest.raises(ValueError, match="2 entries for 4 layers"):  # config left unchanged
        set_position(hf, layout={"kind": "explicit", "layers": ["rope", "nope"]})
    assert hf.config.attention_options["layout"]["kind"] == "nope_every"


def test_entropy_bound_under_local_global_windows():
    """Per-layer windows: the bound is the most keys any layer sees (the global layers': i + 1),
    so it holds for every layer; the windowed layers' entropy stays under ln(window)."""
    from lenext_dist.eval.entropy import evaluate_entropy
    from tiny_models import random_docs, tiny_lenext

    model = tiny_lenext("rope", vocab_size=512, train_length=32, attention_options={
        "window": 8, "layout": {"kind": "local_global", "every": 2}})
    assert [a.self_attn.position.window for a in model.model.layers] == [8, None]
    e = evaluate_entropy(model, random_docs([150], vocab_size=512), 40, samples=1, progress=False)
    assert np.allclose(e["upper_bound"], np.log(np.arange(1, 41)))
    assert np.all(e["entropy"] <= e["upper_bound"] + 1e-5)
    assert np.all(e["entropy"][0] <= np.log(8) + 1e-5)  # the local layer
    assert e["entropy"][1][..., 30:].mean() > np.log(8)  # the global one reads further


def test_dry_run_reports_the_layout(megatron_1rank, capsys):
    from lenext_dist.train.dryrun import dry_run

    cfg = load_config(None, ["model.num_layers=8", "attention.position=rope",
                             "attention.layout.kind=smollm3"])
    out = dry_run(cfg, world=1)
    text = capsys.readouterr().out
    assert out["layers"] == (["rope"] * 3 + ["nope"]) * 2
    assert "layout smollm3: layers rope x3, nope, rope x3, nope" in text
    uniform = dry_run(load_config(None, ["model.num_layers=8", "attention.position=rope"]), world=1)
    assert uniform["counts"] == out["counts"]  # NoPE layers hold nothing more or less
    assert uniform["flops_per_token"] == out["flops_per_token"]
    dry_run(load_config(None, ["model.num_layers=4", "attention.position=rope", "attention.window=64",
                               "attention.layout.kind=local_global"]), world=1)
    assert "layout local_global: layers rope + window 64 x3, nope" in capsys.readouterr().out
