"""One device, one dtype for every parameter the model builds (issue 39, item 1).

megatron creates torch.nn.RMSNorm without device or dtype (transformer/torch_norm.py): before
`model.build.place_parameters`, a bf16 model kept its 2 * layers + 1 norm weights in fp32 (and,
on CUDA, on the CPU beside GPU weights), and train/fp32_params.py kept fp32 shadows of them.
Only HeadScale's m_h and KERPLE's r1/r2 are fp32 on purpose (attention/precision.py)."""
import os

import pytest
import torch

from lenext_dist.config import AttentionConfig, HeadScaleConfig, ModelConfig, RunConfig, TrainConfig
from lenext_dist.model.build import build_model, documented_fp32, place_parameters
from lenext_dist.train import fp32_params

os.environ.setdefault("DS_ACCELERATOR", "cpu")

TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
            ffn_hidden_size=176, vocab_size=128, seq_length=32)


pytestmark = pytest.mark.usefixtures("megatron_1rank")  # conftest.py: one gloo rank + megatron


def cfg(precision="bf16", position="kerple_log"):
    return RunConfig(model=ModelConfig(**TINY),
                     attention=AttentionConfig(position=position, head_scale=HeadScaleConfig(
                         enabled=True, init=1.5, trainable=True)),
                     train=TrainConfig(precision=precision))


def placement(model):
    """{(device, dtype): [names]} of the model's parameters."""
    out = {}
    for name, p in model.named_parameters():
        out.setdefault((str(p.device), p.dtype), []).append(name)
    return out


def assert_one_device_dtype(model, device, dtype):
    fp32 = [n for n, _ in model.named_parameters() if documented_fp32(n)]
    # head_scale and KERPLE's r1_raw, r2_raw in each layer
    assert len(fp32) == 3 * TINY["num_layers"], fp32
    want = {(device, dtype): sorted(n for n, _ in model.named_parameters() if n not in fp32),
            (device, torch.float32): sorted(fp32)}
    got = {k: sorted(v) for k, v in placement(model).items()}
    assert got == want


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bf16_build_one_device_one_dtype(device):
    model = build_model(cfg(), device=device)
    norms = [n for n, _ in model.named_parameters() if "layernorm" in n or "final_norm" in n]
    assert len(norms) == 2 * TINY["num_layers"] + 1
    assert_one_device_dtype(model, device, torch.bfloat16)
    for mod in model.modules():
        for b in mod.buffers(recurse=False):
            assert str(b.device) == device


def test_emulated_accelerator_placement():
    """CUDA's situation on CPU: megatron's weights and the norms created elsewhere (here: an fp32
    CPU build, the norms' raw state) are all moved to the target device and dtype (meta stands in
    for the accelerator)."""
    model = build_model(cfg(precision="fp32"), device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    place_parameters(model, torch.device("meta"), torch.bfloat16)
    assert_one_device_dtype(model, "meta", torch.bfloat16)


def test_fp32_shadows_only_for_documented_fp32():
    """fp32_params.capture (what a bf16 engine keeps exact) holds m_h and r1/r2 only."""
    model = build_model(cfg(), device="cpu")
    assert sorted(fp32_params.capture(model)) == sorted(
        n for n, _ in model.named_parameters() if documented_fp32(n))


def test_bf16_forward_backward_runs_on_placed_model():
    model = build_model(cfg(), device="cpu")
    ids = torch.randint(0, TINY["vocab_size"], (2, TINY["seq_length"]))
    pos = torch.arange(TINY["seq_length"]).expand(2, -1)
    loss = model(ids, pos, attention_mask=None, labels=ids)
    loss.float().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype, name
