"""Each attention variant of project issue 7 (and per-layer layouts: RoPE and NoPE layers
interleaved; local RoPE + global NoPE) trains under ZeRO-2 on 2 gloo ranks on real text
(launch/pretrain.py under the deepspeed launcher, the tiny model of tests/helpers.py, 4 steps), is
exported, and `lenext eval ppl` runs on it at 1x/2x/4x its training length."""
import json
import math

import pytest

from helpers import REPO, free_port, losses, pretrain_cmd, run, write_config

pytestmark = pytest.mark.distributed

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
}
HEADERS = {"interleaved": "(layout nope_every: rope, nope)",
           "local_global": "(layout local_global: rope + window 8, nope)"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_variant_trains_under_zero2(case, sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, case, attention=CASES[case],
                       train={"steps": 4, "eval_interval": 0},
                       parallel={"zero_stage": 2}, checkpoint={"interval": 0})
    p = run(pretrain_cmd(cfg, "deepspeed", 2, free_port()), timeout=240)
    curve = losses(tmp_path / case)
    assert sorted(curve) == [1, 2, 3, 4], curve
    assert all(math.isfinite(x) for x in curve.values()), curve
    assert len({round(x, 6) for x in curve.values()}) > 1, curve  # the model is learning something
    assert curve[4] < curve[1], curve
    assert "world 2, ZeRO-2" in p.stdout
    assert f"attention {CASES[case]['position']}" in p.stdout
    if "layout" in CASES[case]:
        assert HEADERS[case] in p.stdout

    # export (exact weights, incl. KERPLE's learned r1/r2) and evaluate past the training length
    from lenext_dist.cli import main as lenext
    from lenext_dist.convert import export

    hf = tmp_path / "hf"
    export(tmp_path / case / "checkpoints", hf)
    lenext(["eval", "ppl", "--model", str(hf), "--data", str(REPO / "data/sample/heldout/books.jsonl.zst"),
            "--lengths", "32,64,128", "--stride", "16", "--budget-tokens", "256", "--no-penalty",
            "--no-progress", "--threads", "1", "--out", str(tmp_path / "eval")])
    res = json.loads((tmp_path / "eval" / "ppl_last-stride.json").read_text())
    assert res["model"]["config"]["position"] == CASES[case]["position"]
    if "layout" in CASES[case]:  # the export's layers run the trained layout
        layout = CASES[case]["layout"]
        assert res["model"]["config"]["attention_options"]["layout"]["kind"] == layout["kind"]
        assert ["name=rope" in p for p in res["model"]["layer_positions"]] == [True, False]
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(hf), trust_remote_code=True)
        assert [layer.self_attn.position.name for layer in model.model.layers] == ["rope", "nope"]
        windows = [layer.self_attn.position.window for layer in model.model.layers]
        assert windows == ([8, None] if layout["kind"] == "local_global" else [None, None])
    assert [r["length"] for r in res["results"]] == [32, 64, 128]
    assert all(math.isfinite(r["ppl"]) and r["ppl"] > 1 for r in res["results"])


def test_sliding_window_at_eval_time_on_a_nope_model(sample_shards, tmp_path):
    """The "super strong baseline": local attention of W = L switched on at evaluation on a model
    trained without it; at W <= L nothing changes, past L the window caps the context."""
    cfg = write_config(tmp_path, sample_shards, "nope", train={"steps": 2, "eval_interval": 0},
                       checkpoint={"interval": 0})
    run(pretrain_cmd(cfg, "deepspeed", 1, free_port()), timeout=240)
    from lenext_dist.cli import main as lenext
    from lenext_dist.convert import export

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
