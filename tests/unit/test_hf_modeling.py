"""lenext_dist.hf (the modeling code shipped in every export) and lenext_dist.convert.keymap, in
process: the HF attention is the shared attention math, configs it cannot honour are refused, NoPE
never rotates, the KV cache is exact, and megatron -> HF conversion of random megatron models gives
the same logits for NoPE/RoPE x MHA/GQA x tied/untied x learned head scales."""
import math
import os

import pytest
import torch

from lenext_dist.attention import eager_causal_attention, iter_attention_probs
from lenext_dist.config import AttentionConfig, HeadScaleConfig, ModelConfig, RunConfig
from lenext_dist.convert.keymap import Shape, megatron_to_hf, merge_qkv, split_qkv
from lenext_dist.hf import (LenextConfig, LenextForCausalLM, attention_inputs, attention_layers,
                            get_head_scales, set_head_scales, set_position, set_uniform_scale)
from lenext_dist.hf.configuration_lenext import LENEXT_ROPE_GUARD
from tiny_models import megatron_and_hf

os.environ.setdefault("DS_ACCELERATOR", "cpu")

ROPE = {"base": 10000.0, "scaling": "none", "factor": 1.0}


def hf_config(position="nope", kv=2, **kw):
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=32,
                position=position, rope=dict(ROPE), scale_c=1.0, train_length=32,
                rope_parameters=dict(LENEXT_ROPE_GUARD))
    base.update(kw)
    return LenextConfig(**base)


def model(position="nope", kv=2, seed=0, **kw):
    torch.manual_seed(seed)
    return LenextForCausalLM(hf_config(position, kv, **kw)).eval()


def ids(b=2, s=24, vocab=97, seed=1):
    return torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ attention = shared math


def naive_attention(q, k, v, m):
    """Independent reference: softmax(m_h/sqrt(d) q.k + causal) v with GQA by repeat_interleave."""
    h, g, d = q.shape[1], k.shape[1], q.shape[-1]
    k, v = (x.repeat_interleave(h // g, dim=1) for x in (k, v))
    s = q @ k.transpose(-1, -2) * (m.view(1, -1, 1, 1) / math.sqrt(d))
    mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("position", ["nope", "rope"])
@pytest.mark.parametrize("kv", [4, 2, 1])
def test_hf_attention_is_the_shared_attention_math(position, kv):
    mdl = model(position, kv)
    attn = attention_layers(mdl)[0]
    with torch.no_grad():
        attn.head_scale.copy_(torch.tensor([1.0, 1.3, 0.7, 2.0]))
        x = torch.randn(2, 20, 64)
        got = attn(x, 0)
        q, k, v = attn._project(x)
        variant = attn.position
        assert variant.name == position and all(a.position.name == position
                                                 for a in attention_layers(mdl))
        qr, kr = variant.rotate(q, k, 0)
        ref = eager_causal_attention(qr, kr, v, attn.head_scale)
        indep = naive_attention(qr, kr, v, attn.head_scale)
        want = attn.o_proj(ref.transpose(1, 2).reshape(2, 20, 64))
        torch.testing.assert_close(ref, indep, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # qk(): the rotated q, k the evaluation suite feeds to iter_attention_probs
        q2, k2 = attn.qk(x, 0)
        torch.testing.assert_close(q2, qr)
        torch.testing.assert_close(k2, kr)
        probs = torch.cat([p for _, p in iter_attention_probs(q2, k2, attn.head_scale)], dim=2)
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 20))


def test_unknown_or_missing_config_fields_are_refused():
    with pytest.raises(ValueError, match="unknown config.position 'alibi-x'"):
        LenextForCausalLM(hf_config(position="alibi-x"))
    with pytest.raises(ValueError, match=r"missing \['position'\]"):
        LenextForCausalLM(hf_config(position=None))
    with pytest.raises(ValueError, match="missing"):
        LenextForCausalLM(hf_config(scale_c=None))
    with pytest.raises(ValueError, match="config.rope must be a dict"):
        LenextForCausalLM(hf_config(rope={"base": 10000.0}))
    with pytest.raises(ValueError, match="unknown rope scaling"):
        LenextForCausalLM(hf_config(position="rope", rope={**ROPE, "scaling": "longrope"}))
    mdl = model()
    with pytest.raises(ValueError, match="unknown config.position"):
        set_position(mdl, "sinusoid")
    assert mdl.config.position == "nope"  # unchanged after a refused switch
    # kernel options too, at the switch (they failed at the first forward: KeyError, range step 0)
    with pytest.raises(ValueError, match="impl 'flx': known auto, eager"):
        set_position(mdl, impl="flx")
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        set_position(mdl, window=4, chunk_size=0)
    assert not (mdl.config.attention_options or {}).get("impl")  # left as it was


def test_nope_never_rotates_and_forcing_rope_changes_the_function():
    mdl = model("nope")
    x = ids()
    attn = attention_layers(mdl)[0]
    h = torch.randn(1, 10, 64)
    q, k = attn.qk(h, 5)
    q0, k0, _ = attn._project(h)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # identity at any position
    with torch.no_grad():
        nope = mdl(input_ids=x, use_cache=False).logits
        set_position(mdl, "rope")
        assert mdl.config.position == "rope" and attention_layers(mdl)[1].position.name == "rope"
        rope = mdl(input_ids=x, use_cache=False).logits
        set_position(mdl, rope={"scaling": "yarn", "factor": 4.0})
        assert mdl.config.rope == {**ROPE, "scaling": "yarn", "factor": 4.0}
        yarn = mdl(input_ids=x, use_cache=False).logits
        set_position(mdl, "nope", rope=ROPE)  # a NoPE model refuses a RoPE scaling
        again = mdl(input_ids=x, use_cache=False).logits
    assert not torch.allclose(nope, rope, atol=1e-3)
    assert not torch.allclose(rope, yarn, atol=1e-3)
    assert torch.equal(nope, again)


def _registered():
    from lenext_dist.attention import POSITIONS

    return sorted(POSITIONS)


@pytest.mark.parametrize("position", _registered())
def test_kv_cache_generate_equals_no_cache_greedy(position):
    mdl = model(position, kv=2)
    prompt = ids(1, 7)
    out = mdl.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, mdl(input_ids=seq, use_cache=False).logits[:, -1:].argmax(-1)], 1)
        # prefill + one cached step equals the full forward at the last position
        full = mdl(input_ids=seq, use_cache=False).logits
        pre = mdl(input_ids=seq[:, :-3], use_cache=True)
        step = mdl(input_ids=seq[:, -3:], past_key_values=pre.past_key_values, use_cache=True)
    assert out.tolist() == seq.tolist()
    torch.testing.assert_close(step.logits, full[:, -3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", _registered())
@pytest.mark.parametrize("options", [{}, {"window": 5}])
def test_hidden_from_equals_the_tail_of_the_full_forward(position, options):
    # the last layer computing only the tail (scoring, prefill) must not change a number
    mdl = model(position, kv=2, attention_options=options)
    x = ids(2, 24)
    with torch.no_grad():
        full = mdl.model(input_ids=x, use_cache=False).last_hidden_state
        tail = mdl.model(input_ids=x, use_cache=False, hidden_from=17).last_hidden_state
        logits = mdl(input_ids=x, use_cache=False).logits
        kept = mdl(input_ids=x, use_cache=False, logits_to_keep=3).logits
    assert tail.shape == (2, 7, 64)
    torch.testing.assert_close(tail, full[:, 17:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kept, logits[:, -3:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="hidden_from=24"):
        mdl.model(input_ids=x, use_cache=False, hidden_from=24)


def test_scales_helpers():
    a, b = model(seed=3), model(seed=3, scale_c=1.2)
    x = ids()
    torch.testing.assert_close(get_head_scales(b), torch.full((2, 4), 1.2))
    with torch.no_grad():
        set_uniform_scale(a, 1.2)
        torch.testing.assert_close(a(input_ids=x).logits, b(input_ids=x).logits, atol=0, rtol=0)
        s = torch.tensor([[1.0, 1.5, 2.0, 1.1], [1.2, 1.2, 0.9, 3.0]])
        set_head_scales(a, s.double())
        assert attention_layers(a)[1].head_scale.dtype == torch.float32
        torch.testing.assert_close(get_head_scales(a), s)
        assert not torch.allclose(a(input_ids=x).logits, b(input_ids=x).logits)
    with pytest.raises(ValueError, match="shape"):
        set_head_scales(a, torch.ones(2, 3))
    a.to(torch.bfloat16)  # head scales stay fp32 (and exact) under a dtype cast
    assert attention_layers(a)[0].head_scale.dtype == torch.float32
    torch.testing.assert_close(get_head_scales(a), s)


def test_a_dtype_cast_keeps_kerple_parameters_fp32():
    """model.to(bfloat16) keeps KERPLE's learned r1/r2 fp32 and exact, as the head scales (they
    are read in fp32: a bf16 r1 moved the power form's bias by up to 0.16 at distance 64)."""
    mdl = model("kerple_power")
    before = {n: p.detach().clone() for n, p in attention_layers(mdl)[0].position.named_parameters()}
    assert before and all(p.dtype == torch.float32 for p in before.values())
    mdl.to(torch.bfloat16)
    after = dict(attention_layers(mdl)[0].position.named_parameters())
    assert {n: p.dtype for n, p in after.items()} == {n: torch.float32 for n in before}
    for n, p in after.items():
        assert torch.equal(p.detach(), before[n]), n
    assert mdl.model.embed_tokens.weight.dtype == torch.bfloat16  # the rest is cast


def test_attention_inputs_feed_qk():
    mdl = model("rope")
    x = ids(1, 12)
    inputs = attention_inputs(mdl, x)
    assert len(inputs) == 2 and inputs[0].shape == (1, 12, 64)
    q, k = attention_layers(mdl)[1].qk(inputs[1], 0)
    assert q.shape == (1, 4, 12, 16) and k.shape == (1, 2, 12, 16)


def test_left_padding_is_refused_right_padding_is_exact():
    mdl = model()
    with pytest.raises(NotImplementedError, match="right padding"):
        mdl(input_ids=ids(2, 5), attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]),
            use_cache=False)
    with pytest.raises(NotImplementedError, match="right padding"):  # padding + cache
        mdl(input_ids=ids(2, 5), attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
            use_cache=True)
    assert mdl.config.use_cache  # use_cache=None: the config's, a cache of pad keys
    with pytest.raises(NotImplementedError, match="right padding"):
        mdl(input_ids=ids(2, 5), attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="must be 2-D .* got 4-D"):  # was run as plain causal
        mdl(input_ids=ids(1, 5), attention_mask=torch.ones(1, 1, 5, 5).tril(), use_cache=False)
    x = ids(2, 9)
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    with torch.no_grad():
        padded = mdl(input_ids=x, attention_mask=mask, use_cache=False).logits
        short = mdl(input_ids=x[1:, :6], use_cache=False).logits
    torch.testing.assert_close(padded[1, :6], short[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ key map vs real megatron




def test_qkv_split_merge_roundtrip():
    s = Shape(2, 8, 2, 4)
    w = torch.randn((8 + 4) * 4, 16)
    q, k, v = split_qkv(w, s)
    assert q.shape == (32, 16) and k.shape == (8, 16)
    # group 1 of the fused layout starts with q heads 4..7, then k_1, v_1
    per_group = (4 + 2) * 4
    torch.testing.assert_close(w[per_group:per_group + 16], q[16:32])
    torch.testing.assert_close(w[per_group + 16:per_group + 20], k[4:8])
    assert torch.equal(merge_qkv(q, k, v, s), w)


@pytest.mark.parametrize("position,groups,tie,learned", [
    ("nope", 2, False, False), ("rope", None, False, False), ("rope", 1, True, False),
    ("nope", None, False, True)])
def test_megatron_to_hf_logits(megatron_1rank, position, groups, tie, learned):
    cfg = RunConfig(
        model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                          num_query_groups=groups, ffn_hidden_size=96, vocab_size=97,
                          seq_length=32, tie_embeddings=tie),
        attention=AttentionConfig(position=position, scale_c=1.3,
                                  head_scale=HeadScaleConfig(enabled=learned)))
    # norms/scales away from 1 so a swapped key would show
    meg, hf, _, hf_state = megatron_and_hf(cfg, megatron_1rank, seed=7, jitter=0.2)
    assert ("model.layers.0.self_attn.head_scale" in hf_state) == learned
    assert ("lm_head.weight" in hf_state) == (not tie)
    x = ids(2, 32)
    with torch.no_grad():
        want = meg(x, torch.arange(32).expand(2, 32), attention_mask=None)
        got = hf(input_ids=x, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unmapped_megatron_key_is_an_error():
    s = Shape(1, 4, 4, 16)
    with pytest.raises(KeyError, match="lacks the source"):
        megatron_to_hf({"embedding.word_embeddings.weight": torch.zeros(3, 64)}, s)


@pytest.mark.parametrize("position", _registered())
def test_every_registered_variant_converts_exactly(megatron_1rank, position):
    """DESIGN.md section 1: for every registered variant, megatron and HF logits agree on the same
    weights (a variant megatron cannot build yet is skipped, not passed)."""
    from lenext_dist.convert.export import build_hf_config
    from lenext_dist.model import build_model

    cfg = RunConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_query_groups=2, ffn_hidden_size=96, vocab_size=97,
                                      seq_length=16),
                    attention=AttentionConfig(position=position, scale_c=1.1))
    megatron_1rank(11)
    try:
        meg = build_model(cfg, device="cpu").eval()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"megatron side cannot build {position!r} yet: {type(e).__name__}: {e}")
    with torch.no_grad():
        for p in meg.parameters():
            p.add_(torch.rand_like(p) * 0.1)
    state = {k: v for k, v in meg.state_dict().items() if isinstance(v, torch.Tensor)}
    hf = LenextForCausalLM(build_hf_config(cfg, scale_c=1.1, head_scale_source="uniform", tok=None,
                                           source={}, dtype="float32")).eval()
    missing, unexpected = hf.load_state_dict(megatron_to_hf(state, Shape.from_run_config(cfg)),
                                             strict=False)
    assert not unexpected
    assert all(k.endswith("head_scale") for k in missing), missing
    x = ids(2, 40)  # 2.5x the training length: extrapolation paths too
    with torch.no_grad():
        want = meg(x, torch.arange(40).expand(2, 40), attention_mask=None)
        got = hf(input_ids=x, use_cache=False).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # KV-cache decoding of the last tokens equals the full forward for this variant too
        pre = hf(input_ids=x[:, :-2], use_cache=True)
        step = hf(input_ids=x[:, -2:], past_key_values=pre.past_key_values, use_cache=True)
    torch.testing.assert_close(step.logits, got[:, -2:], atol=1e-5, rtol=1e-5)


def test_an_export_leaves_the_training_kernel_behind():
    """attention.impl / chunk_size chose training's kernel at its length; carried into the export
    they ran every evaluation with it (sdpa_mask: an [h, s, s] mask, 256 GiB at 64K x 32 heads),
    while `auto` picks for the length evaluated; sdpa_backends, the training machine's GPU
    kernels, reached an import of the export. The function is the same either way."""
    from lenext_dist.convert.export import build_hf_config

    cfg = RunConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_query_groups=2, ffn_hidden_size=96, vocab_size=97, seq_length=16),
                    attention=AttentionConfig(position="alibi", impl="sdpa_mask", chunk_size=64, window=8,
                                              sdpa_backends=["cudnn", "flash"]))
    hf = build_hf_config(cfg, scale_c=1.0, head_scale_source="uniform", tok=None, source={}, dtype="float32")
    assert hf.attention_options["window"] == 8
    assert not {"impl", "chunk_size", "sdpa_backends"} & set(hf.attention_options), hf.attention_options
    assert LenextForCausalLM(hf).model.layers[0].self_attn.position.impl == "auto"
