"""convert checks every tensor against the shape its step's config.yaml gives it before writing:
a config.yaml that disagrees with the weights (hand-edited, copied from another run) ends in one
error line naming the key, exit 2, and no output folder. The shape table matches real megatron
models."""
import pytest
import torch
import torch.distributed as dist

from lenext_dist.config import load_config, save_config
from lenext_dist.convert.__main__ import main as convert_main
from lenext_dist.convert.keymap import expected_shapes
from lenext_dist.model import build_model, destroy_megatron, init_megatron, init_single_process_group
from lenext_dist.checkpoint.layout import COMPLETE, tag_for

BASE = ["model.num_layers=2", "model.hidden_size=32", "model.num_attention_heads=4",
        "model.num_query_groups=2", "model.ffn_hidden_size=64", "model.vocab_size=128",
        "model.seq_length=16", "train.precision=fp32", "parallel.zero_stage=0"]


def models(*overrides_list):
    own = init_single_process_group()
    init_megatron(1234)
    try:
        return [build_model(load_config(None, [*BASE, *o]), device="cpu") for o in overrides_list]
    finally:
        destroy_megatron()
        if own:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory):
    """A ZeRO-0 step folder (DeepSpeed's module-file layout) of the BASE model."""
    (model,) = models([])
    step = tmp_path_factory.mktemp("ckpt") / tag_for(5)
    step.mkdir()
    torch.save({"module": model.state_dict()}, step / "mp_rank_00_model_states.pt")
    save_config(load_config(None, BASE), step / "config.yaml")
    (step / COMPLETE).write_text("5\n")
    return step


@pytest.mark.parametrize("override,key", [
    ("model.vocab_size=256", "embedding.word_embeddings.weight is [128, 32] in the weights, "
                             "[256, 32] by config.yaml (model.vocab_size)"),
    ("model.ffn_hidden_size=96", "decoder.layers.0.mlp.linear_fc1.weight is [128, 32] in the "
                                 "weights, [192, 32] by config.yaml (model.ffn_hidden_size)"),
    ("model.num_layers=3", "the weights have 2 layers (decoder.layers.0-1), config.yaml has "
                           "model.num_layers=3"),
    ("model.num_layers=1", "config.yaml has model.num_layers=1"),
    ("model.num_attention_heads=8", "decoder.layers.0.self_attention.linear_qkv.weight is [64, 32]"),
    ("model.num_query_groups=4", "decoder.layers.0.self_attention.linear_qkv.weight is [64, 32] "
                                 "in the weights, [96, 32] by config.yaml (model.num_attention_heads"),
    ("model.tie_embeddings=true", "the weights have output_layer.weight, config.yaml has "
                                  "model.tie_embeddings=true"),
    ("model.hidden_size=64", "embedding.word_embeddings.weight is [128, 32] in the weights, "
                             "[128, 64] by config.yaml (model.hidden_size)"),
])
def test_config_disagreeing_with_weights_is_refused_naming_the_key(step_dir, tmp_path, capsys,
                                                                   override, key):
    save_config(load_config(None, [*BASE, override]), step_dir / "config.yaml")
    try:
        rc = convert_main(["--checkpoint", str(step_dir), "--out", str(tmp_path / "hf"),
                           "--no-tokenizer"])
    finally:
        save_config(load_config(None, BASE), step_dir / "config.yaml")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: {step_dir}: its config.yaml disagrees")
    assert key in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()


def test_untied_config_of_tied_weights_is_refused(tmp_path, capsys):
    (model,) = models(["model.tie_embeddings=true"])
    step = tmp_path / "ckpt" / tag_for(1)
    step.mkdir(parents=True)
    torch.save({"module": model.state_dict()}, step / "mp_rank_00_model_states.pt")
    save_config(load_config(None, BASE), step / "config.yaml")
    (step / COMPLETE).write_text("1\n")
    assert convert_main(["--checkpoint", str(step), "--out", str(tmp_path / "hf"),
                         "--no-tokenizer"]) == 2
    assert "the weights have no output_layer.weight, config.yaml has model.tie_embeddings=false" \
        in capsys.readouterr().err


def test_the_agreeing_config_exports(step_dir, tmp_path):
    assert convert_main(["--checkpoint", str(step_dir), "--out", str(tmp_path / "hf"),
                         "--no-tokenizer"]) == 0


@pytest.mark.parametrize("overrides", [
    [], ["model.tie_embeddings=true", "model.num_query_groups=4"],
    ["attention.head_scale.enabled=true", "attention.head_scale.trainable=true",
     "model.num_layers=3", "model.ffn_hidden_size=48"],
])
def test_shape_table_matches_a_real_megatron_model(overrides):
    (model,) = models(overrides)
    m = load_config(None, [*BASE, *overrides]).model
    real = {k: tuple(v.shape) for k, v in model.state_dict().items()
            if not k.endswith("_extra_state")}
    want = {k: shape for k, (shape, _) in expected_shapes(m).items()}
    if not any(k.endswith("head_scale") for k in real):  # a uniform scale is no tensor
        want = {k: v for k, v in want.items() if not k.endswith("head_scale")}
    assert real == want


@pytest.mark.parametrize("flags,says", [
    (["--scale-c", "inf"], "argument --scale-c: must be finite, got 'inf'"),
    (["--scale-c", "0"], "argument --scale-c: must be > 0, got 0"),
    (["--tolerance", "nan", "--verify"], "argument --tolerance: must be finite, got 'nan'"),
    (["--tag", ""], "argument --tag: is empty; name a step_NNNNNNN folder"),
])
def test_a_bad_export_flag_is_refused_before_anything_is_written(step_dir, tmp_path, capsys, flags, says):
    """--scale-c inf exported infinite head scales (exit 0), --tolerance nan failed every
    --verify, --tag "" named the checkpoint folder itself ("no COMPLETE marker")."""
    with pytest.raises(SystemExit) as e:
        convert_main(["--checkpoint", str(step_dir.parent), "--out", str(tmp_path / "hf"),
                      "--no-tokenizer", *flags])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kwargs,says", [
    ({"scale_c": float("inf")}, "scale_c must be finite and > 0, got inf"),
    ({"scale_c": float("nan")}, "scale_c must be finite and > 0, got nan"),
    ({"tag": ""}, "tag is empty"),
    # head scales handed over as a tensor get the checks of a file's
    ({"head_scales": torch.full((2, 4), float("nan"))}, "head scales must be finite and > 0"),
    ({"head_scales": torch.zeros(2, 4)}, "head scales must be finite and > 0"),
    ({"head_scales": torch.ones(4, 2)}, r"head scales have shape \(4, 2\), the model needs \[2, 4\]"),
])
def test_export_in_code_refuses_what_the_flags_refuse(step_dir, tmp_path, kwargs, says):
    from lenext_dist.convert.export import ExportError, export

    with pytest.raises(ExportError, match=says):
        export(step_dir, tmp_path / "hf", tokenizer="", **kwargs)
    assert not (tmp_path / "hf").exists()


def test_verify_of_a_non_fp32_export_is_refused_before_the_export(step_dir, tmp_path, capsys):
    """--dtype bf16 --verify wrote the export, then said --verify needs fp32."""
    assert convert_main(["--checkpoint", str(step_dir), "--out", str(tmp_path / "hf"),
                         "--no-tokenizer", "--dtype", "bf16", "--verify"]) == 2
    assert capsys.readouterr().err.startswith("error: --verify needs --dtype fp32")
    assert not (tmp_path / "hf").exists()


def test_a_bf16_export_keeps_what_training_keeps_fp32_in_fp32(tmp_path):
    """--dtype bf16 kept only the head scales fp32: KERPLE's learned r1_raw / r2_raw, fp32 in
    training (model.build.documented_fp32) and in the HF model, were rounded in the file."""
    from safetensors.torch import load_file

    from lenext_dist.convert.export import export

    kerple = ["attention.position=kerple_log"]
    (model,) = models(kerple)
    state = model.state_dict()
    for k in state:
        if ".core_attention.position." in k:
            state[k] = torch.tensor([1.2345678, 0.3141593, 2.7182818, 0.5772157])
    step = tmp_path / "ckpt" / tag_for(1)
    step.mkdir(parents=True)
    torch.save({"module": state}, step / "mp_rank_00_model_states.pt")
    save_config(load_config(None, [*BASE, *kerple]), step / "config.yaml")
    (step / COMPLETE).write_text("1\n")
    export(step, tmp_path / "hf", tokenizer="", dtype="bf16")
    w = load_file(tmp_path / "hf" / "model.safetensors")
    learned = [k for k in w if ".self_attn.position." in k]
    assert len(learned) == 4  # r1_raw, r2_raw of 2 layers
    for k in learned:
        want = state[k.replace("model.layers", "decoder.layers").replace(
            "self_attn.", "self_attention.core_attention.")]
        assert w[k].dtype == torch.float32 and torch.equal(w[k], want), k
    assert w["model.layers.0.self_attn.head_scale"].dtype == torch.float32
    assert w["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
