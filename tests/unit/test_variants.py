"""Attention variants of project issue 7 (ALiBi, KERPLE log/power, Sandwich, XPOS, sliding window,
blockwise causal, log-length scale) against direct formulas on explicit [h, s, s] score matrices,
causality, every kernel (chunked SDPA, full-mask SDPA, eager; FlexAttention once) against the
reference, and the megatron model with each variant (1-rank gloo)."""
import math
import os
from types import SimpleNamespace as NS

import pytest
import torch

from lenext_dist.attention import (POSITIONS, ALiBi, KerpleLog, KerplePower, MaskSpec, NoPE,
                                   Sandwich, XPOS, alibi_slopes, attend, build_position,
                                   iter_attention_probs)
from lenext_dist.attention.paths import choose_impl
from lenext_dist.config import (AttentionConfig, ConfigError, KerpleConfig, SandwichConfig, TemperatureConfig,
                                XposConfig, load_config)

os.environ.setdefault("DS_ACCELERATOR", "cpu")

B, H, G, D = 2, 4, 2, 8
L = 8  # "training length" of the variants under test (XPOS block, log-scale L)
IMPLS = ("chunked", "sdpa_mask", "eager")


def rand_qkv(s, seed=0, h=H, g=G):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, n, s, D, generator=gen) for n in (h, g, g))


def make(name, window=None, log_scale_a=None, chunk_size=5, **sub):
    temperature = (None if log_scale_a is None else
                   {"kind": "log_fit", "a": log_scale_a, "layers": "all"})
    cfg = NS(position=name, rope=NS(base=10000.0, scaling="none", factor=1.0), window=window,
             temperature=temperature, chunk_size=chunk_size, **sub)
    torch.manual_seed(7)
    return build_position(cfg, head_dim=D, train_length=L, num_heads=H)


# ---- explicit formulas ------------------------------------------------------------------------

def rotate_pairs(x, pos, scale=None, base=10000.0):
    """Complex form of RoPE (pair k = dims (k, k + d/2)), optionally times scale[k]^pos, float64."""
    d = x.shape[-1]
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())  # [..., s, d/2]
    theta = base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    p = pos.double()[:, None]
    rot = torch.polar(torch.ones_like(p * theta), p * theta)
    if scale is not None:
        rot = rot * scale.double()[None, :] ** p
    return z * rot


def explicit_logits(name, var, q, k, m):
    """[b, h, s, s] float64 logits before masking, written from the papers' formulas."""
    s = q.shape[2]
    r = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(r, 1).double()
    i = torch.arange(s)
    lam = (m.double() / math.sqrt(D)).view(1, -1, 1, 1)
    if name in ("xpos", "rope"):
        zq, zk = rotate_pairs(q, i), rotate_pairs(kk, i)
        if name == "xpos":  # q_i xi^(i / sb), k_j xi^(-j / sb)
            zq = rotate_pairs(q, i, var.xi ** (1 / var.scale_base))
            zk = rotate_pairs(kk, i, var.xi ** (-1 / var.scale_base))
        dots = (zq[..., :, None, :] * zk[..., None, :, :].conj()).real.sum(-1)
        return lam * dots
    dots = lam * (q.double() @ kk.transpose(-1, -2))
    dist_ = (i[:, None] - i[None, :]).double()  # i - j
    if name == "alibi":
        slopes = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)], dtype=torch.float64)
        return dots - slopes.view(1, -1, 1, 1) * dist_.abs()
    if name == "kerple_log":
        r1, r2 = var.r1().double().view(1, -1, 1, 1), var.r2().double().view(1, -1, 1, 1)
        return dots - r1 * torch.log(1 + r2 * dist_.abs())
    if name == "kerple_power":
        r1, r2 = var.r1().double().view(1, -1, 1, 1), var.r2().double().view(1, -1, 1, 1)
        return dots - r1 * dist_.abs() ** r2
    if name == "sandwich":
        dp = var.dim
        w = 10000.0 ** (-2 * torch.arange(dp // 2, dtype=torch.float64) / dp)
        ang = i.double()[:, None] * w[None, :]
        p = torch.cat((ang.sin(), ang.cos()), -1)  # sinusoidal p_i [s, d']
        return dots + var.scale * (p @ p.T)  # lambda p_i . p_j
    assert name == "nope"
    return dots


def explicit_visible(s, window=None, block=None):
    i = torch.arange(s)
    q, k = i[:, None], i[None, :]
    vis = k <= q
    if window is not None:
        vis &= q - k < window  # the last `window` tokens including itself
    if block is not None:
        vis &= (k // block) >= (q // block) - 1  # own block and the previous one
    return vis


def explicit_out(logits, v, vis):
    r = logits.shape[1] // v.shape[1]
    p = torch.softmax(logits.masked_fill(~vis, -math.inf), -1)
    return (p @ v.repeat_interleave(r, 1).double()).float()


ALL = sorted(POSITIONS)


def test_registry_has_the_issue_7_variants():
    assert {"nope", "rope", "alibi", "kerple_log", "kerple_power", "sandwich", "xpos"} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("window", [None, 5])
def test_variant_matches_direct_formula_on_every_kernel(name, window):
    s = 13
    q, k, v = rand_qkv(s)
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    var = make(name, window=window)
    ref = explicit_out(explicit_logits(name, var, q, k, m), v, explicit_visible(s, window))
    for impl in IMPLS:
        var.impl = impl
        torch.testing.assert_close(attend(q, k, v, m, var), ref, atol=3e-6, rtol=1e-5,
                                   msg=lambda e: f"{impl}: {e}")
    torch.testing.assert_close(attend(q, k, v, m, var, eager=True), ref, atol=3e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "kerple_log", "kerple_power", "sandwich"])
def test_distance_bias_table_equals_formula(name):
    var = make(name)
    n = 11
    table = var.distance_bias(n)
    assert table.shape == (H, n) and table.dtype == torch.float32
    dd = torch.arange(n, dtype=torch.float64)
    if name == "alibi":
        want = -torch.tensor(alibi_slopes(H), dtype=torch.float64)[:, None] * dd
    elif name == "kerple_log":
        want = -var.r1().double()[:, None] * torch.log1p(var.r2().double()[:, None] * dd)
    elif name == "kerple_power":
        want = -var.r1().double()[:, None] * dd ** var.r2().double()[:, None]
    else:  # sum_k cos(dist w_k) - d'/2: 0 at distance 0, then decaying
        w = 10000.0 ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
        want = (torch.cos(dd[:, None] * w).sum(-1) - D // 2).expand(H, n)
        assert table[:, 0].abs().max() < 1e-6 and torch.all(table[:, 1:] < 0)
    torch.testing.assert_close(table.double(), want, atol=1e-5, rtol=1e-5)
    if name != "sandwich":  # monotone penalty of distance
        assert torch.all(table[:, 1:] <= table[:, :-1])


def test_alibi_slopes_geometric_and_interpolated():
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(4) == [2.0 ** (-2 * i) for i in range(1, 5)]
    # Press et al.'s rule for H = 6: the 4-head slopes, then the odd ones of the 8-head slopes
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    assert len(alibi_slopes(12)) == 12 and len(set(alibi_slopes(12))) == 12


def test_xpos_blockwise_matches_direct_formula():
    s = 29  # > 3 blocks of L = 8
    q, k, v = rand_qkv(s, seed=3)
    m = torch.full((H,), 1.1)
    var = make("xpos", chunk_size=6, xpos=XposConfig(blockwise=True))
    assert var.block == L and var.mask == MaskSpec(block=L)
    vis = explicit_visible(s, block=L)
    assert not vis[20, 7] and vis[20, 8] and vis[15, 0]  # block 2 sees blocks 1, 2
    ref = explicit_out(explicit_logits("xpos", var, q, k, m), v, vis)
    for impl in IMPLS:
        var.impl = impl
        torch.testing.assert_close(attend(q, k, v, m, var), ref, atol=3e-6, rtol=1e-5)


def test_xpos_refuses_positions_whose_key_scales_overflow():
    var = XPOS(D, scale_base=512.0)
    n = var.max_position(torch.float16)  # ln(65504 / 64) * 512 / ln(1 / xi_0)
    assert n == int(math.log(65504.0 / 64) * 512 / -math.log(0.4 / 1.4)) > 2048
    q = torch.full((1, 1, 4, D), 45.0, dtype=torch.float16)
    _, k = var.rotate(q, q, n - 3)  # last position n: finite
    assert torch.isfinite(k).all()
    with pytest.raises(ValueError, match="overflows torch.float16"):
        var.rotate(q, q, n - 2)
    _, k = var.rotate(q.float(), q.float(), n - 2)  # fp32 holds ~35K positions
    assert torch.isfinite(k).all()


def test_xpos_scale_follows_the_paper():
    var = XPOS(D, gamma=0.4, scale_base=512.0)
    k = torch.arange(D // 2, dtype=torch.float32)
    torch.testing.assert_close(var.xi, (k / (D / 2) + 0.4) / 1.4)
    # torchscale's expression
    torch.testing.assert_close(var.xi, (torch.arange(0, D, 2) + 0.4 * D) / (1.4 * D))
    # relative: scores depend on i - j only (decay xi^((i-j)/sb) times the RoPE term)
    q, kk = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)

    def score(i, j):
        qi, _ = var.rotate(q, q, torch.tensor([i]))
        _, kj = var.rotate(kk, kk, torch.tensor([j]))
        return (qi * kj).sum().item()

    assert abs(score(900, 850) - score(60, 10)) < 1e-3
    # the lowest-frequency pair alone: cos(delta theta) xi^(delta / 512)
    e = torch.zeros(1, 1, 1, D)
    e[..., D // 2 - 1] = 1.0
    q, kk = e, e
    theta = 10000.0 ** (-(D - 2) / D)
    xi = (0.75 + 0.4) / 1.4
    for delta in (0, 100, 512, 1500):
        want = math.cos(delta * theta) * xi ** (delta / 512)
        assert abs(score(2000, 2000 - delta) - want) < 1e-5, delta


def test_window_on_nope_and_large_window_is_causal():
    s = 17
    q, k, v = rand_qkv(s, seed=1)
    m = torch.full((H,), 1.2)
    plain = attend(q, k, v, m, NoPE())
    wide = make("nope", window=s)
    assert wide.score_mod is not None  # takes the masked path...
    torch.testing.assert_close(attend(q, k, v, m, wide), plain, atol=2e-6, rtol=1e-5)  # ...same f
    one = make("nope", window=1)  # sees itself only: output = v of its own position
    torch.testing.assert_close(attend(q, k, v, m, one), v.repeat_interleave(H // G, 1),
                               atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "xpos"])
def test_log_length_scale(name):
    """t_i = 1 + a ln max(1, i/L) multiplies the q.k logits of query i (1-based i)."""
    s, a = 21, 0.4
    q, k, v = rand_qkv(s, seed=2)
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    var = make(name, log_scale_a=a)
    i = torch.arange(1, s + 1, dtype=torch.float64)
    t = 1 + a * torch.log(torch.clamp(i / L, min=1.0))
    torch.testing.assert_close(var.query_scale(torch.arange(s)).double(), t, atol=1e-6, rtol=0)
    assert torch.all(t[:L] == 1) and t[-1] > 1
    base = make(name)
    bias = explicit_logits(name, base, q, k, torch.zeros(H))  # the bias alone (0 without one)
    logits = (explicit_logits(name, base, q, k, m) - bias) * t.view(1, 1, -1, 1) + bias
    ref = explicit_out(logits, v, explicit_visible(s))
    torch.testing.assert_close(attend(q, k, v, m, var), ref, atol=3e-6, rtol=1e-5)
    torch.testing.assert_close(attend(q, k, v, m, var, eager=True), ref, atol=3e-6, rtol=1e-5)
    if name == "nope":
        from lenext_dist.attention.core import causal_attention  # the SDPA fast path stays
        assert var.score_mod is None
        torch.testing.assert_close(causal_attention(q, k, v, m, q_scale=t.float()), ref,
                                   atol=3e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("window", [None, 4])
def test_future_tokens_change_nothing(name, window):
    s, t = 14, 6
    q, k, v = rand_qkv(s, seed=4)
    m = torch.full((H,), 1.1)
    var = make(name, window=window, chunk_size=4)
    for impl in IMPLS:
        var.impl = impl
        out = attend(q, k, v, m, var)
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for x in (q2, k2, v2):
            x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:]) * 10
        out2 = attend(q2, k2, v2, m, var)
        torch.testing.assert_close(out[:, :, :t + 1], out2[:, :, :t + 1], atol=0, rtol=0)
        assert not torch.allclose(out[:, :, t + 1:], out2[:, :, t + 1:])


@pytest.mark.parametrize("name", ["alibi", "kerple_log", "sandwich", "xpos"])
@pytest.mark.parametrize("window", [None, 6])
def test_kv_cache_decoding_matches_full(name, window):
    """sq < sk (bottom-right aligned queries) on the chunked path equals the full pass."""
    s = 16
    q, k, v = rand_qkv(s, seed=5)
    m = torch.full((H,), 1.2)
    var = make(name, window=window, chunk_size=3)
    full = attend(q, k, v, m, var)
    for new in (1, 5):
        past = s - new
        _, k_all = var.rotate(q, k, torch.arange(s))  # the cache's keys and the new ones, rotated
        out = attend(q[:, :, past:], k_all, v, m, var, positions=past, keys_rotated=True)
        torch.testing.assert_close(out, full[:, :, past:], atol=3e-6, rtol=1e-5)


def test_probs_for_entropy_see_bias_and_window():
    """iter_attention_probs(score_mod=variant.score_mod), as the entropy evaluation calls it."""
    s = 12
    q, k, v = rand_qkv(s, seed=6)
    m = torch.ones(H)
    var = make("alibi", window=3)
    probs = torch.cat([p for _, p in iter_attention_probs(
        q, k, m, chunk_size=5, score_mod=var.score_mod)], dim=2)
    ref = torch.softmax(explicit_logits("alibi", var, q, k, m).masked_fill(
        ~explicit_visible(s, 3), -math.inf), -1).float()
    torch.testing.assert_close(probs, ref, atol=2e-6, rtol=1e-5)
    assert torch.all(probs[..., 5, :3] == 0)  # outside the window: exactly 0


@pytest.mark.parametrize("window,block", [(None, None), (3, None), (None, 4), (5, 4)])
def test_visible_counts_are_the_row_sums_of_the_mask(window, block):
    spec = MaskSpec(window=window, block=block)
    pos = torch.arange(17)
    assert spec.visible_counts(17).tolist() == spec.visible(pos, pos).sum(-1).tolist()


# ---- learned parameters (KERPLE) ----------------------------------------------------------------

@pytest.mark.parametrize("cls", [KerpleLog, KerplePower])
def test_kerple_params_constraints_gradients_and_layers(cls):
    torch.manual_seed(0)
    var = cls(H, r1_init_max=2.0, r2_init_max=1.0, eps=0.01)
    assert sorted(var.state_dict()) == ["r1_raw", "r2_raw"]
    r1, r2 = var.r1(), var.r2()
    assert torch.all((r1 > 0.01) & (r1 <= 2.0 + 1e-5)) and torch.all((r2 > 0.01) & (r2 <= 1.0 + 1e-5))
    with torch.no_grad():  # constraints hold for any raw value
        var.r1_raw.fill_(-50.0)
        var.r2_raw.fill_(50.0)
    assert torch.all(var.r1() >= 0.01) and torch.all(var.r2() > 0.01)
    if cls is KerplePower:
        assert torch.all(var.r2() <= 2.0)
    var.reset_parameters()
    s = 12
    q, k, v = rand_qkv(s, seed=8)
    for impl in ("chunked", "sdpa_mask", "eager"):
        var.impl = impl
        var.zero_grad()
        attend(q, k, v, torch.ones(H), var).square().sum().backward()
        for p in (var.r1_raw, var.r2_raw):
            assert p.grad is not None and torch.isfinite(p.grad).all() and torch.all(p.grad != 0)
    twin = var.for_layer()
    assert twin is not var and not torch.equal(twin.r1_raw, var.r1_raw)
    assert NoPE().for_layer().__class__ is NoPE
    alibi = ALiBi(H)
    assert alibi.for_layer() is alibi and alibi.state_dict() == {}


def test_parameter_free_variants_add_no_state():
    for name in ALL:
        var = make(name)
        if name.startswith("kerple"):
            continue
        assert var.state_dict() == {} and var.for_layer() is var, name


# ---- config -------------------------------------------------------------------------------------

def test_build_from_attention_config_and_from_exported_dicts():
    v = build_position(AttentionConfig(position="sandwich", window=64, temperature=TemperatureConfig(
                                           kind="log_fit", a=0.3, layers="all"),
                                       sandwich=SandwichConfig(dim=4, scale=0.5, per_head=True)),
                       head_dim=16, train_length=128, num_heads=4)
    assert isinstance(v, Sandwich) and v.dim == 4 and v.window == 64 and v.temperature.a == 0.3
    torch.testing.assert_close(v.lam, 0.5 * torch.tensor([1.0, 0.25, 1 / 16, 1 / 64]))
    # the HF side: position/rope + config.json's attention_options (plain dicts)
    opts = {"window": None, "temperature": None, "impl": "chunked", "chunk_size": 256,
            "kerple": {"r1_init_max": 2.0, "r2_init_max": 1.0, "eps": 0.01},
            "sandwich": {"dim": None, "scale": 1.0, "per_head": False, "base": 10000.0},
            "xpos": {"gamma": 0.5, "scale_base": 256.0, "blockwise": True}}
    x = build_position(NS(position="xpos", rope={"base": 500.0}, **opts), head_dim=16,
                       train_length=128, num_heads=4)
    assert isinstance(x, XPOS) and x.base == 500.0 and x.gamma == 0.5 and x.block == 128
    assert x.impl == "chunked" and x.chunk_size == 256
    kp = build_position(AttentionConfig(position="kerple_power",
                                        kerple=KerpleConfig(r1_init_max=0.5)),
                        head_dim=16, train_length=128, num_heads=4)
    assert isinstance(kp, KerplePower) and torch.all(kp.r1() <= 0.5 + 1e-6)
    with pytest.raises(ValueError, match="num_heads"):
        build_position(AttentionConfig(position="alibi"), head_dim=16, train_length=128)
    with pytest.raises(ConfigError, match="attention.window"):
        AttentionConfig(window=0)
    with pytest.raises(ConfigError, match="attention.kerple"):
        KerpleConfig(r2_init_max=2.5)


def test_auto_impl_choice():
    short, long_ = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 2048, 8)
    assert choose_impl("auto", short, short, short, None) == "chunked"  # CPU, short
    assert choose_impl("auto", long_, long_, long_, None) == "flex"  # CPU evaluation pass
    assert choose_impl("auto", long_[:, :, :1], long_, long_, None) == "chunked"  # KV-cache step
    with torch.no_grad():
        g = long_.clone().requires_grad_()
        assert choose_impl("auto", g, long_, long_, None) == "flex"
    g = long_.clone().requires_grad_()
    assert choose_impl("auto", g, long_, long_, None) == "chunked"  # training on CPU
    assert choose_impl("flex", g, long_, long_, None) == "chunked"  # no flex backward on CPU
    assert choose_impl("sdpa_mask", g, long_, long_, None) == "sdpa_mask"
    # a HeadScale search: q, k, v of frozen weights, the gradient through m alone (or q_scale)
    m = torch.ones(1, requires_grad=True)
    assert choose_impl("auto", long_, long_, long_, None, m) == "chunked"
    assert choose_impl("auto", long_, long_, long_, None, None, m) == "chunked"


def test_flex_falls_back_to_chunked_when_it_cannot_compile(monkeypatch):
    from lenext_dist.attention import paths

    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(paths, "_compiled_flex", broken)
    monkeypatch.setattr(paths, "_flex_shapes", {})
    monkeypatch.setattr(paths, "_flex_broken", {})
    q, k, v = rand_qkv(16, seed=10)
    var = make("alibi", window=5)
    ref = attend(q, k, v, torch.ones(H), var, eager=True)
    var.impl = "flex"
    with torch.no_grad(), pytest.warns(UserWarning, match="FlexAttention unavailable"):
        out = attend(q, k, v, torch.ones(H), var)
    torch.testing.assert_close(out, ref, atol=3e-6, rtol=1e-5)
    assert paths._flex_broken


def test_flex_path_matches_reference():
    """FlexAttention (torch.compile) without autograd: bias as score_mod, window as block mask."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    s = 128
    q, k, v = rand_qkv(s, seed=9)
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    var = make("alibi", window=40)
    ref = attend(q, k, v, m, var, eager=True)
    var.impl = "flex"
    with torch.no_grad():
        out = attend(q, k, v, m, var)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ---- megatron model with each variant (1-rank gloo) ---------------------------------------------

MODEL_CASES = [("alibi", None), ("kerple_log", None), ("kerple_power", None), ("sandwich", None),
               ("xpos", None), ("nope", 8), ("rope", 8)]




@pytest.mark.parametrize("position,window", MODEL_CASES)
def test_megatron_model_forward_backward(megatron_1rank, position, window):
    from lenext_dist.config import ModelConfig, RunConfig
    from lenext_dist.model import build_model, init_megatron, parameter_counts

    cfg = RunConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_query_groups=2, ffn_hidden_size=176, vocab_size=128,
                                      seq_length=32),
                    attention=AttentionConfig(position=position, window=window,
                                              xpos=XposConfig(blockwise=True)))
    init_megatron(1234)
    model = build_model(cfg, device="cpu")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 33), generator=gen)
    pos = torch.arange(32).expand(2, 32)
    loss = model(ids[:, :-1], pos, attention_mask=None, labels=ids[:, 1:])
    assert loss.shape == (2, 32) and torch.isfinite(loss).all()
    assert abs(loss.mean().item() - math.log(128)) < 0.5
    loss.mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    keys = [k for k in model.state_dict() if ".core_attention.position." in k]
    if position.startswith("kerple"):
        assert sorted(keys) == sorted(f"decoder.layers.{i}.self_attention.core_attention."
                                      f"position.{n}" for i in range(2) for n in ("r1_raw", "r2_raw"))
        r1 = [p for n, p in model.named_parameters() if n.endswith("position.r1_raw")]
        assert len(r1) == 2 and not torch.equal(r1[0], r1[1])  # one set per layer
        assert all(torch.all(p.grad != 0) for p in r1)
        counts = parameter_counts(model)
        assert counts["total"] == sum(p.numel() for p in model.parameters())
    else:
        assert keys == []
    attn = model.decoder.layers[0].self_attention.core_attention
    assert attn.position.name == position and attn.position.window == window
    # the function really changes with the variant: same weights, NoPE -> different logits
    nope_cfg = RunConfig(model=cfg.model, attention=AttentionConfig())
    init_megatron(1234)
    nope = build_model(nope_cfg, device="cpu")
    nope.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(nope(ids[:, :-1], pos, None), model(ids[:, :-1], pos, None))


@pytest.mark.parametrize("position", sorted(set(POSITIONS) - {"rope"}))
def test_rope_scaling_on_a_variant_without_rope_is_refused(position):
    """--rope-scaling yarn on a NoPE export must not evaluate the unscaled model under a YaRN name."""
    attn = NS(position=position, rope={"base": 10000.0, "scaling": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="rope.scaling='yarn'"):
        build_position(attn, head_dim=64, train_length=32, num_heads=4)
    with pytest.raises(ConfigError, match=r"attention\.rope\.scaling"):
        load_config(None, [f"attention.position={position}", "attention.rope.scaling=yarn"])
