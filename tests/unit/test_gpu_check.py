"""`make gpu-check` on a CPU: the dry plan covers every registered variant, layout and temperature
schedule and the TinyLlama shape; an NVIDIA device torch cannot use is a one-line exit 1 (a fake
driver file under --root stands for /proc); SKIPPED only where no NVIDIA device exists."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

DRIVER = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
          "(dvs-builder@U22-I3-AE18-23-3)  Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 12.2.0\n")


def _gpu_check(repo, *args, cuda_hidden=True):
    env = {**os.environ, "PYTHONPATH": str(repo)}
    if cuda_hidden:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", "lenext_dist.gpu", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def dry(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("dry")
    p = _gpu_check(repo, "--dry", "--out-dir", str(out), "--root", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    (path,) = out.glob("gpu_check-dry-*.json")
    return json.loads(path.read_text()), path, p.stdout


def test_dry_plan_covers_every_registry_entry(dry):
    from lenext_dist.attention import POSITIONS
    from lenext_dist.attention.layout import LAYOUTS
    from lenext_dist.attention.temperature import TEMPERATURES
    from lenext_dist.config import load_config
    from lenext_dist.gpu.plan import LONG, SHORT, distinct_variants

    result, _, _ = dry
    cases = {c["name"]: c for c in result["cases"]}
    want = ([f"position/{p}" for p in POSITIONS] + [f"layout/{k}" for k in LAYOUTS]
            + [f"temperature/{k}" for k in TEMPERATURES])
    assert set(want) <= set(cases), sorted(set(want) - set(cases))
    for name, c in cases.items():
        assert "error" not in c["plan"], (name, c["plan"])
    for kind in ("documents", "window", "chunked"):
        got = {c["length"] for c in result["cases"] if c["name"].startswith(kind + "/")}
        assert got == {SHORT, LONG}, kind
    assert cases[f"documents/nope@{SHORT // 1024}K"]["documents"] > 1
    for c in result["cases"]:
        if c["kind"] != "attention":
            continue
        plan = c["plan"]
        assert plan["q"][2] == c["length"] and plan["budget_bytes"] > 0
        # one kernel per distinct layer of the layout, as the model would build them
        cfg = load_config(result["config"], ["model.num_layers=4", *c["overrides"]])
        assert len(plan["kernels"]) == len(distinct_variants(cfg)) == len({tuple(x) for x in plan["layers"]})
        assert all(k in ("sdpa:flash", "flex") for k in plan["kernels"]), (c["name"], plan["kernels"])
    # the plain NoPE path takes SDPA; a distance bias and every mask take FlexAttention on CUDA
    assert cases["position/nope"]["plan"]["kernels"] == ["sdpa:flash"]
    assert cases["position/alibi"]["plan"]["kernels"] == ["flex"]
    assert cases[f"window/nope@{LONG // 1024}K"]["plan"]["kernels"] == ["flex"]


def test_dry_plan_has_the_real_training_shape(dry):
    from lenext_dist.config import load_config
    from lenext_dist.model import parameter_counts

    result, _, _ = dry
    cfg = load_config(result["config"], [])
    train = [c for c in result["cases"] if c["kind"] == "train"]
    assert sorted(c["plan"]["zero_stage"] for c in train) == [1, 2, 2]
    # the recompute case: packed documents under activation checkpointing take flex in the model
    rec = [c for c in train if "train.activation_checkpointing=true" in c["overrides"]]
    assert len(rec) == 1 and rec[0]["documents"] > 1 and "data.document_mask=true" in rec[0]["overrides"]
    assert rec[0]["plan"]["kernel"] == "flex"
    for c in train:
        p = c["plan"]
        assert (p["layers"], p["seq"], p["hidden"]) == (cfg.model.num_layers, cfg.model.seq_length,
                                                        cfg.model.hidden_size)
        assert p["layers"] == 22 and p["seq"] == 2048 and p["precision"] == "bf16"
        assert p["parameters"] == parameter_counts(cfg)["total"]
        assert p["micro_batches"][0] == p["micro_batch_start"] and p["micro_batches"][-1] == 1
        assert 0 < p["memory_estimate_bytes"] <= 0.9 * 80 * 2**30
    exports = {(c["dtype"], c["length"]) for c in result["cases"] if c["kind"] == "export"}
    L = cfg.model.train_length
    assert exports == {(d, f * L) for d in ("bf16", "fp32") for f in (1, 8)}


def test_dry_plan_writes_json_and_table_with_machine_and_date(dry):
    result, path, stdout = dry
    md = path.with_suffix(".md").read_text()
    m = result["machine"]
    assert m["torch"] == torch.__version__ and m["date"] in md and "UTC" in m["date"]
    assert result["mode"] == "dry" and "MFU floor 30%" in md and "metrics.py" in result["mfu_floor_why"]
    assert all(f"| {c['name']} |" in md for c in result["cases"])
    assert f"dry plan of {len(result['cases'])} cases" in stdout


def test_long_length_makes_the_square_checks_bite(dry):
    """At the long length an [h, L, L] bias is far over the budget and a single bool [L, L] is
    larger than any O(L) tensor of the call (q in fp32), so both checks can fail."""
    result, _, _ = dry
    (c,) = [c for c in result["cases"] if c["name"].startswith("long/nope")]
    b, h, L, d = c["plan"]["q"]
    assert h * L * L * 2 > 4 * c["plan"]["budget_bytes"]
    assert c["plan"]["square_bytes"] == L * L > 2 * b * h * L * d * 4


@pytest.mark.parametrize("fake,evidence", [("proc/driver/nvidia/version", "driver 580.95.05"),
                                           ("dev/nvidia0", "/dev/nvidia0 exists")])
@pytest.mark.parametrize("dry_flag", [[], ["--dry"]])
def test_unusable_gpu_fails_in_one_line(repo, tmp_path, fake, evidence, dry_flag):
    """An NVIDIA device torch cannot use (here: CUDA hidden from this CPU torch) is exit 1 with one
    line naming the driver and the wheel's CUDA; nothing is written."""
    (tmp_path / fake).parent.mkdir(parents=True)
    (tmp_path / fake).write_text(DRIVER)
    out = tmp_path / "out"
    p = _gpu_check(repo, *dry_flag, "--root", str(tmp_path), "--out-dir", str(out))
    assert p.returncode == 1, p.stdout + p.stderr
    line, = p.stdout.splitlines()
    assert line.startswith("gpu-check: FAILED: an NVIDIA device is here") and evidence in line
    assert f"torch {torch.__version__}" in line and f"wheel CUDA {torch.version.cuda or 'none'}" in line
    assert not out.exists()


def test_skipped_only_without_an_nvidia_device(repo, tmp_path):
    out = tmp_path / "out"
    p = _gpu_check(repo, "--root", str(tmp_path), "--out-dir", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("gpu-check: SKIPPED: no NVIDIA device on this host")
    assert "Nothing was run or measured" in p.stdout and not out.exists()


def test_only_matching_nothing_is_a_failure(repo, tmp_path):
    p = _gpu_check(repo, "--dry", "--only", "no-such-case", "--root", str(tmp_path), "--out-dir", str(tmp_path / "o"))
    assert p.returncode == 1 and p.stdout.startswith("gpu-check: --only 'no-such-case' matches no case")
    assert not (tmp_path / "o").exists()


def test_driver_version_and_evidence(tmp_path):
    from lenext_dist.gpu import probe

    assert probe.driver_version(str(tmp_path)) is None and probe.nvidia_evidence(str(tmp_path)) is None
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / probe.DRIVER_FILE).write_text(DRIVER)
    assert probe.driver_version(str(tmp_path)) == "580.95.05"


def test_backend_names_are_torchs_own_ops():
    """The profiler's op names tell which SDPA backend ran: the CPU fused kernel by default, the
    math kernel when it is the only one allowed (the names exist in this torch)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lenext_dist.gpu.kernels import backends_run

    q = torch.randn(1, 2, 16, 8)

    def call():
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    assert backends_run(call) == {"cpu_fused": 1}
    with sdpa_kernel([SDPBackend.MATH]):
        assert backends_run(call) == {"math": 1}


# ---- the CUDA runners' logic, run on the CPU with a small width ----------------------------------

SMALL = ["model.hidden_size=128", "model.num_attention_heads=4", "model.num_query_groups=2",
         "model.ffn_hidden_size=256", "model.vocab_size=512"]


def _ctx(repo):
    import time
    from types import SimpleNamespace

    return SimpleNamespace(config=str(repo / "configs/exp/tinyllama-1.1b-nope.yaml"), mfu_floor=0.0,
                           extra=SMALL, device=torch.device("cpu"), deadline=time.monotonic() + 600)


def test_attention_runner_names_the_kernel_that_ran(repo):
    """NoPE takes SDPA (the CPU's fused kernel here); ALiBi, planned on FlexAttention for CUDA,
    takes the chunked path on a CPU under autograd: reported as no fused kernel, a failure."""
    from lenext_dist.gpu import run_attention
    from lenext_dist.gpu.plan import Case

    nope = run_attention.run(Case("position/nope", "attention", 64, ["attention.position=nope"]), _ctx(repo))
    assert nope["ok"] and nope["kernel"] == "sdpa:cpu_fused" and not nope["memory_judged"]
    (call,) = nope["calls"]
    assert call["expected"] == "sdpa:flash" and call["sdpa_calls"] == {"cpu_fused": 1}
    alibi = run_attention.run(Case("position/alibi", "attention", 64, ["attention.position=alibi"]), _ctx(repo))
    assert not alibi["ok"] and alibi["calls"][0]["expected"] == "flex"
    assert "no fused kernel: chunked (expected flex)" in alibi["error"]


def test_every_planned_attention_case_runs_its_calls(repo):
    """Each attention case of the plan, at a small length on the CPU: one call per distinct layer
    variant runs forward+backward and reports its kernel; SDPA-planned calls ran the fused CPU op,
    FlexAttention-planned ones the chunked path (no FlexAttention backward on a CPU)."""
    import dataclasses

    from lenext_dist.gpu import plan, run_attention

    for case in plan.attention_cases(256):
        case = dataclasses.replace(case, length=128 if case.length == plan.SHORT else 256)
        r = run_attention.run(case, _ctx(repo))
        assert r["calls"] and len(r["calls"]) == len(plan.distinct_variants(
            plan.case_config(_ctx(repo).config, case, SMALL))), case.name
        for call in r["calls"]:
            want = {"sdpa:flash": "sdpa:cpu_fused", "flex": "chunked"}[call["expected"]]
            assert call["kernel"] == want, (case.name, call)
        assert r["ok"] == all(c["expected"] == "sdpa:flash" for c in r["calls"]), case.name


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_export_runner_compares_training_and_export_logits(repo, megatron_1rank, monkeypatch, dtype):
    """The in-memory export matches the megatron logits; a wrong weight in the export fails it."""
    from lenext_dist.convert import keymap
    from lenext_dist.gpu import run_export
    from lenext_dist.gpu.plan import Case

    case = Case(f"export/{dtype}@1x", "export", 64, [f"train.precision={dtype}"], dtype=dtype)
    r = run_export.run(case, _ctx(repo))
    assert r["ok"], r
    assert 0 <= r["rel_diff"] <= r["tolerance"] and r["max_abs_diff"] >= 0
    convert = keymap.megatron_to_hf

    def one_layer_off(state, shape):
        out = convert(state, shape)
        name = next(k for k in out if k.endswith("mlp.down_proj.weight"))
        out[name] = out[name] * 1.5
        return out

    monkeypatch.setattr(keymap, "megatron_to_hf", one_layer_off)
    bad = run_export.run(case, _ctx(repo))
    assert not bad["ok"] and bad["rel_diff"] > bad["tolerance"] and "logits differ" in bad["error"]


def test_train_runner_measures_a_deepspeed_step(repo, megatron_1rank, monkeypatch):
    """The measurement of a ZeRO-2 bf16 step (a real DeepSpeed engine on the CPU accelerator):
    tokens/s, MFU by the PaLM formula (judged against a datasheet peak only), the SDPA backend seen; and no
    engine outlives its measurement (DeepSpeed's hooks kept it, and its device memory, alive into
    the next case: the H100 check's ZeRO-1 peak held ZeRO-2's states)."""
    import gc

    from deepspeed import DeepSpeedEngine

    from lenext_dist.gpu import run_train
    from lenext_dist.gpu.plan import Case, case_config
    from lenext_dist.train.loop import skip_deepspeed_shm_op

    gc.collect()
    engines = sum(isinstance(o, DeepSpeedEngine) for o in gc.get_objects())  # other tests' leftovers

    monkeypatch.setenv("LOCAL_RANK", "0")  # as the check's _init_one_rank sets it
    skip_deepspeed_shm_op()
    case = Case("train/zero2", "train", 64, ["train.precision=bf16", "parallel.zero_stage=2"])
    cfg = case_config(_ctx(repo).config, case, [*SMALL, "model.num_layers=2", "model.seq_length=64"])
    r = run_train.measure(run_train._with_micro(cfg, 2), 2, 0.0, torch.device("cpu"))
    assert r["ok"], r
    assert r["sdpa_calls"] == {"cpu_fused": 2}  # 2 layers, the one profiled step
    assert r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["micro_batch"] == 2
    # the floor judges MFU over a datasheet's peak only: over a measured one it reads high
    high = run_train.measure(run_train._with_micro(cfg, 2), 2, 10.0, torch.device("cpu"))
    assert high["ok"] and not high["mfu_judged"] and "MFU not judged" in high["note"], high
    monkeypatch.setattr("lenext_dist.train.peak.peak_tflops",
                        lambda device, dtype, override=None: (r["peak_tflops"], "table (a listed device)"))
    high = run_train.measure(run_train._with_micro(cfg, 2), 2, 10.0, torch.device("cpu"))
    assert not high["ok"] and high["mfu_judged"] and "< floor 1000%" in high["error"]
    gc.collect()
    assert sum(isinstance(o, DeepSpeedEngine) for o in gc.get_objects()) == engines


def test_make_gpu_check_without_a_wheelhouse_says_how_to_make_one(repo, tmp_path):
    p = subprocess.run(["make", "--no-print-directory", "gpu-check", f"WHEELHOUSE={tmp_path / 'none'}",
                        f"GPU_SITE={tmp_path / 'site'}"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and not (tmp_path / "site").exists()
    assert p.stdout.startswith(f"gpu-check: no {tmp_path / 'none'}/requirements.txt: run 'make wheelhouse PYVER=")
