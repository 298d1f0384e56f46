"""The import (lenext convert --from-hf, issue 41): models that transformers builds here (random
weights, small shapes, nothing downloaded) of every architecture we export, saved as
safetensors (one file or shards), imported into a training checkpoint; the megatron model built
from that checkpoint gives transformers' logits (fp32, 1e-4) at 1x and 4x the training length;
exporting the import gives back the same weights bit for bit; what our model cannot express is
refused by name before any weight is read."""
import json
import os

import pytest
import torch

from lenext_dist.convert.export import export
from lenext_dist.convert.export import megatron_reference
from lenext_dist.convert.hf_import import ImportRefused, import_hf
from lenext_dist.convert.outdir import OutputError

os.environ.setdefault("DS_ACCELERATOR", "cpu")
L = 16  # the training length of the tiny models; 4x = 64 tokens
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=L,
              rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)


def _llama(**kw):
    from transformers import LlamaConfig
    return LlamaConfig(**{**COMMON, **kw})


def _mistral(**kw):
    from transformers import MistralConfig
    return MistralConfig(**{**COMMON, "head_dim": 16, **kw})


def _smollm3(**kw):
    from transformers import SmolLM3Config
    return SmolLM3Config(**{**COMMON, **kw})


def _qwen3(**kw):
    from transformers import Qwen3Config
    return Qwen3Config(**{**COMMON, "head_dim": 16, "attention_bias": False, **kw})


def _llama4(**kw):
    from transformers import Llama4TextConfig
    c = {**COMMON, "head_dim": 16, "intermediate_size_mlp": 96, "moe_layers": [],
         "use_qk_norm": False, "no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": 8,
         "attn_temperature_tuning": True, "floor_scale": 4, "attn_scale": 0.5,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **kw}
    return Llama4TextConfig(**c)


ROPE_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": L, "beta_fast": 32.0, "beta_slow": 1.0,
             "truncate": True}
CASES = {
    "llama": lambda: _llama(),
    "llama-pi": lambda: _llama(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                "factor": 2.0}, max_position_embeddings=2 * L),
    "llama-yarn": lambda: _llama(rope_parameters=ROPE_YARN),
    "llama-tied-mha": lambda: _llama(tie_word_embeddings=True, num_key_value_heads=4),
    "mistral-window": lambda: _mistral(sliding_window=8),
    "smollm3-nope": lambda: _smollm3(no_rope_layers=[0, 0, 0, 0]),
    "smollm3-interleaved-window": lambda: _smollm3(
        no_rope_layers=[1, 1, 1, 0], use_sliding_window=True, sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "llama4-irope": lambda: _llama4(),
    "llama4-qk-norm": lambda: _llama4(use_qk_norm=True),  # its real layout: L2 on the RoPE layers
    # temperature tuning on (transformers' default) scales NoPE layers only: here none
    "llama4-all-rope": lambda: _llama4(no_rope_layers=[1, 1, 1, 1]),
    "qwen3-qk-norm": lambda: _qwen3(),
}


def make_hf(folder, config, seed=0, shard=None):
    """A transformers model of `config` with random weights (norms away from 1, larger
    projections: position-dependent attention), saved as safetensors."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config.architectures = None
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.rand_like(p) * 0.2) if p.dim() == 1 else p.mul_(4.0)
    model.save_pretrained(folder, max_shard_size=shard or "2GB")
    return model


def logits_equal(hf, step_dir, lengths=(L, 4 * L)):
    ref = megatron_reference(step_dir)
    for n in lengths:
        tokens = torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(n))
        pos = torch.arange(n).expand_as(tokens)
        with torch.no_grad():
            a = ref(tokens, pos, attention_mask=None).float()
            b = hf(input_ids=tokens, use_cache=False).logits.float()
        assert (a - b).abs().max().item() < 1e-4, (n, (a - b).abs().max().item())


def safetensors_state(folder):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_equals_transformers_and_round_trips(case, tmp_path, megatron_1rank):
    hf_dir, run = tmp_path / "hf", tmp_path / "run"
    hf = make_hf(hf_dir, CASES[case](), shard="60KB" if case == "llama" else None)
    if case == "llama":
        assert (hf_dir / "model.safetensors.index.json").is_file()  # sharded: read shard by shard
    info = import_hf(hf_dir, run)
    step = run / "checkpoints" / "step_0000000"
    assert (step / "COMPLETE").is_file() and (run / "checkpoints" / "latest").is_file()
    logits_equal(hf, step)
    assert info["architecture"] == type(hf).__name__

    back = tmp_path / "back"
    export(run / "checkpoints", back, tokenizer="", fmt="stock")
    assert json.loads((back / "config.json").read_text())["architectures"] == [type(hf).__name__]
    a, b = safetensors_state(hf_dir), safetensors_state(back)
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def test_custom_export_imports_with_its_head_scales(tmp_path, megatron_1rank):
    """Our custom export (learned per-head scales, a window): imported with the scales folded
    into q_proj equals its logits; a uniform c comes back as attention.scale_c, bit for bit. The
    kernel choices an older export carried in attention_options (sdpa_backends: the GPU kernels
    of the machine it trained on) are left behind."""
    from transformers import AutoModelForCausalLM

    from lenext_dist.checkpoint.layout import run_config

    hf_dir = tmp_path / "hf"
    make_hf(hf_dir, _smollm3(no_rope_layers=[0, 0, 0, 0], use_sliding_window=True,
                             sliding_window=8, layer_types=["sliding_attention"] * 4))
    import_hf(hf_dir, tmp_path / "run")
    scales = 0.8 + torch.rand(4, 4, generator=torch.Generator().manual_seed(3))
    for name, kw in (("learned", {"head_scales": scales}), ("uniform", {"scale_c": 1.25})):
        custom = tmp_path / f"custom-{name}"
        export(tmp_path / "run" / "checkpoints", custom, tokenizer="", **kw)
        c = json.loads((custom / "config.json").read_text())
        c["attention_options"].update(impl="sdpa_mask", chunk_size=64, sdpa_backends=["cudnn", "flash"])
        (custom / "config.json").write_text(json.dumps(c))
        import_hf(custom, tmp_path / f"run-{name}")
        a = run_config(tmp_path / f"run-{name}" / "checkpoints" / "step_0000000").attention
        assert (a.impl, a.chunk_size, a.sdpa_backends) == ("auto", 256, [])
        hf = AutoModelForCausalLM.from_pretrained(custom, trust_remote_code=True,
                                                  dtype=torch.float32).eval()
        logits_equal(hf, tmp_path / f"run-{name}" / "checkpoints" / "step_0000000")
    export(tmp_path / "run-uniform" / "checkpoints", tmp_path / "back", tokenizer="")
    a, b = safetensors_state(tmp_path / "custom-uniform"), safetensors_state(tmp_path / "back")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_custom_export_with_qk_norm_folds_its_scales_into_q_norm_or_refuses(tmp_path, megatron_1rank):
    """On a QK-normed layer the norm undoes a scaled q_proj: one scale per layer goes into
    q_norm.weight (the logits equal the custom export's), per-head scales there are refused by
    name (they were folded into q_proj and lost, the logits 1.2 apart)."""
    from transformers import AutoModelForCausalLM

    make_hf(tmp_path / "hf", _qwen3())
    import_hf(tmp_path / "hf", tmp_path / "run")
    per_layer = torch.tensor([0.7, 1.3, 1.0, 1.6]).view(4, 1).expand(4, 4)
    custom = tmp_path / "custom"
    export(tmp_path / "run" / "checkpoints", custom, tokenizer="", head_scales=per_layer)
    import_hf(custom, tmp_path / "run-back")
    hf = AutoModelForCausalLM.from_pretrained(custom, trust_remote_code=True, dtype=torch.float32).eval()
    logits_equal(hf, tmp_path / "run-back" / "checkpoints" / "step_0000000")

    per_head = 0.8 + torch.rand(4, 4, generator=torch.Generator().manual_seed(3))
    export(tmp_path / "run" / "checkpoints", tmp_path / "custom-heads", tokenizer="", head_scales=per_head)
    with pytest.raises(ImportRefused, match=r"layer 0's head scales .* one q_norm weight shared by the heads"):
        import_hf(tmp_path / "custom-heads", tmp_path / "run-heads")
    assert not (tmp_path / "run-heads").exists()

    # a q_norm weight lost from the export (the scale of its layer goes there): named, no KeyError
    from safetensors.torch import load_file, save_file
    state = load_file(custom / "model.safetensors")
    save_file({k: v for k, v in state.items() if k != "model.layers.1.self_attn.q_norm.weight"},
              custom / "model.safetensors")
    with pytest.raises(ImportRefused, match=r"no weight for model.layers.1.self_attn.q_norm.weight") as e:
        import_hf(custom, tmp_path / "run-lost")
    assert "\n" not in str(e.value) and not (tmp_path / "run-lost").exists()


SSMAX = ["attention.temperature.kind=ssmax", "attention.head_scale.enabled=true"]


def test_custom_export_of_ssmax_imports_with_its_scales_folded(tmp_path, megatron_1rank):
    """SSMax's learned m_h are the head scales of the custom export, which leaves head_scale out
    of attention_options (its import was refused: ssmax needs head_scale): imported with
    head_scale enabled at m_h = 1 and the scales (per head, or a uniform c) folded into q_proj,
    it equals the export's logits."""
    from transformers import AutoModelForCausalLM

    from lenext_dist.checkpoint.layout import run_config

    make_hf(tmp_path / "hf", _smollm3(no_rope_layers=[1, 0, 1, 0]))
    import_hf(tmp_path / "hf", tmp_path / "run", overrides=SSMAX)
    scales = 0.8 + torch.rand(4, 4, generator=torch.Generator().manual_seed(3))
    for name, kw in (("learned", {"head_scales": scales}), ("uniform", {"scale_c": 1.25})):
        custom = tmp_path / f"custom-{name}"
        export(tmp_path / "run" / "checkpoints", custom, tokenizer="", **kw)
        import_hf(custom, tmp_path / f"run-{name}")
        step = tmp_path / f"run-{name}" / "checkpoints" / "step_0000000"
        cfg = run_config(step)
        assert cfg.attention.temperature.kind == "ssmax" and cfg.attention.head_scale.enabled
        assert cfg.head_scale_init == 1.0
        hf = AutoModelForCausalLM.from_pretrained(custom, trust_remote_code=True,
                                                  dtype=torch.float32).eval()
        logits_equal(hf, step)


LACKING = {  # a config.json without a key transformers has a default for, or derives
    "mistral-no-window": (lambda: _mistral(sliding_window=8), "sliding_window", {"windows": [4096] * 4}),
    "smollm3-tied-no-tie-key": (lambda: _smollm3(tie_word_embeddings=True), "tie_word_embeddings", {}),
    "smollm3-window-no-layer-types": (lambda: _smollm3(no_rope_layers=[1, 1, 1, 0], use_sliding_window=True,
                                                       sliding_window=8), "layer_types",
                                      {"windows": [None, None, None, 8]}),
    "yarn-no-original-length": (lambda: _llama(rope_parameters=ROPE_YARN), "original_max_position_embeddings",
                                {"train_length": L}),
}


@pytest.mark.parametrize("case", sorted(LACKING))
def test_a_config_lacking_a_key_imports_as_transformers_reads_it(case, tmp_path, megatron_1rank):
    """What config.json leaves out takes transformers' default, or what it derives (Mistral's
    window of 4096, SmolLM3's tie and its windowed NoPE layers, YaRN's original length =
    max_position_embeddings), not a guess of ours: the import equals transformers' model of the
    same folder."""
    from transformers import AutoModelForCausalLM

    make, key, expect = LACKING[case]
    make_hf(tmp_path / "hf", make())
    c = json.loads((tmp_path / "hf" / "config.json").read_text())
    for d in (c, c.get("rope_parameters") or {}):
        d.pop(key, None)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(c))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    info = import_hf(tmp_path / "hf", tmp_path / "run")
    assert {k: info[k] for k in expect} == expect
    logits_equal(hf, tmp_path / "run" / "checkpoints" / "step_0000000")


REFUSED = {
    "moe": (lambda: _llama4(moe_layers=[1]), "moe_layers"),
    # YaRN's factor in cos/sin: Llama 4's QK-norm after the rotation divides it out, ours keeps it
    "llama4-yarn": (lambda: _llama4(rope_parameters=ROPE_YARN), "RoPE scaling 'yarn'"),
    # transformers' SDPA windows these layers (its mask reads sliding_window), its flash path not
    "smollm3-window-off": (lambda: _smollm3(no_rope_layers=[1, 1, 1, 0], sliding_window=8,
                                            layer_types=["sliding_attention"] * 3 + ["full_attention"]),
                           "use_sliding_window is false"),
    "qwen3-window": (lambda: _qwen3(use_sliding_window=True, sliding_window=8), "use_sliding_window"),
    "bias": (lambda: _llama(attention_bias=True), "attention_bias"),
    "mlp-bias": (lambda: _llama(mlp_bias=True), "mlp_bias"),
    "head-dim": (lambda: _mistral(head_dim=32), "head_dim"),
    "rope-llama3": (lambda: _llama(rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": L}), "rope_type 'llama3'"),
    "rope-yarn-mscale": (lambda: _llama(rope_parameters={**ROPE_YARN, "attention_factor": 2.0}),
                         "attention_factor"),
    "partial-rotary": (lambda: _llama(partial_rotary_factor=0.5), "partial rotary"),
    "activation": (lambda: _llama(hidden_act="gelu"), "hidden_act"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_by_name_before_any_weight(case, tmp_path):
    make_cfg, named = REFUSED[case]
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    cfg = make_cfg()
    cfg.architectures = [{"Llama4TextConfig": "Llama4ForCausalLM"}.get(
        type(cfg).__name__, type(cfg).__name__.replace("Config", "ForCausalLM"))]
    cfg.save_pretrained(hf_dir)  # config only: a weight read would fail another way
    with pytest.raises(ImportRefused) as e:
        import_hf(hf_dir, tmp_path / "run")
    msg = str(e.value)
    assert named in msg and "\n" not in msg and not (tmp_path / "run").exists(), msg


@pytest.mark.parametrize("field,value", [("num_key_value_heads", 8.0), ("hidden_size", "2048")])
def test_a_wrongly_typed_field_is_refused_in_one_line(tmp_path, field, value):
    """transformers' config classes are strict dataclasses: a float where an int belongs, or a
    string, raised huggingface_hub's StrictDataclassFieldValidationError (a traceback)."""
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    cfg = _llama()
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(hf_dir)
    c = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**c, field: value}))
    with pytest.raises(ImportRefused, match=rf"config.json: cannot import: transformers cannot read "
                                            rf"it .*'{field}' .*; nothing written$") as e:
        import_hf(hf_dir, tmp_path / "run")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_refuses_pickles_unknown_architectures_and_unknown_weights(tmp_path):
    hf_dir = tmp_path / "hf"
    make_hf(hf_dir, _llama())
    st = next(hf_dir.glob("*.safetensors"))
    st.rename(hf_dir / "pytorch_model.bin")
    with pytest.raises(ImportRefused, match="pytorch_model.bin is a pickle"):
        import_hf(hf_dir, tmp_path / "run")
    cfg = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(ImportRefused, match="architecture 'Qwen2ForCausalLM'"):
        import_hf(hf_dir, tmp_path / "run")
    # weights the config does not announce (a q_norm): named by the weight, nothing written
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file
    (hf_dir / "pytorch_model.bin").rename(st)
    state = load_file(st)
    # what older transformers saved (a RoPE buffer), and a partial rotary factor of 1 in
    # rope_parameters: nothing to refuse
    save_file({**state, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}, st)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
    (hf_dir / "config.json").write_text(json.dumps({**cfg, "rope_parameters": rope}))
    import_hf(hf_dir, tmp_path / "buffer")
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    save_file({**state, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, st)
    with pytest.raises(ImportRefused, match="q_norm.weight: qk-norm"):
        import_hf(hf_dir, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_partial_or_mismatched_folder_is_named_before_anything_is_written(tmp_path, megatron_1rank):
    """A shard missing or short of its tensors (a partial download), an untied model without
    lm_head, weights of another shape than config.json's: one line naming it, nothing written
    (they were a write error blamed on the disk, a traceback, or an import that failed only when
    training started); an existing --out is refused without offering an --overwrite it lacks."""
    from safetensors.torch import load_file, save_file

    def refused(folder, pattern, out="run"):
        with pytest.raises(ImportRefused, match=pattern) as e:
            import_hf(folder, tmp_path / out)
        assert "\n" not in str(e.value) and not (tmp_path / out).exists()

    sharded = tmp_path / "sharded"
    make_hf(sharded, _llama(), shard="60KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    state = load_file(shards[1])
    save_file(dict(list(state.items())[1:]), shards[1])
    refused(sharded, rf"{shards[1].name}: cannot import: lacks {list(state)[0]} \(model.safetensors.index.json "
                     r"puts them there\): download it again")
    shards[1].unlink()
    refused(sharded, rf"{shards[1].name}: cannot import: missing \(model.safetensors.index.json lists it\)")

    one = tmp_path / "one"
    make_hf(one, _llama())
    st, cfg = one / "model.safetensors", json.loads((one / "config.json").read_text())
    state = load_file(st)
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, st)
    refused(one, r"no weight for output_layer.weight \(untied embeddings need lm_head.weight\)")
    save_file(state, st)
    (one / "config.json").write_text(json.dumps({**cfg, "vocab_size": 300}))
    refused(one, r"embedding.word_embeddings.weight has shape \(256, 64\), but config.json gives \(300, 64\)")

    # Qwen3 without its q_norm / k_norm (the config announces them): it trained from norms of 1
    qwen = tmp_path / "qwen"
    make_hf(qwen, _qwen3())
    state = load_file(qwen / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.endswith(("q_norm.weight", "k_norm.weight"))},
              qwen / "model.safetensors")
    refused(qwen, r"no weight for model.layers.0.self_attn.q_norm.weight \(and 7 more\)")

    (one / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="an import writes a new folder: choose another path$"):
        import_hf(one, tmp_path / "taken")
    assert os.listdir(tmp_path / "taken") == ["notes.txt"]


def test_a_tied_model_saved_with_its_lm_head_imports_once_the_two_are_one(tmp_path, megatron_1rank):
    """A tied model whose safetensors hold lm_head too (some savers write both): the same tensor
    twice imports as tied (it was refused); an lm_head that differs is a contradiction, refused."""
    from safetensors.torch import load_file, save_file

    hf = make_hf(tmp_path / "hf", CASES["llama-tied-mha"]())
    st = tmp_path / "hf" / "model.safetensors"
    state = load_file(st)
    save_file({**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()}, st)
    import_hf(tmp_path / "hf", tmp_path / "run")
    logits_equal(hf, tmp_path / "run" / "checkpoints" / "step_0000000", lengths=(L,))
    save_file({**state, "lm_head.weight": state["model.embed_tokens.weight"] + 1}, st)
    with pytest.raises(ImportRefused, match="lm_head.weight differs from the embeddings, with tie_word_embeddings"):
        import_hf(tmp_path / "hf", tmp_path / "run2")


def test_remote_code_model_needs_an_attention_override(tmp_path, megatron_1rank):
    """A Llama-shaped checkpoint whose own code (auto_map) runs it without RoPE, as a NoPE
    TinyLlama could be published: refused as stock Llama; with attention.position=nope it is
    imported as NoPE (equal to a SmolLM3 all-NoPE model of the same weights)."""
    hf_dir = tmp_path / "hf"
    make_hf(hf_dir, _llama())
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_nope.NoPELlamaForCausalLM"}
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ImportRefused, match="auto_map.*attention.position=nope"):
        import_hf(hf_dir, tmp_path / "run")
    import_hf(hf_dir, tmp_path / "run", overrides=["attention.position=nope"])
    nope = make_hf(tmp_path / "smol", _smollm3(no_rope_layers=[0, 0, 0, 0]))
    from safetensors.torch import load_file
    with torch.no_grad():
        nope.load_state_dict(load_file(hf_dir / "model.safetensors"))
    logits_equal(nope, tmp_path / "run" / "checkpoints" / "step_0000000")


def test_legacy_rope_scaling_key_and_single_reads_of_shards(tmp_path, megatron_1rank):
    """A config.json of transformers < 5 (`rope_scaling` {type: linear}) is read, not ignored; a
    sharded folder's tensors are each read once (the megatron state is the only copy built)."""
    from lenext_dist.convert.hf_weights import LazyWeights

    hf_dir = tmp_path / "hf"
    hf = make_hf(hf_dir, CASES["llama-pi"](), shard="60KB")
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0})
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    reads = []
    get = LazyWeights.__getitem__
    LazyWeights.__getitem__ = lambda self, k: reads.append(k) or get(self, k)
    try:
        info = import_hf(hf_dir, tmp_path / "run")
    finally:
        LazyWeights.__getitem__ = get
    assert info["rope"] == "pi"
    logits_equal(hf, tmp_path / "run" / "checkpoints" / "step_0000000")
    assert sorted(reads) == sorted(safetensors_state(hf_dir))  # every tensor, once


def test_longer_seq_length_override_keeps_the_pretrained_length(tmp_path, megatron_1rank):
    """Continued pretraining at 4x the length (model.seq_length=64) keeps L = 16, which YaRN
    reads: the imported model still equals transformers'."""
    from lenext_dist.checkpoint.layout import run_config

    hf = make_hf(tmp_path / "hf", CASES["llama-yarn"]())
    import_hf(tmp_path / "hf", tmp_path / "run", overrides=[f"model.seq_length={4 * L}"])
    step = tmp_path / "run" / "checkpoints" / "step_0000000"
    m = run_config(step).model
    assert (m.seq_length, m.train_length) == (4 * L, L)
    logits_equal(hf, step)


def test_export_options_with_from_hf_are_refused_in_one_line(tmp_path, capsys):
    """Every option of the parser's export group (its one declaration) is refused with --from-hf
    when set to anything but its default; nothing is read or written."""
    from lenext_dist.convert.__main__ import main

    rc = main(["--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"), "--format", "stock",
               "--scale-c", "2", "--verify", "--tolerance", "1e-3", "--dtype", "fp32"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "(--format stock, --scale-c 2.0, --verify, --tolerance 0.001) do not go with --from-hf" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("make, named", [(_smollm3, "LlamaForCausalLM"), (_mistral, "LlamaForCausalLM"),
                                         (_llama, "MistralForCausalLM")])
def test_architectures_disagreeing_with_model_type_is_refused(tmp_path, make, named):
    """transformers' AutoModelForCausalLM builds the class of model_type; the import read the
    architectures entry: a SmolLM3 folder naming Llama was imported as Llama (RoPE on its NoPE
    layers), a llama one naming Mistral with Mistral's window of 4096."""
    hf_dir = tmp_path / "hf"
    cfg = make()
    cfg.architectures = [named]
    cfg.save_pretrained(hf_dir)
    with pytest.raises(ImportRefused, match=rf"hf/config.json: cannot import: architecture '{named}' "
                                            rf"with model_type '{cfg.model_type}', from which") as e:
        import_hf(hf_dir, tmp_path / "run")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_a_folder_without_architectures_is_read_by_its_model_type(tmp_path, megatron_1rank):
    """A Mistral folder without `architectures` (transformers needs only model_type): imported
    with Mistral's window, as transformers runs it (it was refused as architecture 'mistral')."""
    from transformers import AutoModelForCausalLM

    hf_dir = tmp_path / "hf"
    make_hf(hf_dir, _mistral(sliding_window=8))
    c = json.loads((hf_dir / "config.json").read_text())
    del c["architectures"]
    (hf_dir / "config.json").write_text(json.dumps(c))
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    info = import_hf(hf_dir, tmp_path / "run")
    assert (info["architecture"], info["windows"]) == ("MistralForCausalLM", [8] * 4)
    logits_equal(hf, tmp_path / "run" / "checkpoints" / "step_0000000")


def test_shard_names_and_tokenizer_links_outside_the_folder_are_refused(tmp_path):
    """weight_map's "../x" or "/abs/x" read weights from outside the folder; a tokenizer file
    linking out (tokenizer.json -> ~/.cache/huggingface/token) copied a secret into the run. The
    hub cache's own links (snapshots/<rev>/file -> ../../blobs/<hash>) still import."""
    import shutil

    def refused(folder, pattern):
        with pytest.raises(ImportRefused, match=pattern) as e:
            import_hf(folder, tmp_path / "run")
        assert "\n" not in str(e.value) and not (tmp_path / "run").exists()

    sharded = tmp_path / "sharded"
    make_hf(sharded, _llama(), shard="60KB")
    index = sharded / "model.safetensors.index.json"
    idx = json.loads(index.read_text())
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shutil.move(shard, tmp_path / shard.name)  # a valid shard, outside the folder
    for outside in (f"../{shard.name}", str(tmp_path / shard.name)):
        index.write_text(json.dumps({**idx, "weight_map": {k: outside if v == shard.name else v
                                                           for k, v in idx["weight_map"].items()}}))
        refused(sharded, rf"model.safetensors.index.json: cannot import: weight_map names "
                         rf"'{outside}', not a file of this folder")

    repo = tmp_path / "models--org--tiny"
    snap = repo / "snapshots" / "abc123"
    make_hf(snap, _llama())
    (repo / "blobs").mkdir()
    (repo / "blobs" / "f00d").write_text('{"add_bos_token": true}')
    (snap / "tokenizer_config.json").symlink_to("../../blobs/f00d")
    secret = tmp_path / "token"
    secret.write_text("hf_secret")
    (snap / "tokenizer.json").symlink_to(secret)
    refused(snap, r"tokenizer.json: cannot import: links to .*token, outside .*abc123: put the file itself there")
    (snap / "tokenizer.json").unlink()
    info = import_hf(snap, tmp_path / "run")
    assert info["tokenizer"] == ["tokenizer_config.json"]


@pytest.fixture(scope="module")
def custom(tmp_path_factory, megatron_1rank):
    """A custom export (model_type lenext) of a tiny SmolLM3 import, with uniform head scales."""
    tmp = tmp_path_factory.mktemp("custom")
    make_hf(tmp / "hf", _smollm3(no_rope_layers=[1, 0, 1, 0]))
    import_hf(tmp / "hf", tmp / "run")
    export(tmp / "run" / "checkpoints", tmp / "custom", tokenizer="", scale_c=1.25)
    return tmp / "custom"


def _edited(custom, to, config=None, drop=()):
    """A copy of the export `custom` at `to`, config.json updated with `config`, without the
    weights `drop`."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(custom, to)
    c = json.loads((to / "config.json").read_text())
    (to / "config.json").write_text(json.dumps({**c, **(config or {})}))
    state = load_file(to / "model.safetensors")
    save_file({k: v for k, v in state.items() if k not in drop}, to / "model.safetensors")
    return to


SCALES = [f"model.layers.{i}.self_attn.head_scale" for i in range(4)]


def test_a_custom_export_without_head_scales_imports_with_its_scale_c(custom, tmp_path):
    """Without head_scale tensors the HF model runs every head at config.json's scale_c, which
    the import never read (scale 1); some layers' scales only: refused, as is a newer format."""
    from transformers import AutoModelForCausalLM

    from lenext_dist.checkpoint.layout import run_config

    folder = _edited(custom, tmp_path / "none", {"scale_c": 1.5}, drop=SCALES)
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    import_hf(folder, tmp_path / "run")
    step = tmp_path / "run" / "checkpoints" / "step_0000000"
    assert run_config(step).attention.scale_c == 1.5
    logits_equal(hf, step)
    for name, config, drop, says in (
            ("some", None, SCALES[1:2], r"no model.layers.1.self_attn.head_scale \(3 of 4 layers have"),
            ("newer", {"lenext_format": 2}, (), r"config.json: cannot import: LenextForCausalLM with "
                                                r"lenext_format 2, newer than this lenext_dist reads \(1\)")):
        with pytest.raises(ImportRefused, match=says) as e:
            import_hf(_edited(custom, tmp_path / name, config, drop), tmp_path / f"run-{name}")
        assert "\n" not in str(e.value) and not (tmp_path / f"run-{name}").exists()


def test_a_bad_value_of_config_json_names_config_json(custom, tmp_path):
    """The run config is checked from a staged copy (.run.partial/config.yaml), deleted as the
    error leaves: the message named that file, not the folder's config.json."""
    from lenext_dist.config import ConfigError

    folder = _edited(custom, tmp_path / "bad")
    c = json.loads((folder / "config.json").read_text())
    c["attention_options"]["window"] = -4
    (folder / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError) as e:
        import_hf(folder, tmp_path / "run")
    assert str(e.value).startswith(f"{folder / 'config.json'}: attention.window"), str(e.value)
    assert ".partial" not in str(e.value) and not (tmp_path / "run").exists()


def test_a_multimodal_llama4_folder_is_told_to_import_its_text_model(tmp_path):
    hf_dir = tmp_path / "hf"
    make_hf(hf_dir, _llama())
    cfg = json.loads((hf_dir / "config.json").read_text())
    for extra in ({"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"]},
                  {"model_type": "llama4", "architectures": ["Llama4ForCausalLM"]}):
        (hf_dir / "config.json").write_text(json.dumps({**cfg, **extra}))
        with pytest.raises(ImportRefused, match="a multimodal model .*: import its text model "
                                                r"\(model_type llama4_text"):
            import_hf(hf_dir, tmp_path / "run")
