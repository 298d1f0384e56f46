"""Each attention variant of project issue 7, each per-layer layout and each temperature schedule
(issue 34), QK-norm and partial RoPE (issue 42) trains under ZeRO-2 on 2 gloo ranks on real text
(launch/pretrain.py under helpers.LAUNCHER, the tiny model of tests/helpers.py, 4 steps), is
exported, and `lenext eval ppl` runs on it at 1x/2x/4x its training length."""
import json
import math

import pytest

from helpers import LAUNCHER, REPO, free_port, losses, pretrain_cmd, run, write_config

pytestmark = pytest.mark.distributed

LLAMA4_T = {"kind": "llama4", "floor_scale": 8, "attn_scale": 0.5}  # steps within L = 32
CASES = {
    "alibi": {"position": "alibi"},
    "kerple_log": {"position": "kerple_log"},
    "sandwich": {"position": "sandwich"},
    "xpos": {"position": "xpos", "xpos": {"blockwise": True}},
    "window": {"position": "nope", "window": 8},  # sliding window W = 8 < L = 32
    # attention.layout: layer 1 RoPE, layer 2 NoPE (NoPE every 2nd layer; the tiny model has 2)
    "interleaved": {"position": "rope", "layout": {"kind": "nope_every", "every": 2}},
    # local RoPE under a window W = 8, global NoPE on every 2nd layer (Cohere Command R7B's, k = 2)
    "local_global": {"position": "rope", "window": 8, "layout": {"kind": "local_global", "every": 2}},
    # Llama 4's iRoPE (k = 2): chunked RoPE (C = 8), global NoPE under Llama 4's temperature
    "irope": {"position": "rope", "chunked": 8, "layout": {"kind": "irope", "every": 2},
              "temperature": LLAMA4_T},
    "explicit": {"position": "rope", "layout": {"kind": "explicit", "layers": ["rope", "nope"]}},
    # SmolLM3's own pattern needs 4 layers (every 4th NoPE): model.num_layers 4 below
    "smollm3": {"position": "rope", "layout": {"kind": "smollm3"}},
    # temperature schedules (model.train_length 8 below: past L inside the 32-token samples)
    "t_uniform": {"position": "rope", "layout": {"kind": "nope_every", "every": 2},
                  "temperature": {"kind": "uniform", "c": 1.3}},
    "t_log_fit": {"position": "nope", "temperature": {"kind": "log_fit", "a": 0.4}},
    "t_qwen_logn": {"position": "nope", "temperature": {"kind": "qwen_logn"}},
    "t_ssmax": {"position": "nope", "temperature": {"kind": "ssmax"},
                "head_scale": {"enabled": True, "trainable": True, "min_value": None}},
    # QK-norm and partial RoPE (issue 42): Llama 4 as it ships (iRoPE, its temperature, the
    # weightless norm on the RoPE layers); Qwen3's learned RMSNorm on every layer; a quarter of
    # the dims rotating (GLM's partial_rotary_factor)
    "irope_qk_norm": {"position": "rope", "chunked": 8, "layout": {"kind": "irope", "every": 2},
                      "temperature": LLAMA4_T, "qk_norm": {"kind": "l2", "layers": "rope"}},
    "qk_norm_rms": {"position": "rope", "qk_norm": {"kind": "rms"}},
    "partial_rope": {"position": "rope", "rope": {"fraction": 0.25}},
}
MODEL = {"smollm3": {"num_layers": 4}, "t_log_fit": {"train_length": 8},
         "t_qwen_logn": {"train_length": 8}, "t_ssmax": {"train_length": 8}}
LAYERS = {"interleaved": (["rope", "nope"], [None, None], [None, None]),
          "local_global": (["rope", "nope"], [8, None], [None, None]),
          "irope": (["rope", "nope"], [None, None], [8, None]),
          "explicit": (["rope", "nope"], [None, None], [None, None]),
          "smollm3": (["rope"] * 3 + ["nope"], [None] * 4, [None] * 4),
          "t_uniform": (["rope", "nope"], [None, None], [None, None]),
          "irope_qk_norm": (["rope", "nope"], [None, None], [8, None])}
"""Each layout's layers as the export runs them: (variant, window, chunked) per layer."""
STOCK = {"interleaved": "SmolLM3ForCausalLM", "irope": "Llama4ForCausalLM",
         "irope_qk_norm": "Llama4ForCausalLM", "qk_norm_rms": "Qwen3ForCausalLM",
         "partial_rope": "GlmForCausalLM"}
QK_NORMED = {"irope_qk_norm": [True, False], "qk_norm_rms": [True, True]}
"""The layers the trained QK-norm normalizes in the export."""
"""Cases whose trained run is also exported `--format stock` and compared with the custom export."""
HEADERS = {"interleaved": "(layout nope_every: rope, nope)",
           "local_global": "(layout local_global: rope + window 8, nope)",
           "irope": "(layout irope: rope + chunked 8, nope)",
           "smollm3": "(layout smollm3: rope x3, nope)",
           "irope_qk_norm": "(layout irope: rope + chunked 8, nope), qk_norm l2 on rope layers",
           "qk_norm_rms": "attention rope, qk_norm rms on all layers c=",
           "partial_rope": "attention rope, rope fraction 0.25 c="}


@pytest.mark.parametrize("case", sorted(CASES))
def test_variant_trains_under_zero2(case, sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, case, attention=CASES[case],
                       model=MODEL.get(case, {}), train={"steps": 4, "eval_interval": 0},
                       parallel={"zero_stage": 2}, checkpoint={"interval": 0})
    p = run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()), timeout=240)
    curve = losses(tmp_path / case)
    assert sorted(curve) == [1, 2, 3, 4], curve
    assert all(math.isfinite(x) for x in curve.values()), curve
    assert len({round(x, 6) for x in curve.values()}) > 1, curve  # the model is learning something
    assert curve[4] < curve[1], curve
    assert "world 2, ZeRO-2" in p.stdout
    assert f"attention {CASES[case]['position']}" in p.stdout
    if case in HEADERS:
        assert HEADERS[case] in p.stdout

    # export (exact weights, incl. KERPLE's learned r1/r2) and evaluate past the training length
    from lenext_dist.cli import main as lenext
    from lenext_dist.convert.export import export

    hf = tmp_path / "hf"
    export(tmp_path / case / "checkpoints", hf)
    lenext(["eval", "ppl", "--model", str(hf), "--data", str(REPO / "data/sample/heldout/books.jsonl.zst"),
            "--lengths", "32,64,128", "--stride", "16", "--budget-tokens", "256", "--no-penalty",
            "--no-progress", "--threads", "1", "--out", str(tmp_path / "eval")])
    res = json.loads((tmp_path / "eval" / "ppl_last-stride.json").read_text())
    assert res["model"]["config"]["position"] == CASES[case]["position"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf), trust_remote_code=True)
    got = [layer.self_attn.position for layer in model.model.layers]
    if "layout" in CASES[case]:  # the export's layers run the trained layout
        layout = CASES[case]["layout"]
        assert res["model"]["config"]["attention_options"]["layout"]["kind"] == layout["kind"]
        assert ([v.name for v in got], [v.window for v in got], [v.chunked for v in got]) == \
            tuple(LAYERS[case])
    if "temperature" in CASES[case]:  # the schedule on the layers it names (default: NoPE ones)
        t = CASES[case]["temperature"]
        assert [None if v.temperature is None else vars(v.temperature) for v in got] == \
            [{**{k: None for k in ("c", "a", "floor_scale", "attn_scale")}, "layers": "nope", **t}
             if v.name == "nope" else None for v in got]
    if case in QK_NORMED:
        assert [layer.self_attn.q_norm is not None for layer in model.model.layers] == QK_NORMED[case]
    if case == "partial_rope":
        assert [v.rotary_dim for v in got] == [4, 4]  # a quarter of the 16 dims of a head
    if case in STOCK:  # the trained run exported stock: plain transformers = custom at 4x L
        import torch

        stock = AutoModelForCausalLM.from_pretrained(
            export(tmp_path / case / "checkpoints", tmp_path / "stock", fmt="stock")["out"],
            dtype=torch.float32).eval()
        assert type(stock).__name__ == STOCK[case]
        x = torch.randint(0, stock.config.vocab_size, (2, 4 * 32), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            diff = (stock(input_ids=x).logits - model.eval()(input_ids=x).logits).abs().max().item()
        assert diff <= 1e-4, f"{case}: max |stock - custom| at 4x L = {diff}"
    if case == "t_ssmax":  # SSMax's per-head s trained from scratch (m_h moved off its init 1)
        scales = [layer.self_attn.head_scale for layer in model.model.layers]
        assert all((s - 1.0).abs().max() > 1e-4 for s in scales), scales
    assert [r["length"] for r in res["results"]] == [32, 64, 128]
    assert all(math.isfinite(r["ppl"]) and r["ppl"] > 1 for r in res["results"])


def test_sliding_window_at_eval_time_on_a_nope_model(sample_shards, tmp_path):
    """The "super strong baseline": local attention of W = L switched on at evaluation on a model
    trained without it; at W <= L nothing changes, past L the window caps the context."""
    cfg = write_config(tmp_path, sample_shards, "nope", train={"steps": 2, "eval_interval": 0},
                       checkpoint={"interval": 0})
    run(pretrain_cmd(cfg, LAUNCHER, 1, free_port()), timeout=240)
    from lenext_dist.cli import main as lenext
    from lenext_dist.convert.export import export

    hf = tmp_path / "hf"
    export(tmp_path / "nope" / "checkpoints", hf)
    common = ["--model", str(hf), "--data", str(REPO / "data/sample/heldout/books.jsonl.zst"),
              "--lengths", "32,128", "--stride", "16", "--budget-tokens", "256", "--no-penalty",
              "--no-progress", "--threads", "1", "--out", str(tmp_path / "eval")]
    lenext(["eval", "ppl", *common])
    lenext(["eval", "ppl", *common, "--window", "32"])
    record = json.loads((tmp_path / "eval" / "ppl_last-stride.json").read_text())
    full = {r["length"]: r["ppl"] for r in record["results"]}
    local = json.loads((tmp_path / "eval" / "ppl_last-stride_w32.json").read_text())
    assert local["model"]["config"]["attention_options"]["window"] == 32 and local["args"]["window"] == 32
    local = {r["length"]: r["ppl"] for r in local["results"]}
    assert math.isclose(local[32], full[32], rel_tol=1e-6)
    assert local[128] != full[128]
