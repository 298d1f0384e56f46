"""Stock exports of QK-norm and partial RoPE (the pattern of test_stock_export.py: a real megatron
model written as a step folder, exported stock and custom, both loaded in one fresh process and
compared at 1x, 4x and 8x the training length, plus KV-cache decoding): Llama 4 with its
weightless QK-norm on the RoPE layers exports as Llama4ForCausalLM with use_qk_norm, a learned
RMSNorm on every layer as Qwen3ForCausalLM, partial RoPE as GlmForCausalLM; the forms that
cannot express them are refused by name."""
import json

import pytest

from lenext_dist.config import (HeadScaleConfig, LayoutConfig, QKNormConfig, RopeConfig,
                                TemperatureConfig)
from lenext_dist.convert.export import ExportError, export, verify
from test_stock_export import (L, _config_only, compare_in_fresh_process, export_cases, run_config,
                               step_folder)

LLAMA4_T = TemperatureConfig(kind="llama4", floor_scale=4, attn_scale=0.5)
CASES = {
    # Llama 4's layout as it ships: chunked RoPE layers with the L2 norm, global NoPE layers
    # under its temperature without it (k = 2 here), GQA
    "llama4_qk_norm": dict(position="rope", layers=4, layout=LayoutConfig(kind="irope", every=2),
                           chunked=6, temperature=LLAMA4_T,
                           qk_norm=QKNormConfig(kind="l2", layers="rope")),
    # every layer RoPE under the weightless norm, no chunks: Llama 4's attention alone
    "llama4_l2_every_layer": dict(position="rope", groups=None, qk_norm=QKNormConfig(kind="l2")),
    # Qwen3: RMSNorm on q and k of every layer, a uniform c folded into q_norm.weight, PI
    "qwen3_rms": dict(position="rope", scale_c=1.3, rope=RopeConfig(scaling="pi", factor=2.0),
                      qk_norm=QKNormConfig(kind="rms")),
    # GLM: half the dims rotate (interleaved pairs after the permutation), YaRN on them, learned
    # per-head scales folded into q_proj, tied embeddings
    "glm_partial": dict(position="rope", rope=RopeConfig(fraction=0.5, scaling="yarn", factor=4.0),
                        learned=True, tie=True),
}
EXPECTED = {"llama4_qk_norm": "Llama4ForCausalLM", "llama4_l2_every_layer": "Llama4ForCausalLM",
            "qwen3_rms": "Qwen3ForCausalLM", "glm_partial": "GlmForCausalLM"}


@pytest.fixture(scope="module")
def exports(tmp_path_factory, megatron_1rank):
    return export_cases(CASES, tmp_path_factory, megatron_1rank)


@pytest.fixture(scope="module")
def fresh_process(exports):
    return compare_in_fresh_process(exports)


@pytest.mark.parametrize("name", list(CASES))
def test_stock_equals_custom(exports, fresh_process, name):
    _, stock_dir, _ = exports[name]
    cfg = json.loads(open(f"{stock_dir}/config.json").read())
    assert cfg["architectures"] == [EXPECTED[name]]
    prov = cfg["lenext_provenance"]
    if name == "llama4_qk_norm":
        assert cfg["use_qk_norm"] is True and cfg["no_rope_layers"] == [1, 0, 1, 0]
        assert prov["qk_norm"]["kind"] == "l2" and prov["qk_norm"]["layers"] == "rope"
    if name == "qwen3_rms":
        assert prov["head_scales_folded_into"].endswith("q_norm.weight on the QK-normed layers")
    if name == "glm_partial":
        assert cfg["rope_parameters"]["partial_rotary_factor"] == 0.5
        assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["attention_bias"] is False
    got = fresh_process[name]
    print(name, "max |stock - custom| at 1x/4x/8x L:", got["diffs"], "cache:", got["cache"])
    assert got["class"] == EXPECTED[name] and got["no_lenext"]
    for mult, (diff, scale) in got["diffs"].items():
        assert diff <= 1e-4, f"{name} at {mult}x L: max |stock - custom| = {diff}"
        assert scale > 1.0
    assert got["cache"] <= 1e-4


@pytest.mark.parametrize("name", list(CASES))
def test_verify_stock_against_megatron(exports, name):
    """The stock folder against the megatron model of its checkpoint at 1x and 4x L."""
    import torch

    assert verify(exports[name][1]) <= 1e-4
    x = torch.randint(0, 4096, (2, 4 * L), generator=torch.Generator().manual_seed(5))
    assert verify(exports[name][1], tokens=x) <= 1e-4


def test_a_glm_export_without_a_tokenizer_keeps_its_token_ids_unset(exports, tmp_path):
    """GlmConfig puts GLM's own eos ids (151329, ...) in place of a None: ids outside this
    vocabulary of 4096 in config.json and generation_config.json. None, as the other forms."""
    export(exports["glm_partial"][0], tmp_path / "glm", fmt="stock", tokenizer="")
    for f in ("config.json", "generation_config.json"):
        c = json.loads((tmp_path / "glm" / f).read_text())
        assert [c.get(f"{k}_token_id") for k in ("bos", "eos", "pad")] == [None] * 3, (f, c)


def test_llama4_without_its_qk_norm_is_another_function(exports, tmp_path):
    """The stock Llama 4 export's use_qk_norm is the trained one: forcing it off changes the
    logits (so the flag is not decorative)."""
    import torch
    from transformers import AutoModelForCausalLM, Llama4ForCausalLM

    stock_dir = exports["llama4_qk_norm"][1]
    on = AutoModelForCausalLM.from_pretrained(stock_dir, dtype=torch.float32).eval()
    off = Llama4ForCausalLM.from_pretrained(stock_dir, dtype=torch.float32, use_qk_norm=False).eval()
    x = torch.randint(0, on.config.vocab_size, (1, 2 * L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (on(input_ids=x).logits - off(input_ids=x).logits).abs().max() > 1e-2


@pytest.mark.parametrize("attn,what", [
    (dict(position="rope", layers=4, layout=LayoutConfig(kind="nope_every", every=2),
          qk_norm=QKNormConfig(kind="rms", layers="rope")), "SmolLM3ForCausalLM has no QK-norm"),
    (dict(position="rope", layers=4, layout=LayoutConfig(kind="irope", every=2), chunked=6,
          qk_norm=QKNormConfig(kind="l2", layers="all")), "exactly its RoPE layers"),
    (dict(position="rope", layers=4, layout=LayoutConfig(kind="irope", every=2), chunked=6,
          qk_norm=QKNormConfig(kind="rms", layers="rope")), "weightless"),
    (dict(position="rope", qk_norm=QKNormConfig(kind="rms", eps=1e-3)), "rms_norm_eps"),
    (dict(position="rope", qk_norm=QKNormConfig(kind="rms"), rope=RopeConfig(fraction=0.5)),
     "Qwen3ForCausalLM rotates every dim"),
    (dict(position="rope", rope=RopeConfig(fraction=0.5), window=6), "GlmForCausalLM has no sliding"),
    (dict(position="rope", layers=4, layout=LayoutConfig(kind="nope_every", every=2),
          rope=RopeConfig(fraction=0.5)), "SmolLM3ForCausalLM rotates every dim"),
    (dict(position="rope", layers=4, layout=LayoutConfig(kind="irope", every=2), chunked=6,
          rope=RopeConfig(fraction=0.5)), "Llama4ForCausalLM rotates every dim"),
])
def test_forms_that_cannot_express_it_are_refused(tmp_path, attn, what):
    step = _config_only(tmp_path, run_config(**attn))
    with pytest.raises(ExportError, match=what) as e:
        export(step, tmp_path / "out", fmt="stock")
    assert "--format custom" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("attn,what", [
    # a scale on a layer under the weightless norm has nowhere to go
    (dict(CASES["llama4_qk_norm"], scale_c=1.3), "weightless l2 norm has no weight"),
    # per-head scales: one q_norm weight is shared by the heads
    (dict(position="rope", qk_norm=QKNormConfig(kind="rms"), head_scale=HeadScaleConfig(enabled=True)),
     "shared by the heads"),
])
def test_scales_a_qk_norm_undoes_are_refused(tmp_path, megatron_1rank, attn, what):
    learned = attn.pop("head_scale", None) is not None
    ckpt = step_folder(tmp_path, run_config(**attn, learned=learned), megatron_1rank)
    with pytest.raises(ExportError, match=what):
        export(ckpt, tmp_path / "out", fmt="stock")
    assert not (tmp_path / "out").exists()
    export(ckpt, tmp_path / "custom")  # the custom export carries them


@pytest.mark.parametrize("name", ["llama4_qk_norm", "qwen3_rms"])
def test_eval_time_scales_reach_a_qk_normed_stock_export(exports, name):
    """`lenext eval --scale-c` re-folds scales into a stock export: on a QK-normed layer into
    q_norm.weight (Qwen3) or the attention scaling (Llama 4's weightless norm), not into q_proj,
    which the norm would undo; stock and custom then agree again, and restore_scales undoes it."""
    import torch
    from transformers import AutoModelForCausalLM

    from lenext_dist.eval import adapter

    _, stock_dir, custom_dir = exports[name]
    stock = AutoModelForCausalLM.from_pretrained(stock_dir, dtype=torch.float32).eval()
    custom = AutoModelForCausalLM.from_pretrained(custom_dir, trust_remote_code=True,
                                                  dtype=torch.float32).eval()
    x = torch.randint(0, 4096, (2, 2 * L), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = stock(input_ids=x).logits
        with adapter.restore_scales(stock), adapter.restore_scales(custom):
            for model in (stock, custom):
                adapter.set_uniform_scale(model, 1.7)
            torch.testing.assert_close(adapter.head_scales(stock), adapter.head_scales(custom))
            a, b = stock(input_ids=x).logits, custom(input_ids=x).logits
            assert (a - b).abs().max() <= 1e-4 and (a - before).abs().max() > 1e-2
        torch.testing.assert_close(stock(input_ids=x).logits, before, atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="QK-norm or partial RoPE"):  # entropy: custom only
            adapter.capture_qk(stock, x, lambda *args: None)


@pytest.mark.parametrize("name", ["glm_partial", "qwen3_rms"])
def test_a_bf16_scale_sweep_on_a_stock_export_does_not_drift(exports, name):
    """A sweep re-folds ~120 scales into a bf16 stock export (q_proj, or q_norm.weight on a
    QK-normed layer): each refold scales the loaded weights, so c = 1.5 after the sweep is the
    weights of c = 1.5 set once, and restore_scales gives the loaded weights back bit for bit
    (refolding the last refold drifted the applied c by up to 0.035 and q_proj by 10%)."""
    import torch
    from transformers import AutoModelForCausalLM

    from lenext_dist.eval import adapter

    def load():
        return AutoModelForCausalLM.from_pretrained(exports[name][1], dtype=torch.bfloat16).eval()

    def weights(model):
        return {k: v.clone() for k, v in model.state_dict().items() if "q_proj" in k or "q_norm" in k}

    swept, once = load(), load()
    loaded = weights(swept)
    with adapter.restore_scales(swept):
        for c in torch.arange(0.8, 2.0, 0.01).tolist():
            adapter.set_uniform_scale(swept, c)
        adapter.set_uniform_scale(swept, 1.5)
        adapter.set_uniform_scale(once, 1.5)
        assert all(torch.equal(v, weights(once)[k]) for k, v in weights(swept).items())
    assert all(torch.equal(v, loaded[k]) for k, v in weights(swept).items())
