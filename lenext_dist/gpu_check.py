"""`make gpu-check`: what the CPU test suite cannot see, run on the GPUs of this machine.

    python -m lenext_dist.gpu_check [--out runs/gpu-check/gpu_check.json] [--quick] [--config C]

Without a CUDA device it prints why it skipped and exits 0 (nothing is measured). With one:

1. variants: a few bf16 steps of a small model under a real DeepSpeed engine (ZeRO-2, 1 GPU) for
   every registered position variant x HeadScale mode (off, fixed c = 1.2, trainable);
   passes when every loss is finite and, for trainable scales, m_h moved in fp32.
2. zero2: a short training of --config (default configs/exp/tiny-cpu-nope.yaml, read from the
   working directory: a checkout, whose sample shards `make gpu-check` makes first) launched as
   `lenext train` launches it (DeepSpeed's launcher, `python -m lenext_dist.train` per rank),
   ZeRO-2, bf16, NCCL, on all GPUs present.
3. eval_8x: no-grad forward of a TinyLlama-width 2-layer model (L = 2048) at 8 L = 16384
   tokens, fp32 and bf16, NoPE (SDPA + GQA) and ALiBi (bias path), with the peak memory: passes
   without out-of-memory (the math kernel's [b, h, L, L] would be 34 GB fp32 per layer call).
4. throughput: the TinyLlama-1.1B shape at 4 layers (seq 2048, bf16, ZeRO-0, 1 GPU): tokens/s,
   model TFLOP/s (PaLM 6N + 12LHQT) and MFU against the device's dense bf16 peak
   (lenext_dist/train/peak.py).

Everything is written to one JSON (device, versions, date, per-section results; see
docs/cluster.md). Exit status 1 when a section failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ZERO2_CONFIG = "configs/exp/tiny-cpu-nope.yaml"
"""The zero2 section's default config, relative to the working directory (a checkout)."""
HS_MODES = {
    "off": ["attention.head_scale.enabled=false"],
    "fixed_1.2": ["attention.head_scale.enabled=true", "attention.head_scale.trainable=false",
                  "attention.head_scale.init=1.2"],
    "trainable": ["attention.head_scale.enabled=true", "attention.head_scale.trainable=true",
                  "attention.head_scale.init=1.2"],
}
SMALL = ["model.num_layers=2", "model.hidden_size=256", "model.num_attention_heads=4",
         "model.num_query_groups=2", "model.ffn_hidden_size=704", "model.vocab_size=4096",
         "model.seq_length=256"]
TINYLLAMA = ["model.hidden_size=2048", "model.num_attention_heads=32", "model.num_query_groups=4",
             "model.ffn_hidden_size=5632", "model.vocab_size=32000", "model.seq_length=2048"]


def skip_reason() -> str | None:
    """Why this machine cannot run the check (None when it can)."""
    if not torch.cuda.is_available():
        return (f"no CUDA device visible to torch {torch.__version__} "
                f"(CUDA build: {torch.version.cuda or 'none, a CPU-only wheel'})")
    return None


def _cfg(*overrides):
    from lenext_dist.config import load_config

    return load_config(None, list(overrides))


def _batch(cfg, b: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    s, v = cfg.model.seq_length, cfg.model.vocab_size
    ids = torch.randint(0, v, (b, s + 1), generator=gen).cuda()
    return dict(input_ids=ids[:, :-1], position_ids=torch.arange(s, device="cuda").expand(b, s),
                attention_mask=None, labels=ids[:, 1:])


def check_variants(steps: int = 3) -> dict:
    from deepspeed.utils import safe_get_full_fp32_param

    from lenext_dist.attention import POSITIONS
    from lenext_dist.model import build_model, head_scale_parameters
    from lenext_dist.train import fp32_params, optim

    out = {}
    for position in POSITIONS:
        for mode, hs in HS_MODES.items():
            cfg = _cfg(*SMALL, *hs, f"attention.position={position}", "train.precision=bf16",
                       "parallel.zero_stage=2", "train.micro_batch_size=4",
                       "train.global_batch_size=4")
            engine = optim.build_engine(build_model(cfg), cfg, 1)
            before = [safe_get_full_fp32_param(p).clone() for _, p in head_scale_parameters(engine.module)
                      if p.requires_grad]
            losses = []
            for i in range(steps):
                optim.set_lr(engine.optimizer, 1e-3)
                loss = engine(**_batch(cfg, 4, seed=i)).float().mean()
                engine.backward(loss)
                engine.step()
                fp32_params.refresh(engine)
                losses.append(loss.item())
            after = [safe_get_full_fp32_param(p) for _, p in head_scale_parameters(engine.module)
                     if p.requires_grad]
            moved = all(not torch.equal(a, b) for a, b in zip(after, before)) if before else None
            ok = all(map(lambda x: x == x and abs(x) < 1e4, losses)) and moved is not False
            out[f"{position}/{mode}"] = {"losses": losses, "head_scales_moved": moved, "ok": ok}
            del engine  # its buffers go before the next variant's engine is built
            torch.cuda.empty_cache()
    return {"ok": all(r["ok"] for r in out.values()), "runs": out}


def check_zero2(run_dir: Path, config: str = ZERO2_CONFIG) -> dict:
    from lenext_dist.cluster.run_state import preflight
    from lenext_dist.config import load_config, split_cli_overrides
    from lenext_dist.train.launch import launch_command

    n = torch.cuda.device_count()
    overrides = ["--train.precision=bf16", "--parallel.zero_stage=2", "--parallel.backend=nccl",
                 "--train.steps=10", f"--train.global_batch_size={8 * n}", "--train.eval_interval=5",
                 "--checkpoint.interval=0", "--logging.interval=5", "--logging.tensorboard=false",
                 f"--run_dir={run_dir}", "--checkpoint.resume=false"]
    if not os.path.isfile(config):
        return {"ok": False, "error": f"--config {config} not found (run from a checkout, or name "
                "a config)"}
    problems = preflight(load_config(config, split_cli_overrides(overrides)))
    if problems:
        return {"ok": False, "error": "; ".join(problems) + " (make its data first: in a checkout, "
                "`make shards`)"}
    cmd = launch_command(config, n, None, overrides)
    shutil.rmtree(run_dir, ignore_errors=True)  # this check's own scratch run, started afresh
    t0 = time.perf_counter()
    # the launcher sets each rank's own RANK / LOCAL_RANK / WORLD_SIZE / MASTER_PORT
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    recs = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return {"ok": p.returncode == 0, "gpus": n, "seconds": round(time.perf_counter() - t0, 1),
            "records": recs[-3:], "stderr_tail": p.stderr[-2000:] if p.returncode else ""}


@torch.no_grad()
def check_eval_8x(factor: int = 8) -> dict:
    from lenext_dist.model import build_model

    out = {}
    for precision in ("fp32", "bf16"):
        for position in ("nope", "alibi"):
            cfg = _cfg(*TINYLLAMA, "model.num_layers=2", f"train.precision={precision}",
                       f"attention.position={position}", "train.micro_batch_size=1",
                       "train.global_batch_size=1")
            model = build_model(cfg).eval()
            s = factor * cfg.model.train_length  # factor x L, the training length
            ids = torch.randint(0, cfg.model.vocab_size, (1, s), device="cuda")
            torch.cuda.reset_peak_memory_stats()
            key = f"{precision}/{position}@{s}"
            try:
                t0 = time.perf_counter()
                logits = model(ids, torch.arange(s, device="cuda")[None], None)
                torch.cuda.synchronize()
                out[key] = {"ok": bool(torch.isfinite(logits).all()),
                            "seconds": round(time.perf_counter() - t0, 2),
                            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
                del logits
            except torch.cuda.OutOfMemoryError as e:
                out[key] = {"ok": False, "error": f"out of memory: {str(e)[:200]}"}
            del model
            torch.cuda.empty_cache()
    return {"ok": all(r["ok"] for r in out.values()), "runs": out}


def check_throughput(layers: int = 4, micro: int = 4, steps: int = 10, warmup: int = 3) -> dict:
    from lenext_dist.model import build_model, flops_per_token
    from lenext_dist.train import optim
    from lenext_dist.train.peak import device_name, peak_tflops

    cfg = _cfg(*TINYLLAMA, f"model.num_layers={layers}", "train.precision=bf16",
               "parallel.zero_stage=0", f"train.micro_batch_size={micro}",
               f"train.global_batch_size={micro}")
    engine = optim.build_engine(build_model(cfg), cfg, 1)
    batch = _batch(cfg, micro)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        loss = engine(**batch).float().mean()
        engine.backward(loss)
        engine.step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tok_s = micro * cfg.model.seq_length / dt
    tflops = tok_s * flops_per_token(cfg) / 1e12
    peak, src = peak_tflops("cuda", torch.bfloat16)
    del engine
    torch.cuda.empty_cache()
    return {"ok": True, "shape": f"TinyLlama width, {layers} layers, seq {cfg.model.seq_length}, "
            f"micro {micro}, bf16, ZeRO-0, 1 GPU", "device": device_name("cuda"),
            "tokens_per_s": round(tok_s), "model_tflops": round(tflops, 1),
            "peak_tflops": peak, "peak_source": src, "mfu": round(tflops / peak, 4),
            "step_s": round(dt, 4), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def _init_one_rank() -> None:
    import deepspeed

    from lenext_dist.model import init_megatron
    from lenext_dist.train.loop import skip_deepspeed_shm_op

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": os.environ.get("MASTER_PORT", "29517")}.items():
        os.environ.setdefault(k, v)
    skip_deepspeed_shm_op()
    torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend="nccl", verbose=False)
    init_megatron(1234)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/gpu-check/gpu_check.json", help="result JSON")
    ap.add_argument("--quick", action="store_true", help="skip the multi-GPU launch (zero2)")
    ap.add_argument("--config", default=ZERO2_CONFIG,
                    help=f"config of the zero2 launch, its data made (default {ZERO2_CONFIG})")
    args = ap.parse_args(argv)
    reason = skip_reason()
    if reason:
        print(f"gpu-check: SKIPPED: {reason}. Nothing was run or measured; run `make gpu-check` "
              "on a machine with an NVIDIA GPU and the CUDA torch build.")
        return 0
    import deepspeed

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _init_one_rank()
    from lenext_dist.train.peak import device_name

    result = {"device": device_name("cuda"), "gpus": torch.cuda.device_count(),
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "deepspeed": deepspeed.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    sections = [("variants", check_variants), ("eval_8x", check_eval_8x),
                ("throughput", check_throughput)]
    if not args.quick:
        sections.append(("zero2", lambda: check_zero2(out.parent.resolve() / "zero2", args.config)))
    for name, fn in sections:
        print(f"gpu-check: {name} ...", flush=True)
        try:
            result[name] = fn()
        except Exception as e:  # noqa: BLE001 - record the failure, go on with the next section
            result[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(f"gpu-check: {name}: {'ok' if result[name]['ok'] else 'FAILED'}", flush=True)
        out.write_text(json.dumps(result, indent=1))
    print(f"gpu-check: results in {out}")
    return 0 if all(result[n]["ok"] for n, _ in sections) else 1


if __name__ == "__main__":
    sys.exit(main())
