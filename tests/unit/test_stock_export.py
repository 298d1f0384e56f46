"""Stock exports (lenext_dist.convert --format stock, issue 19): a real megatron model built in
process, written as a step folder (config.yaml + DeepSpeed-layout module file + COMPLETE), then
exported both ways. The stock folder loads with plain `AutoModelForCausalLM` in a fresh process
(no trust_remote_code, no lenext module imported) and gives the custom export's logits at 1x, 4x
and 8x the training length (attention.layout's interleaved NoPE/RoPE too, as SmolLM3); `--verify`
compares it with megatron; its tokenizer.json encodes as SentencePiece; `lenext eval` gives the
same numbers on both; every variant (and layout) without a stock form is refused by name."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch

from lenext_dist.attention import POSITIONS
from lenext_dist.attention.rope import SCALINGS
from lenext_dist.config import (AttentionConfig, DataConfig, HeadScaleConfig, LayoutConfig,
                                ModelConfig, RopeConfig, RunConfig, TemperatureConfig, save_config)
from lenext_dist.convert.export import ExportError, export, verify
from lenext_dist.convert.stock import ROPE_PARAMETERS, STOCK_FORMS
from lenext_dist.convert.tokenizer_json import PROBE_TEXTS
from tiny_models import REPO, SAMPLE_TOKENIZER

os.environ.setdefault("DS_ACCELERATOR", "cpu")
L = 16  # training length of the tiny models: 8x = 128 tokens




def run_config(position="nope", *, learned=False, tie=False, groups=2, layers=2, **attn):
    return RunConfig(
        model=ModelConfig(num_layers=layers, hidden_size=64, num_attention_heads=4,
                          num_query_groups=groups, ffn_hidden_size=96, vocab_size=4096,
                          seq_length=L, tie_embeddings=tie),
        attention=AttentionConfig(position=position, head_scale=HeadScaleConfig(enabled=learned),
                                  **attn),
        data=DataConfig(tokenizer=SAMPLE_TOKENIZER))


def step_folder(root, cfg, init_megatron, seed=7):
    """A complete step folder as lenext_dist.train writes it (ZeRO-0 layout) holding a real
    megatron GPTModel with perturbed weights and, when the run learned head scales, distinct
    scales per layer and head (0.8 .. 1.9)."""
    from lenext_dist.model import build_model

    init_megatron(seed)
    meg = build_model(cfg, device="cpu").eval()
    with torch.no_grad():
        for name, p in meg.named_parameters():
            if name.endswith("head_scale"):
                p.copy_(0.8 + 1.1 * torch.rand(p.numel()))
            else:  # norms away from 1, larger projections: position-dependent attention
                p.add_(torch.rand_like(p) * 0.2) if p.dim() == 1 else p.mul_(4.0)
    step = root / "checkpoints" / "step_0000001"
    step.mkdir(parents=True)
    state = {k: v for k, v in meg.state_dict().items() if isinstance(v, torch.Tensor)}
    torch.save({"module": state}, step / "mp_rank_00_model_states.pt")
    save_config(cfg, step / "config.yaml")
    (step / "COMPLETE").write_text("1\n")
    (root / "checkpoints" / "latest").write_text("step_0000001\n")
    return root / "checkpoints"


# ------------------------------------------------------------------ RoPE scalings = transformers


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("dim,factor,length", [(16, 4.0, 16), (64, 8.0, 2048), (64, 2.0, 128)])
def test_rope_scalings_equal_transformers(scaling, dim, factor, length):
    """Every rope scaling of ours either maps to rope_parameters whose inv_freq and cos/sin
    multiplier transformers computes identically, or is absent from ROPE_PARAMETERS (refused)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if scaling not in ROPE_PARAMETERS:
        cfg = run_config("rope", rope=RopeConfig(scaling=scaling, factor=factor))
        from lenext_dist.convert.stock import refusal

        assert scaling in refusal(cfg)
        return
    r = RopeConfig(base=10000.0, scaling=scaling, factor=factor)
    params = ROPE_PARAMETERS[scaling](r, dim, length)
    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=dim * 2, num_attention_heads=2, head_dim=dim,
                                          max_position_embeddings=int(length * factor),
                                          rope_parameters=params))
    ours, mscale = SCALINGS[scaling](dim, 10000.0, factor, length)
    assert torch.equal(hf.inv_freq, ours) and hf.attention_scaling == mscale


# ------------------------------------------------------------------ logits: stock = custom = megatron

CASES = {
    "nope_headscale": dict(position="nope", learned=True),
    # trained on cuDNN's SDPA kernels: a kernel choice, no obstacle to a stock form
    "nope_window": dict(position="nope", window=6, scale_c=1.3, sdpa_backends=["cudnn", "flash"]),
    "rope_yarn_tied": dict(position="rope", rope=RopeConfig(scaling="yarn", factor=8.0), tie=True,
                           groups=None, scale_c=1.2),
    "rope_pi_window": dict(position="rope", rope=RopeConfig(scaling="pi", factor=4.0), window=6),
    # attention.layout (issue: per-layer layouts): NoPE every 2nd layer of 4, uniform c folded
    "interleaved": dict(position="rope", layers=4, layout=LayoutConfig(kind="nope_every", every=2),
                        scale_c=1.3),
    # SmolLM3's own pattern with YaRN, a window on every layer and learned head scales
    "smollm3_yarn_window": dict(position="rope", layers=4, layout=LayoutConfig(kind="smollm3"),
                                rope=RopeConfig(scaling="yarn", factor=4.0), window=6,
                                learned=True),
    # Cohere Command R7B's pattern (k = 2 here): local RoPE layers under the window, global NoPE
    "local_global": dict(position="rope", layers=4, layout=LayoutConfig(kind="local_global", every=2),
                         window=6, rope=RopeConfig(scaling="pi", factor=2.0)),
    # explicit per-layer spans: a windowed NoPE layer and a global RoPE one (SmolLM3 layer_types)
    "explicit_global_layers": dict(position="rope", layers=4, window=6, layout=LayoutConfig(
        kind="explicit", layers=["rope", "nope", "rope", "nope"], global_layers=[2, 3])),
    # a uniform temperature c on the NoPE layers only, folded into their q_proj rows
    "interleaved_t_uniform": dict(position="rope", layers=4, layout=LayoutConfig(kind="nope_every",
                                  every=2), temperature=TemperatureConfig(kind="uniform", c=1.4)),
    # Llama 4's iRoPE (k = 2 here): chunked RoPE layers (C = 6), global NoPE layers under its
    # temperature (floor_scale 4: it steps 5 times within 8x L), GQA, a uniform c folded in
    "irope_llama4": dict(position="rope", layers=4, layout=LayoutConfig(kind="irope", every=2),
                         chunked=6, scale_c=1.2, temperature=TemperatureConfig(
                             kind="llama4", floor_scale=4, attn_scale=0.5)),
}
EXPECTED = {"nope_headscale": "SmolLM3ForCausalLM", "nope_window": "SmolLM3ForCausalLM",
            "rope_yarn_tied": "LlamaForCausalLM", "rope_pi_window": "MistralForCausalLM",
            "interleaved": "SmolLM3ForCausalLM", "smollm3_yarn_window": "SmolLM3ForCausalLM",
            "local_global": "SmolLM3ForCausalLM", "interleaved_t_uniform": "SmolLM3ForCausalLM",
            "irope_llama4": "Llama4ForCausalLM", "explicit_global_layers": "SmolLM3ForCausalLM"}
NO_ROPE_LAYERS = {"nope_headscale": [0, 0], "nope_window": [0, 0], "interleaved": [1, 0, 1, 0],
                  "smollm3_yarn_window": [1, 1, 1, 0], "local_global": [1, 0, 1, 0],
                  "interleaved_t_uniform": [1, 0, 1, 0], "explicit_global_layers": [1, 0, 1, 0]}
"""SmolLM3's no_rope_layers: 1 = a RoPE layer, 0 = a NoPE layer."""
LAYER_TYPES = {"local_global": ["sliding_attention", "full_attention"] * 2,
               "explicit_global_layers": ["sliding_attention", "full_attention", "full_attention",
                                          "sliding_attention"]}
"""SmolLM3's layer_types where the window is not on every layer (else all sliding, or all full)."""

FRESH = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
L, pairs, out = int(sys.argv[1]), json.loads(sys.argv[2]), {}
for name, (stock_dir, custom_dir) in pairs.items():
    stock = AutoModelForCausalLM.from_pretrained(stock_dir, dtype=torch.float32).eval()
    # no remote code ran for the stock loads: neither our package nor transformers' dynamic modules
    clean = not any(m.startswith(("lenext_dist", "transformers_modules")) for m in sys.modules)
    out[name] = {"class": type(stock).__name__, "no_lenext": clean, "stock": stock}
for name, (stock_dir, custom_dir) in pairs.items():
    stock = out[name].pop("stock")
    custom = AutoModelForCausalLM.from_pretrained(custom_dir, trust_remote_code=True,
                                                  dtype=torch.float32).eval()
    diffs, g = {}, torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mult in (1, 4, 8):
            x = torch.randint(0, stock.config.vocab_size, (2, mult * L), generator=g)
            a = stock(input_ids=x, use_cache=False).logits
            b = custom(input_ids=x, use_cache=False).logits
            diffs[mult] = [(a - b).abs().max().item(), b.abs().max().item()]
        # KV-cache decoding of the stock model equals its full forward (what generate uses)
        pre = stock(input_ids=x[:, :-3], use_cache=True)
        step = stock(input_ids=x[:, -3:], past_key_values=pre.past_key_values, use_cache=True)
    out[name].update(diffs=diffs, cache=(step.logits - a[:, -3:]).abs().max().item())
print(json.dumps(out))
"""


def export_cases(cases, tmp_path_factory, init_megatron) -> dict:
    """name -> (step folder, its stock export, its custom export) for each of `cases`."""
    out = {}
    for name, kw in cases.items():
        root = tmp_path_factory.mktemp(name)
        ckpt = step_folder(root, run_config(**kw), init_megatron)
        out[name] = (ckpt, export(ckpt, root / "stock", fmt="stock")["out"],
                     export(ckpt, root / "custom")["out"])
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory, megatron_1rank):
    return export_cases(CASES, tmp_path_factory, megatron_1rank)


def compare_in_fresh_process(exports: dict) -> dict:
    """Both exports of every case (export_cases's) loaded in ONE fresh interpreter (stock ones
    first, before any remote code), logits compared there at 1x, 4x, 8x L: FRESH's record."""
    pairs = {name: [s, c] for name, (_, s, c) in exports.items()}
    p = subprocess.run([sys.executable, "-c", FRESH, str(L), json.dumps(pairs)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}, cwd="/")
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fresh_process(exports):
    return compare_in_fresh_process(exports)


@pytest.mark.parametrize("name", list(CASES))
def test_stock_loads_without_remote_code_and_equals_custom(exports, fresh_process, name):
    ckpt, stock_dir, custom_dir = exports[name]
    files = set(os.listdir(stock_dir))
    assert not any(f.endswith(".py") for f in files)  # nothing to trust
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer.model"} <= files
    cfg = json.loads(open(f"{stock_dir}/config.json").read())
    position = CASES[name]["position"]
    assert cfg["architectures"] == [EXPECTED[name]] and "auto_map" not in cfg
    prov = cfg["lenext_provenance"]
    assert prov["position"] == position and prov["source"]["checkpoint"].startswith(str(ckpt))
    if name in NO_ROPE_LAYERS:
        assert cfg["no_rope_layers"] == NO_ROPE_LAYERS[name]
        assert prov["layer_positions"] == ["rope" if x else "nope" for x in NO_ROPE_LAYERS[name]]
        windowed = "window" in CASES[name]
        assert cfg["use_sliding_window"] == windowed
        assert cfg["layer_types"] == LAYER_TYPES.get(
            name, [("sliding" if windowed else "full") + "_attention"] * len(NO_ROPE_LAYERS[name]))
    if name in ("rope_yarn_tied", "smollm3_yarn_window"):
        assert cfg["rope_parameters"]["rope_type"] == "yarn"
        assert cfg["rope_parameters"]["original_max_position_embeddings"] == L
    elif name in ("rope_pi_window", "local_global"):
        assert cfg["rope_parameters"]["rope_type"] == "linear" and cfg["sliding_window"] == 6
    if name == "irope_llama4":  # Llama4TextConfig: chunked RoPE layers, tuned NoPE layers, dense
        assert cfg["no_rope_layers"] == [1, 0, 1, 0] and cfg["attention_chunk_size"] == 6
        assert cfg["layer_types"] == ["chunked_attention", "full_attention"] * 2
        assert (cfg["attn_temperature_tuning"], cfg["floor_scale"], cfg["attn_scale"]) == (True, 4, 0.5)
        assert cfg["moe_layers"] == [] and cfg["use_qk_norm"] is False
    assert prov["exported_as"] == EXPECTED[name]
    got = fresh_process[name]
    print(name, "max |stock - custom| at 1x/4x/8x L:", got["diffs"], "cache:", got["cache"])
    assert got["class"] == EXPECTED[name] and got["no_lenext"]
    for mult, (diff, scale) in got["diffs"].items():
        assert diff <= 1e-4, f"{name} at {mult}x L: max |stock - custom| = {diff}"
        assert scale > 1.0  # logits not trivially small
    assert got["cache"] <= 1e-4


def test_folded_scales_are_the_learned_ones(exports):
    """The provenance records the scales that were folded: distinct per layer and head."""
    _, stock_dir, custom_dir = exports["nope_headscale"]
    prov = json.loads(open(f"{stock_dir}/config.json").read())["lenext_provenance"]
    from safetensors.torch import load_file

    custom = load_file(f"{custom_dir}/model.safetensors")
    learned = torch.stack([custom[f"model.layers.{i}.self_attn.head_scale"] for i in range(2)])
    assert torch.equal(torch.tensor(prov["head_scales"]), learned)
    assert len(set(learned.flatten().tolist())) == learned.numel()
    assert prov["head_scale_source"] == "learned" and prov["head_scales_folded_into"] == "q_proj"


@pytest.mark.parametrize("name", ["nope_headscale", "rope_yarn_tied", "interleaved",
                                  "smollm3_yarn_window", "local_global"])
def test_verify_stock_against_megatron(exports, name):
    _, stock_dir, _ = exports[name]
    assert verify(stock_dir) <= 1e-4


def test_cli_stock_verify_and_scale_c(exports, tmp_path, capsys):
    from lenext_dist.convert.__main__ import main

    ckpt = exports["nope_headscale"][0]
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "s"), "--format", "stock",
                 "--scale-c", "1.4", "--verify"]) == 0
    text = capsys.readouterr().out
    assert "SmolLM3ForCausalLM (stock)" in text and "verify" in text and "ok" in text
    prov = json.loads((tmp_path / "s" / "config.json").read_text())["lenext_provenance"]
    assert prov["scale_c"] == 1.4 and prov["head_scales_summary"]["min"] == pytest.approx(1.4)


# ------------------------------------------------------------------ tokenizer


def test_stock_tokenizer_equals_sentencepiece(exports):
    import sentencepiece as spm
    import zstandard
    from transformers import AutoTokenizer

    _, stock_dir, _ = exports["nope_headscale"]
    tok = AutoTokenizer.from_pretrained(stock_dir)  # no trust_remote_code
    sp = spm.SentencePieceProcessor(model_file=SAMPLE_TOKENIZER)
    texts = list(PROBE_TEXTS)
    for f in ("books", "code"):
        with open(f"{REPO}/data/sample/heldout/{f}.jsonl.zst", "rb") as fh:
            data = zstandard.ZstdDecompressor().stream_reader(fh).read().decode()
        texts += [json.loads(line)["text"][:30000] for line in data.splitlines()[:4]]
    rng = random.Random(0)  # whitespace runs of every kind mixed with words, digits, unicode
    pool = [" ", "  ", "   ", "\t", "\n", "\n\n", "a", "the", "word", "7", "42", "é", "日本", "🙂",
            "\u00a0", ".", "(", "x_y", "\r\n"]
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(300)]
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert ids == sp.encode(t), repr(t[:80])
        assert tok.decode(ids) == sp.decode(ids), repr(t[:80])



def test_merges_follow_sentencepiece_scores_not_ids(tmp_path):
    """Llama-2-style vocabularies score whitespace pieces -1e9 at low ids (Mistral v1 does); SP's
    BPE then never merges "▁▁" before "▁b". The sample model with that scoring: tokenizer.json
    must still equal SentencePiece (transformers' id-ordered merges do not)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    from lenext_dist.convert.tokenizer_json import stock_tokenizer_json

    m = pb.ModelProto()
    m.ParseFromString(open(SAMPLE_TOKENIZER, "rb").read())
    for piece in m.pieces:
        if len(piece.piece) > 1 and set(piece.piece) == {"\u2581"}:
            piece.score = -1e9
    path = tmp_path / "l2style.model"
    path.write_bytes(m.SerializeToString())
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert [sp.id_to_piece(i) for i in sp.encode("a  b")] == ["\u2581a", "\u2581", "\u2581b"]
    rng = random.Random(2)
    pool = [" ", "  ", "    ", "\t", "\n", "a", "the", "42", "é"]
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(300)]
    bt, why = stock_tokenizer_json(path, texts=list(PROBE_TEXTS) + texts)
    assert why is None
    for t in texts:
        assert bt.encode(t, add_special_tokens=False).ids == sp.encode(t), repr(t)

# ------------------------------------------------------------------ lenext eval on both exports


def _eval(*argv):
    from lenext_dist.cli import main

    assert main(list(argv)) == 0


@pytest.mark.parametrize("name", ["nope_headscale", "rope_yarn_tied", "interleaved"])
def test_lenext_eval_equal_on_both_exports(exports, tmp_path, name):
    _, stock_dir, custom_dir = exports[name]
    data = f"{REPO}/data/sample/heldout/books.jsonl.zst"
    res = {}
    for kind, d in (("stock", stock_dir), ("custom", custom_dir)):
        out = tmp_path / kind
        common = ("--model", d, "--out", str(out), "--no-progress", "--threads", "1")
        _eval("eval", "ppl", *common, "--data", data, "--lengths", f"{L},{4 * L}", "--stride", "8",
              "--budget-tokens", "48", "--no-penalty")
        _eval("eval", "passkey", *common, "--lengths", "100,140", "--depths", "2", "--keys", "2",
              "--max-new-tokens", "5")
        res[kind] = {f: json.loads((out / f).read_text())
                     for f in ("ppl_last-stride.json", "passkey.json")}
        if name in ("nope_headscale", "interleaved"):  # eval-time scale (re-folded), entropy
            _eval("eval", "ppl", *common, "--data", data, "--lengths", f"{2 * L}", "--stride",
                  "8", "--budget-tokens", "48", "--no-penalty", "--scale-c", "1.3")
            _eval("eval", "entropy", *common, "--data", data, "--length", f"{4 * L}",
                  "--samples", "2")
            res[kind].update({f: json.loads((out / f).read_text())
                              for f in ("ppl_last-stride_c1.3.json", f"entropy_{4 * L}.json")})
    s, c = res["stock"], res["custom"]
    assert s["ppl_last-stride.json"]["model"]["attention_layout"] == "stock"
    assert s["ppl_last-stride.json"]["train_length"] == c["ppl_last-stride.json"]["train_length"] == L
    for f in [f for f in s if f.startswith("ppl")]:
        for a, b in zip(s[f]["results"], c[f]["results"], strict=True):
            assert a["scored_tokens"] == b["scored_tokens"] > 0
            assert a["ppl"] == pytest.approx(b["ppl"], rel=1e-5), (f, a, b)
    assert s["passkey.json"]["accuracy"] == c["passkey.json"]["accuracy"]
    outputs = [[e["output"] for e in r["passkey.json"]["examples"]] for r in (s, c)]
    assert outputs[0] == outputs[1] and len(outputs[0]) == 8  # greedy answers, token for token
    if name in ("nope_headscale", "interleaved"):
        hs = s["ppl_last-stride_c1.3.json"]["model"]["head_scale"]
        assert hs["min"] == pytest.approx(1.3) and hs["max"] == pytest.approx(1.3)
        ea, eb = s[f"entropy_{4 * L}.json"], c[f"entropy_{4 * L}.json"]
        assert torch.allclose(torch.tensor(ea["mean"]), torch.tensor(eb["mean"]), atol=1e-4)


# ------------------------------------------------------------------ refusals


def _config_only(root, cfg):
    step = root / "step_0000001"
    step.mkdir(parents=True)
    save_config(cfg, step / "config.yaml")
    (step / "COMPLETE").write_text("1\n")
    return step


@pytest.mark.parametrize("position", sorted(p for p in POSITIONS
                                             if frozenset({p}) not in STOCK_FORMS))
def test_variants_without_a_stock_form_are_refused(tmp_path, position):
    step = _config_only(tmp_path, run_config(position))
    with pytest.raises(ExportError, match=rf"'{position}' has no exact stock .*--format custom"):
        export(step, tmp_path / "out", fmt="stock")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("position,layout,what", [
    ("alibi", LayoutConfig(kind="nope_every", every=2), "alibi, nope, alibi, nope"),
    ("rope", LayoutConfig(kind="explicit", layers=["rope", "xpos", "nope", "rope"]),
     "rope, xpos, nope, rope"),
])
def test_layouts_without_a_stock_form_are_refused(tmp_path, position, layout, what):
    step = _config_only(tmp_path, run_config(position, layers=4, layout=layout))
    with pytest.raises(ExportError, match=rf"attention.layout '{layout.kind}' \(layers: {what}\) "
                                          r"has no exact stock .*--format custom"):
        export(step, tmp_path / "out", fmt="stock")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("attn,what", [
    (dict(position="nope", temperature=TemperatureConfig(kind="log_fit", a=0.3)),
     "temperature 'log_fit' .* has no SmolLM3ForCausalLM form"),
    (dict(position="rope", temperature=TemperatureConfig(kind="qwen_logn", layers="all"),
          rope=RopeConfig(scaling="yarn", factor=2.0)), "temperature 'qwen_logn'"),
    (dict(position="rope", layers=4, layout=LayoutConfig(kind="irope", every=2), chunked=8,
          temperature=TemperatureConfig(kind="ssmax", layers="all"), learned=True),
     "temperature 'ssmax' .* has no Llama4ForCausalLM form"),
    (dict(position="rope", chunked=8, window=4), "no sliding window"),
    (dict(position="rope", layers=4, layout=LayoutConfig(kind="nope_every", every=2), chunked=8),
     "chunks exactly its RoPE layers"),
])
def test_options_without_a_stock_form_are_refused(tmp_path, attn, what):
    step = _config_only(tmp_path, run_config(**attn))
    with pytest.raises(ExportError, match=what):
        export(step, tmp_path / "out", fmt="stock")


def test_cli_refusal_is_one_line_exit_2(tmp_path, capsys):
    from lenext_dist.convert.__main__ import main

    step = _config_only(tmp_path, run_config("alibi"))
    assert main(["--checkpoint", str(step), "--out", str(tmp_path / "o"), "--format", "stock"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'alibi'" in err and "--format custom" in err


def test_a_staged_runs_stock_export_carries_its_last_stages_length_and_theta(tmp_path, megatron_1rank):
    """Issue 42: a run trained at L = 16 then, from step 2, at 32 tokens with RoPE theta 40000
    (train.stages) exports its last stage: max_position_embeddings 32 (serving engines cap the
    context there; it said 16), rope theta 40000; L stays 16 in the provenance."""
    from lenext_dist.config import StageConfig, TrainConfig, save_config

    cfg = run_config("rope")
    cfg = type(cfg)(**{**cfg.__dict__, "train": TrainConfig(
        steps=4, micro_batch_size=1, global_batch_size=2,
        stages=[StageConfig(start_step=2, seq_length=32, rope_base=40000.0)])})
    ckpt = step_folder(tmp_path / "run", cfg, megatron_1rank)
    last = ckpt / "step_0000004"  # the weights after steps 0..3: stage 1's
    (ckpt / "step_0000001").rename(last)
    save_config(cfg, last / "config.yaml")
    (ckpt / "latest").write_text("step_0000004\n")
    export(ckpt, tmp_path / "hf", fmt="stock", tokenizer="")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf["max_position_embeddings"] == 32
    assert hf["rope_parameters"]["rope_theta"] == 40000.0
    assert hf["lenext_provenance"]["train_length"] == L
