"""Temperature schedules (lenext_dist/attention/temperature.py) and chunked attention (Llama 4's
iRoPE), each against a plain-torch reference written from its source: the multipliers t_i, the
whole attention function m_h t_i / sqrt(d) q.k under a causal (or chunked) mask in float64, which
layers a schedule reaches, and the one-line refusals of bad configs."""
import math
from types import SimpleNamespace as NS

import pytest
import torch

from lenext_dist.attention import MaskSpec, attend, build_position
from lenext_dist.attention.layout import layer_variants
from lenext_dist.attention.temperature import TEMPERATURES, applies, multiplier
from lenext_dist.config import ConfigError, load_config

L, D, H, G, B = 8, 16, 4, 2, 2
ROPE = NS(base=10000.0, scaling="none", factor=1.0)


def reference_t(kind: str, n: int, **p) -> torch.Tensor:
    """t_i of query positions 0..n-1, float64, from each schedule's source."""
    i = torch.arange(1, n + 1, dtype=torch.float64)
    if kind == "uniform":
        return torch.full_like(i, p["c"])
    if kind == "log_fit":  # the paper: lambda(s) = (1 + a ln s) / sqrt(d), per position s = i / L
        return 1 + p["a"] * torch.log(torch.clamp(i / L, min=1))
    if kind == "llama4":  # transformers modeling_llama4.Llama4TextAttention.forward, verbatim
        positions = torch.arange(n)
        return (torch.log1p(torch.floor((positions.float() + 1.0) / p["floor_scale"]))
                * p["attn_scale"] + 1.0).double()
    if kind == "qwen_logn":  # Qwen-7B modeling_qwen.py: logn_list
        return torch.tensor([math.log(j, L) if j > L else 1 for j in range(1, n + 1)],
                            dtype=torch.float64)
    if kind == "ssmax":  # Scalable-Softmax: s log(n) z, n = keys seen; s = m_h / ln L
        return torch.log(i) / math.log(L)
    raise AssertionError(kind)


CASES = {"uniform": dict(c=1.4), "log_fit": dict(a=0.3), "qwen_logn": {}, "ssmax": {},
         "llama4": dict(floor_scale=4.0, attn_scale=0.5)}


def test_every_schedule_is_tested():
    assert sorted(TEMPERATURES) == sorted([*CASES, "none"])


@pytest.mark.parametrize("kind", sorted(CASES))
def test_multiplier_against_its_source(kind):
    section = {"kind": kind, **CASES[kind]}
    got = multiplier(section, torch.arange(40), L).double()
    ref = reference_t(kind, 40, **CASES[kind])
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
    if kind in ("log_fit", "qwen_logn"):  # the paper's and Qwen's leave the first L tokens alone
        assert torch.all(got[:L] == 1) and got[-1] > 1
    # per-document positions [b, s]: each row by its own positions
    rows = torch.stack([torch.arange(40), torch.arange(40).remainder(13)])
    torch.testing.assert_close(multiplier(section, rows, L).double()[1],
                               ref[torch.arange(40).remainder(13)], atol=1e-6, rtol=1e-6)
    assert multiplier({"kind": "none"}, torch.arange(4), L) is None


def plain(q, k, v, m, t=None, rotate=False, chunk=None):
    """softmax(m_h t_i / sqrt(d) q_i.k_j, causal [and chunked: j // C == i // C]) v in float64."""
    s = q.shape[2]
    pos = torch.arange(s)
    r = q.shape[1] // k.shape[1]
    qq, kk, vv = q.double(), k.repeat_interleave(r, 1).double(), v.repeat_interleave(r, 1).double()
    if rotate:  # rotate-half RoPE, base 10000
        inv = 1.0 / 10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = pos[:, None].double() * inv[None]
        c, sn = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)

        def rot(x):
            x1, x2 = x.chunk(2, -1)
            return x * c + torch.cat((-x2, x1), -1) * sn
        qq, kk = rot(qq), rot(kk)
    scale = m.double().view(1, -1, 1, 1) / math.sqrt(D)
    if t is not None:
        scale = scale * t.view(1, 1, -1, 1)
    logits = (qq @ kk.transpose(-1, -2)) * scale
    vis = pos[None, :] <= pos[:, None]
    if chunk is not None:
        vis &= (pos[None, :] // chunk) == (pos[:, None] // chunk)
    return torch.softmax(logits.masked_fill(~vis, float("-inf")), -1) @ vv


def qkv(s, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, n, s, D, generator=gen) for n in (H, G, G)]


@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("eager", [False, True])
def test_attention_with_a_schedule_against_plain_torch(kind, eager):
    s = 40
    q, k, v = qkv(s, seed=1)
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    var = build_position(NS(position="nope", temperature={"kind": kind, **CASES[kind]}),
                         head_dim=D, train_length=L)
    out = attend(q, k, v, m, var, eager=eager).double()
    ref = plain(q, k, v, m, t=reference_t(kind, s, **CASES[kind]))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert (out - plain(q, k, v, m)).abs().max() > 1e-3  # the schedule changed something


@pytest.mark.parametrize("impl", ["chunked", "sdpa_mask", "eager"])
def test_chunked_attention_against_plain_torch(impl):
    """Llama 4's chunked RoPE layers: own chunk only (transformers masking_utils.chunked_overlay),
    on every kernel path; with a KV cache the new queries see their chunk's cached keys."""
    s, C = 23, 5
    q, k, v = qkv(s, seed=2)
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    var = build_position(NS(position="rope", rope=ROPE, chunked=C, impl=impl, chunk_size=4),
                         head_dim=D, train_length=L)
    assert var.mask == MaskSpec(chunked=C)
    ref = plain(q, k, v, m, rotate=True, chunk=C)
    torch.testing.assert_close(attend(q, k, v, m, var).double(), ref, atol=1e-5, rtol=1e-5)
    # decoding the last 3 tokens with the first 20 keys cached (rotated before caching)
    from lenext_dist.attention.rope import RoPE

    assert isinstance(var, RoPE)
    qr, kr = var.rotate(q, k, 0)
    tail = attend(q[:, :, -3:], kr, v, m, var, positions=s - 3, keys_rotated=True).double()
    torch.testing.assert_close(tail, ref[:, :, -3:], atol=1e-5, rtol=1e-5)


def test_chunk_mask_equals_transformers():
    from transformers.masking_utils import chunked_overlay

    spec, C = MaskSpec(chunked=6), 6
    left = torch.zeros(1, dtype=torch.long)
    ours = spec.visible(torch.arange(30), torch.arange(30))
    theirs = torch.tensor([[bool(chunked_overlay(C, left)(0, 0, i, j)) and j <= i
                            for j in range(30)] for i in range(30)])
    assert torch.equal(ours, theirs)
    assert spec.visible_counts(30).tolist() == ours.sum(-1).tolist()
    assert [spec.first_key(i) for i in range(30)] == [i // C * C for i in range(30)]


def test_schedules_reach_the_layers_they_name():
    """Default `layers: nope`: a hybrid's NoPE layers only (as Llama 4 scales its NoPE layers);
    `all`: every layer."""
    for layers, expect in (("nope", [False, True, False, True]), ("all", [True] * 4)):
        t = {"kind": "llama4", "floor_scale": 4, "attn_scale": 0.5, "layers": layers}
        cfg = NS(position="rope", rope=ROPE, chunked=4, temperature=t,
                 layout=NS(kind="irope", every=2))
        got = layer_variants(cfg, num_layers=4, head_dim=D, train_length=L)
        assert [v.temperature is not None for v in got] == expect
        assert [v.chunked for v in got] == [4, None, 4, None]
    assert applies({"kind": "uniform", "c": 2.0}, "nope") and not applies({"kind": "uniform",
                                                                          "c": 2.0}, "rope")
    assert not applies(None, "nope") and not applies({"kind": "none"}, "nope")


@pytest.mark.parametrize("overrides,match", [
    (["attention.temperature.kind=warm"], "unknown attention.temperature.kind 'warm'"),
    (["attention.temperature.kind=log_fit"], "'log_fit' needs attention.temperature.a"),
    (["attention.temperature.kind=uniform", "attention.temperature.c=0"], "c must be > 0"),
    (["attention.temperature.kind=llama4", "attention.temperature.a=0.3"],
     "temperature.a is not read by kind 'llama4'"),
    (["attention.temperature.kind=ssmax"], "ssmax learns one scale per head: it needs "
                                           "attention.head_scale.enabled"),
    (["attention.temperature.kind=none", "attention.temperature.layers=some"], "layers"),
    (["attention.chunked=0"], "attention.chunked: must be >= 1"),
    # issue 40: a schedule that would do nothing, or NaN everywhere ("training diverged")
    (["attention.position=rope", "attention.temperature.kind=uniform", "attention.temperature.c=1.2"],
     "attention.temperature.layers: 'nope', but no layer is NoPE \\(rope x4\\)"),
    (["attention.temperature.kind=uniform", "attention.temperature.c=.nan"], "c must be a finite number"),
    (["attention.temperature.kind=llama4", "attention.temperature.attn_scale=.inf"],
     "attn_scale must be a finite number"),
    (["attention.temperature.kind=log_fit", "attention.temperature.a=-.inf"], "a must be a finite"),
    (["attention.temperature.kind=qwen_logn", "model.seq_length=1"],
     "model.train_length: 1: temperature 'qwen_logn' divides by ln L"),
])
def test_config_refusals_are_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, ["model.num_layers=4", *overrides])
    assert "\n" not in str(e.value)


def test_old_log_scale_a_key_reads_as_the_log_fit(tmp_path):
    """A checkpoint's config.yaml from before the registry: attention.log_scale_a A scaled every
    layer by 1 + A ln max(1, i/L); it loads as temperature log_fit on all layers."""
    old = tmp_path / "config.yaml"
    old.write_text("attention:\n  position: rope\n  log_scale_a: 0.3\n")
    t = load_config(old).attention.temperature
    assert (t.kind, t.a, t.layers) == ("log_fit", 0.3, "all")
    old.write_text("attention:\n  log_scale_a: null\n")
    assert load_config(old).attention.temperature.kind == "none"


def test_the_extending_guides_schedule_runs_on_both_paths(monkeypatch):
    """docs/extending.md's example schedule, registered as the guide says, runs on a config's
    section and on the plain dict `lenext eval --temperature linear:a=0.2` makes."""
    from pathlib import Path

    from lenext_dist.attention import temperature as T
    from lenext_dist.eval.options import temperature_section

    guide = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
    code = guide.read_text().split("# lenext_dist/attention/temperature.py\n", 1)[1].split("```", 1)[0]
    for name in ("TEMPERATURES", "PARAMS", "REQUIRED"):
        monkeypatch.setattr(T, name, dict(getattr(T, name)))
    monkeypatch.setattr(T, "NEEDS_LENGTH", T.NEEDS_LENGTH)
    monkeypatch.setattr(T, "_linear", None, raising=False)  # undone: the module keeps no trace
    exec(code, vars(T))
    want = 1 + 0.2 * torch.clamp(torch.arange(1, 9) / 4 - 1, min=0)  # i = position + 1, L = 4
    for section in (temperature_section("linear:a=0.2"), NS(kind="linear", a=0.2)):
        torch.testing.assert_close(T.multiplier(section, torch.arange(8), 4), want)
