"""Export real training runs to HF and check the function is the same.

Two real runs of launch/pretrain.py (helpers.LAUNCHER, 2 gloo ranks, 4 steps each):
ZeRO-3 + GQA + NoPE and ZeRO-2 + MHA + RoPE. Each is exported with the real CLI
(`python -m lenext_dist.convert`) and loaded offline with `AutoModelForCausalLM(...,
trust_remote_code=True)`; its logits must equal the megatron model's (built in process from the
run's config.yaml, weights read from the DeepSpeed files directly) to 1e-4 in fp32.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from helpers import LAUNCHER, REPO, env, free_port, pretrain_cmd, run, write_config

pytestmark = pytest.mark.e2e
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

RUNS = {
    "z3_gqa_nope": dict(parallel={"zero_stage": 3}, attention={"position": "nope"}),
    "z2_mha_rope": dict(parallel={"zero_stage": 2}, attention={"position": "rope"},
                        model={"num_query_groups": None}),
}
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. However little known the feelings or views")


@pytest.fixture(scope="module")
def runs(sample_shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export_runs")
    out = {}
    for name, sections in RUNS.items():
        cfg = write_config(tmp, sample_shards, name,
                           train={"steps": 4, "eval_interval": 0}, checkpoint={"interval": 0},
                           **sections)
        run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
        out[name] = tmp / name / "checkpoints"
    # HeadScale (PEFT of the per-head scales, all else frozen) from the RoPE run, ZeRO-3
    cfg = write_config(tmp, sample_shards, "headscale", parallel={"zero_stage": 3},
                       attention={"position": "rope", "scale_c": 1.2,
                                  "head_scale": {"enabled": True, "trainable": True}},
                       model={"num_query_groups": None},
                       train={"steps": 2, "eval_interval": 0, "mode": "headscale"},
                       optim={"lr": 0.1, "weight_decay": 0.0, "warmup_steps": 1},
                       checkpoint={"interval": 0, "init_from": str(out["z2_mha_rope"])})
    run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
    out["headscale"] = tmp / "headscale" / "checkpoints"
    return out


@pytest.fixture(scope="module")
def megatron_1rank():
    from lenext_dist.model import destroy_megatron, init_single_process_group

    own = init_single_process_group()
    yield
    destroy_megatron()
    if own:
        dist.destroy_process_group()


def convert(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "lenext_dist.convert", *map(str, args)], cwd=REPO,
                       env=env(), capture_output=True, text=True, timeout=300)
    if check and p.returncode:
        raise AssertionError(f"convert exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def megatron_model(ckpt, scale_c=None):
    """The run's megatron model from its own config.yaml; module weights straight from the
    DeepSpeed files (ZeRO-2: mp_rank_00_model_states.pt; ZeRO-3: zero_to_fp32 over partitions)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from lenext_dist.config import load_config
    from lenext_dist.model import build_model, init_megatron

    tag = (ckpt / "latest").read_text().strip()
    overrides = [f"attention.scale_c={scale_c}"] if scale_c is not None else []
    cfg = load_config(ckpt / tag / "config.yaml", overrides)
    module_file = ckpt / tag / "mp_rank_00_model_states.pt"
    if module_file.exists():
        from lenext_dist.checkpoint.safe_load import load as safe_load

        state = safe_load(module_file)["module"]
    else:
        from lenext_dist.checkpoint.safe_load import weights_only_loads

        with weights_only_loads(ckpt / tag):
            state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag)
    init_megatron(cfg.train.seed)
    model = build_model(cfg, device="cpu")
    model.load_state_dict({k: v for k, v in state.items() if isinstance(v, torch.Tensor)},
                          strict=False)
    return model.eval(), cfg


def tokens(hf_dir):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(hf_dir / "tokenizer.model"))
    ids = sp.encode(TEXT)[:32]
    return torch.tensor([ids, ids[::-1]])


def load_hf(hf_dir, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf_dir), trust_remote_code=True,
                                                local_files_only=True, **kw).eval()


@torch.no_grad()
def max_diff(meg, hf, x):
    want = meg(x, torch.arange(x.shape[1]).expand_as(x), attention_mask=None)
    got = hf(input_ids=x, use_cache=False).logits
    return (want - got).abs().max().item()


@pytest.mark.parametrize("name", list(RUNS))
def test_export_logits_match_megatron(runs, megatron_1rank, tmp_path, name):
    ckpt = runs[name]
    out = tmp_path / "hf"
    convert("--checkpoint", ckpt, "--out", out)
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.model",
            "tokenizer_config.json", "modeling_lenext.py", "configuration_lenext.py",
            "lenext_attention.py", "lenext_attention_core.py"} <= files
    cfg_json = json.loads((out / "config.json").read_text())
    position = RUNS[name]["attention"]["position"]
    assert cfg_json["model_type"] == "lenext" and cfg_json["position"] == position
    assert cfg_json["architectures"] == ["LenextForCausalLM"]
    assert cfg_json["lenext_source"]["weights"] == "zero_fp32"

    meg, cfg = megatron_model(ckpt)
    hf = load_hf(out)
    assert type(hf).__module__.startswith("transformers_modules.")  # the shipped code, not the repo's
    assert hf.model.layers[0].self_attn.position.name == position
    assert hf.model.layers[0].self_attn.num_heads // hf.model.layers[0].self_attn.num_kv_heads == \
        cfg.model.num_attention_heads // cfg.model.kv_heads
    x = tokens(out)
    assert max_diff(meg, hf, x) < 1e-4

    # generate() with the KV cache == a greedy loop without cache
    prompt = x[:1, :10]
    gen = hf.generate(prompt, max_new_tokens=6, do_sample=False)
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, hf(input_ids=seq, use_cache=False).logits[:, -1:].argmax(-1)], 1)
    assert gen.tolist() == seq.tolist()

    # the tokenizer loads through AutoTokenizer and is SentencePiece itself
    from transformers import AutoTokenizer
    import sentencepiece as spm

    tok = AutoTokenizer.from_pretrained(str(out), trust_remote_code=True, local_files_only=True)
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    text = "a  b\n\n   c\tdef f(x):\n        return x"
    assert tok(text)["input_ids"] == sp.encode(text)

    if position == "nope":
        # NoPE must never load as RoPE: forcing the variant changes the function
        forced = load_hf(out, position="rope")
        assert forced.model.layers[0].self_attn.position.name == "rope"
        assert max_diff(meg, forced, x) > 1e-3  # (matches are ~1e-7)


def test_export_scale_c_matches_megatron_with_that_scale(runs, megatron_1rank, tmp_path):
    ckpt = runs["z3_gqa_nope"]
    out = tmp_path / "hf12"
    p = convert("--checkpoint", ckpt, "--out", out, "--scale-c", "1.2", "--verify")
    assert "verify: max |logits_hf - logits_megatron|" in p.stdout and "(ok" in p.stdout
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["scale_c"] == 1.2 and cfg_json["head_scale_source"] == "uniform"
    hf = load_hf(out)
    meg12, _ = megatron_model(ckpt, scale_c=1.2)
    meg10, _ = megatron_model(ckpt)
    x = tokens(out)
    assert max_diff(meg12, hf, x) < 1e-4
    assert max_diff(meg10, hf, x) > 1e-3  # the scale is really in the export


def test_export_head_scales_file_and_bad_inputs(runs, tmp_path):
    ckpt = runs["z2_mha_rope"]
    scales = [[1.0, 1.1, 1.2, 1.3], [2.0, 1.5, 1.25, 1.0]]
    (tmp_path / "s.json").write_text(json.dumps(scales))
    out = tmp_path / "hfs"
    convert("--checkpoint", ckpt, "--out", out, "--head-scales-from", tmp_path / "s.json")
    from safetensors.torch import load_file

    w = load_file(str(out / "model.safetensors"))
    assert w["model.layers.1.self_attn.head_scale"].dtype == torch.float32
    assert w["model.layers.1.self_attn.head_scale"].tolist() == scales[1]
    assert json.loads((out / "config.json").read_text())["head_scale_source"] == "file"
    # non-empty output without --overwrite, wrong shape, both scale flags: clear errors
    p = convert("--checkpoint", ckpt, "--out", out, check=False)
    assert p.returncode == 2 and "--overwrite" in p.stderr
    (tmp_path / "bad.json").write_text(json.dumps([[1.0, 1.0]]))
    p = convert("--checkpoint", ckpt, "--out", tmp_path / "x", "--head-scales-from",
                tmp_path / "bad.json", check=False)
    assert p.returncode == 2 and "shape" in p.stderr
    p = convert("--checkpoint", ckpt, "--out", tmp_path / "y", "--scale-c", "1.2",
                "--head-scales-from", tmp_path / "s.json", check=False)
    assert p.returncode != 0


def test_export_does_not_load_as_plain_llama(runs, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    out = tmp_path / "hf"
    convert("--checkpoint", runs["z3_gqa_nope"], "--out", out, "--tag", "step_0000004")
    with pytest.raises(Exception, match="trust_remote_code|lenext"):
        AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    with pytest.raises(Exception, match="trust_remote_code|lenext"):
        AutoConfig.from_pretrained(str(out), local_files_only=True)
    with pytest.raises(Exception, match="lenext-not-a-llama"):
        LlamaForCausalLM.from_pretrained(str(out), local_files_only=True)
    # a config the shipped code cannot honour is refused, not guessed
    cfg = json.loads((out / "config.json").read_text())
    cfg["position"] = "alibi-unknown"
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown config.position"):
        load_hf(out)
    del cfg["position"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing"):
        load_hf(out)


def test_export_learned_head_scales(runs, megatron_1rank, tmp_path):
    """A HeadScale run (ZeRO-3, frozen weights + trained scales): the export carries the learned
    scales and the frozen weights of the run it started from, and matches megatron."""
    from safetensors.torch import load_file

    out = tmp_path / "hs"
    convert("--checkpoint", runs["headscale"], "--out", out)
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["head_scale_source"] == "learned" and cfg_json["position"] == "rope"
    w = load_file(str(out / "model.safetensors"))
    scales = torch.stack([w[f"model.layers.{i}.self_attn.head_scale"] for i in range(2)])
    assert not torch.allclose(scales, torch.full_like(scales, 1.2))  # trained away from the init
    assert (scales >= 1.0).all()  # the m_h >= 1 clamp
    meg, _ = megatron_model(runs["headscale"])
    hf = load_hf(out)
    x = tokens(out)
    assert max_diff(meg, hf, x) < 1e-4
    # frozen weights are exactly those of the pretraining run
    base = tmp_path / "base"
    convert("--checkpoint", runs["z2_mha_rope"], "--out", base, "--head-scales-from", runs["headscale"])
    wb = load_file(str(base / "model.safetensors"))
    assert set(wb) == set(w) and all(torch.equal(wb[k], w[k]) for k in w)


def test_stock_export_of_real_runs_verifies_without_remote_code(runs, tmp_path):
    """--format stock on real DeepSpeed checkpoints (ZeRO-3 NoPE; the ZeRO-3 HeadScale run's
    learned scales folded into a Llama): --verify loads plain transformers and matches megatron."""
    for name, arch in (("z3_gqa_nope", "SmolLM3ForCausalLM"), ("headscale", "LlamaForCausalLM")):
        out = tmp_path / name
        p = convert("--checkpoint", runs[name], "--out", out, "--format", "stock", "--verify")
        assert f"{arch} (stock)" in p.stdout and "(ok," in p.stdout, p.stdout
        prov = json.loads((out / "config.json").read_text())["lenext_provenance"]
        assert prov["head_scale_source"] == ("learned" if name == "headscale" else "uniform")


MC_TASK = """task: lenext_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
MC_DOCS = [
    {"context": TEXT[:84], "choices": [" wife.", " horse.", " river."], "label": 0},
    {"context": "def add(a, b):\n    return a", "choices": [" + b", " * 7 ]", " (("], "label": 0},
    {"context": "To be, or not to be, that is the", "choices": [" question", " banana", " seven"], "label": 0},
]


def test_export_evaluates_with_lm_evaluation_harness_offline(runs, tmp_path):
    """lm-evaluation-harness (hf backend, trust_remote_code) on a local task, offline; its
    log-likelihoods must be the exported model's own (recomputed here the way lm-eval splits
    context and continuation)."""
    pytest.importorskip("lm_eval")
    hf_dir = tmp_path / "hf"
    convert("--checkpoint", runs["z3_gqa_nope"], "--out", hf_dir)
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "task.yaml").write_text(MC_TASK.format(data=tmp_path / "mc.jsonl"))
    e = env(2)
    e.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "ds_cache"))
    p = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                        f"pretrained={hf_dir},trust_remote_code=True,dtype=float32", "--tasks",
                        "lenext_local_mc", "--include_path", str(tmp_path / "tasks"), "--device", "cpu",
                        "--batch_size", "2", "--output_path", str(tmp_path / "out"), "--log_samples"],
                       cwd=REPO, env=e, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    samples = [json.loads(line) for f in (tmp_path / "out").rglob("samples_*.jsonl")
               for line in f.read_text().splitlines()]
    assert sorted(s["doc_id"] for s in samples) == [0, 1, 2]

    from transformers import AutoTokenizer

    model = load_hf(hf_dir)
    tok = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    for s in samples:
        doc = MC_DOCS[s["doc_id"]]
        for choice, resp in zip(doc["choices"], s["resps"]):
            whole = tok(doc["context"] + choice, add_special_tokens=False)["input_ids"]
            ctx = tok(doc["context"], add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = model(torch.tensor([whole])).logits[0].log_softmax(-1)
            ours = sum(logp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole)))
            assert abs(float(resp[0][0]) - ours) < 1e-3, (doc["context"], choice, resp, ours)
