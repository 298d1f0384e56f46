"""export() on a hand-built ZeRO-0 step folder (DeepSpeed's module-file layout, written here from a
real megatron model): every layer's learned head scales land in that layer of the export."""
import json

import pytest
import torch
import torch.distributed as dist

from lenext_dist.config import (AttentionConfig, HeadScaleConfig, ModelConfig, ParallelConfig,
                                RunConfig, TrainConfig, save_config)
from lenext_dist.convert.export import export
from lenext_dist.model import build_model, destroy_megatron, init_megatron, init_single_process_group
from lenext_dist.checkpoint.layout import COMPLETE, tag_for

LAYERS, HEADS = 3, 4


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory):
    own = init_single_process_group()
    init_megatron(1234)
    try:
        cfg = RunConfig(model=ModelConfig(num_layers=LAYERS, hidden_size=32, num_attention_heads=HEADS,
                                          num_query_groups=2, ffn_hidden_size=64, vocab_size=128,
                                          seq_length=16),
                        attention=AttentionConfig(scale_c=1.0, head_scale=HeadScaleConfig(
                            enabled=True, trainable=True, init=1.0)),
                        train=TrainConfig(precision="fp32"), parallel=ParallelConfig(zero_stage=0))
        model = build_model(cfg, device="cpu")
    finally:
        destroy_megatron()
        if own:
            dist.destroy_process_group()
    state = model.state_dict()
    for i in range(LAYERS):  # distinct per layer and per head: 1.1, 1.2, ... 2.2
        state[f"decoder.layers.{i}.self_attention.core_attention.head_scale"] = \
            1.0 + 0.1 * torch.arange(i * HEADS + 1, (i + 1) * HEADS + 1, dtype=torch.float32)
    step = tmp_path_factory.mktemp("ckpt") / tag_for(7)
    step.mkdir()
    torch.save({"module": state}, step / "mp_rank_00_model_states.pt")  # DeepSpeed's ZeRO-0 file
    save_config(cfg, step / "config.yaml")
    (step / COMPLETE).write_text("7\n")
    return step, state


def exported(out):
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors")), json.loads((out / "config.json").read_text())


def test_export_keeps_each_layers_learned_scales(step_dir, tmp_path):
    step, state = step_dir
    info = export(step, tmp_path / "hf", tokenizer="")
    w, cfg = exported(tmp_path / "hf")
    assert info["head_scale_source"] == cfg["head_scale_source"] == "learned"
    for i in range(LAYERS):
        want = state[f"decoder.layers.{i}.self_attention.core_attention.head_scale"]
        assert torch.equal(w[f"model.layers.{i}.self_attn.head_scale"], want), i
    assert torch.equal(w["model.embed_tokens.weight"], state["embedding.word_embeddings.weight"])
    assert info["head_scales"] == torch.stack(
        [state[f"decoder.layers.{i}.self_attention.core_attention.head_scale"]
         for i in range(LAYERS)]).tolist()


def test_export_overrides_learned_scales_when_asked(step_dir, tmp_path):
    step, _ = step_dir
    export(step, tmp_path / "u", tokenizer="", scale_c=1.3)
    w, cfg = exported(tmp_path / "u")
    assert cfg["head_scale_source"] == "uniform" and cfg["scale_c"] == 1.3
    assert all(torch.equal(w[f"model.layers.{i}.self_attn.head_scale"], torch.full((HEADS,), 1.3))
               for i in range(LAYERS))
    given = torch.rand(LAYERS, HEADS) + 1
    export(step, tmp_path / "f", tokenizer="", head_scales=given)
    w, cfg = exported(tmp_path / "f")
    assert cfg["head_scale_source"] == "file"
    assert all(torch.equal(w[f"model.layers.{i}.self_attn.head_scale"], given[i]) for i in range(LAYERS))
