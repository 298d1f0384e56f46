"""lenext_dist.model on real megatron-core (CPU, 1-rank gloo group): the forward contract, our core
attention against megatron's stock DotProductAttention, HeadScale semantics and training, the
meta-device dry build of TinyLlama-1.1B, parameter counts and FLOPs."""
import dataclasses
import math
import os

import pytest
import torch

from lenext_dist.config import (AttentionConfig, HeadScaleConfig, ModelConfig,
                                RunConfig, TrainConfig)
from lenext_dist.model import (build_model, flops_per_token,
                               head_scale_parameters, init_megatron, parameter_counts,
                               transformer_config)

os.environ.setdefault("DS_ACCELERATOR", "cpu")

TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
            ffn_hidden_size=176, vocab_size=128, seq_length=32)
TINYLLAMA = dict(name="tinyllama-1.1b", num_layers=22, hidden_size=2048, num_attention_heads=32,
                 num_query_groups=4, ffn_hidden_size=5632, vocab_size=32000, seq_length=2048)


pytestmark = pytest.mark.usefixtures("megatron_1rank")  # conftest.py: one gloo rank + megatron


def tiny_cfg(position="nope", scale_c=1.0, head_scale=None, precision="fp32", **model):
    return RunConfig(model=ModelConfig(**{**TINY, **model}),
                     attention=AttentionConfig(position=position, scale_c=scale_c,
                                               head_scale=head_scale or HeadScaleConfig()),
                     train=TrainConfig(precision=precision))


def batch(cfg, b=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    s = cfg.model.seq_length
    ids = torch.randint(0, cfg.model.vocab_size, (b, s + 1), generator=gen)
    return ids[:, :-1], torch.arange(s).expand(b, s), ids[:, 1:]


def build(cfg, seed=1234):
    init_megatron(seed)  # same seed -> same weights
    return build_model(cfg, device="cpu")


@pytest.mark.parametrize("position", ["nope", "rope"])
def test_forward_backward_contract(position):
    cfg = tiny_cfg(position)
    model = build(cfg)
    ids, pos, labels = batch(cfg)
    loss = model(ids, pos, attention_mask=None, labels=labels)
    assert loss.shape == ids.shape and loss.dtype == torch.float32
    assert abs(loss.mean().item() - math.log(cfg.model.vocab_size)) < 0.5  # ~uniform at init
    loss.mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    logits = model(ids, pos, attention_mask=None)
    assert logits.shape == (*ids.shape, cfg.model.vocab_size)


def test_rope_changes_the_function():
    nope, rope = build(tiny_cfg("nope")), build(tiny_cfg("rope"))
    rope.load_state_dict(nope.state_dict())
    ids, pos, _ = batch(tiny_cfg())
    assert not torch.allclose(nope(ids, pos, None), rope(ids, pos, None))


def test_matches_stock_megatron_dot_product_attention(monkeypatch):
    """Same weights, NoPE, uniform c: our SDPA core attention vs megatron's DotProductAttention
    with softmax_scale = c / sqrt(d)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.utils import GlobalMemoryBuffer

    class CPUBuffer(GlobalMemoryBuffer):
        """Test-only shim: GlobalMemoryBuffer.get_tensor allocates on torch.cuda.current_device();
        DotProductAttention only uses it as the (beta=0) output of baddbmm."""

        def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
            return torch.empty(tensor_shape, dtype=dtype)

    monkeypatch.setattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", CPUBuffer())
    c = 1.3
    cfg = tiny_cfg(scale_c=c)
    ours = build(cfg)
    config = dataclasses.replace(transformer_config(cfg, device="cpu"),
                                 softmax_scale=c / math.sqrt(cfg.model.head_dim))
    with torch.device("cpu"):
        stock = GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"),
                         vocab_size=cfg.model.vocab_size,
                         max_sequence_length=cfg.model.seq_length, position_embedding_type="none")
    stock.load_state_dict(ours.state_dict(), strict=True)
    ids, pos, _ = batch(cfg)
    s = cfg.model.seq_length
    # the stock path builds its default causal mask on "cuda": pass it explicitly (True = masked)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        ref = stock(ids, pos, attention_mask=mask)
        out = ours(ids, pos, attention_mask=None)
    assert out.shape == (*ids.shape, cfg.model.vocab_size)
    assert (out - ref).abs().max().item() < 1e-5  # measured 1.2e-7


def test_head_scale_all_c_equals_uniform_c():
    """Per-head m_h = c (q * m in fp32) vs the uniform c (SDPA's scale= c / sqrt(d), q untouched):
    the same function up to rounding."""
    c = 1.25
    uniform = build(tiny_cfg(scale_c=c))
    per_head = build(tiny_cfg(scale_c=1.0, head_scale=HeadScaleConfig(enabled=True, init=c)))
    missing, unexpected = per_head.load_state_dict(uniform.state_dict(), strict=False)
    assert all(k.endswith("core_attention.head_scale") for k in missing) and not unexpected
    ids, pos, labels = batch(tiny_cfg())
    with torch.no_grad():
        torch.testing.assert_close(uniform(ids, pos, None, labels=labels),
                                   per_head(ids, pos, None, labels=labels), atol=1e-5, rtol=1e-5)
    # the uniform scale is a non-persistent buffer: not a parameter, not in checkpoints
    assert head_scale_parameters(uniform) == []
    assert not any("head_scale" in k for k in uniform.state_dict())


def test_headscale_peft_step_changes_only_head_scales():
    cfg = tiny_cfg(position="rope", head_scale=HeadScaleConfig(enabled=True, trainable=True,
                                                               init=1.2, min_value=1.0))
    model = build(cfg)
    hs = head_scale_parameters(model)
    assert len(hs) == cfg.model.num_layers
    assert all(p.shape == (4,) and p.dtype == torch.float32 and p.requires_grad for _, p in hs)
    hs_names = {n for n, _ in hs}
    for n, p in model.named_parameters():
        p.requires_grad_(n in hs_names)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW([p for _, p in hs], lr=0.1, weight_decay=0.0)
    ids, pos, labels = batch(cfg)
    model(ids, pos, None, labels=labels).mean().backward()
    opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) != (n in hs_names), n
    # constraint m_h >= min_value
    with torch.no_grad():
        hs[0][1][0] = 0.5
    # the clamp the training loop runs after every step (here on plain parameters, no ZeRO; the
    # ZeRO-2 engine's fp32 master: test_train_engine.py::test_headscale_step_under_zero2_...)
    from lenext_dist.train.optim import clamp_head_scales

    clamp_head_scales(model, cfg.attention.head_scale.min_value)
    assert hs[0][1][0].item() == 1.0 and hs[0][1].min().item() >= 1.0


def test_head_scale_frozen_when_not_trainable():
    model = build(tiny_cfg(head_scale=HeadScaleConfig(enabled=True, init=1.5)))
    hs = head_scale_parameters(model)
    assert hs and all(not p.requires_grad and torch.all(p == 1.5) for _, p in hs)


def test_megatron_softmax_scale_is_refused():
    from lenext_dist.model.core_attention import LenextCoreAttention
    from megatron.core.transformer.enums import AttnMaskType

    cfg = tiny_cfg()
    with pytest.raises(ValueError, match="softmax_scale"):
        LenextCoreAttention(config=transformer_config(cfg, device="cpu"), layer_number=1,
                            attn_mask_type=AttnMaskType.causal, attention_type="self",
                            softmax_scale=0.3, variant=None, init_scale=1.0, learned=False,
                            trainable=False)


def test_bf16_build_keeps_fp32_head_scale():
    cfg = tiny_cfg(precision="bf16", head_scale=HeadScaleConfig(enabled=True, trainable=True))
    model = build(cfg)
    assert model.output_layer.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for _, p in head_scale_parameters(model))
    ids, pos, labels = batch(cfg)
    loss = model(ids, pos, None, labels=labels)
    assert loss.shape == ids.shape and loss.dtype == torch.float32 and torch.isfinite(loss).all()
    loss.float().mean().backward()
    assert all(p.grad is not None for _, p in head_scale_parameters(model))


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("enabled", [False, True])
def test_parameter_counts_config_equals_model(tie, enabled):
    cfg = tiny_cfg(tie_embeddings=tie, head_scale=HeadScaleConfig(enabled=enabled))
    model = build_model(cfg, device="meta")
    assert parameter_counts(model) == parameter_counts(cfg)


def test_tinyllama_meta_dry_build():
    cfg = RunConfig(model=ModelConfig(**TINYLLAMA),
                    attention=AttentionConfig(head_scale=HeadScaleConfig(enabled=True)))
    model = build_model(cfg, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    counts = parameter_counts(model)
    assert counts == parameter_counts(cfg)
    assert counts["total"] == 1_100_048_384 + 704  # TinyLlama-1.1B + the head scales
    assert counts["head_scales"] == 22 * 32
    assert counts["embedding"] == 32000 * 2048
    # PaLM App. B: 6 N + 12 L H Q T with N = non-embedding params
    expected = 6 * counts["non_embedding"] + 12 * 22 * 32 * 64 * 2048
    assert flops_per_token(cfg) == expected
    # HeadScale: frozen weights, no weight-gradient matmuls (2N fewer)
    cfg.train.mode = "headscale"
    assert flops_per_token(cfg) == expected - 2 * counts["non_embedding"]
