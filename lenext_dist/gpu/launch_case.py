"""`--launch CONFIG`: a short ZeRO-2 training of CONFIG launched as `lenext train` launches it
(DeepSpeed's launcher, `python -m lenext_dist.train` per rank), bf16, NCCL, on all GPUs present.
Its data must exist (in a checkout: `make shards` for configs/exp/tiny-cpu-nope.yaml); off by
default, since a node without network may have no shards.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import torch


def check_zero2(run_dir: Path, config: str) -> dict:
    from lenext_dist.cluster.run_state import preflight
    from lenext_dist.config import load_config, split_cli_overrides
    from lenext_dist.train.launch import launch_command

    n = torch.cuda.device_count()
    overrides = ["--train.precision=bf16", "--parallel.zero_stage=2", "--parallel.backend=nccl",
                 "--train.steps=10", f"--train.global_batch_size={8 * n}", "--train.eval_interval=5",
                 "--checkpoint.interval=0", "--logging.interval=5", "--logging.tensorboard=false",
                 f"--run_dir={run_dir}", "--checkpoint.resume=false"]
    if not os.path.isfile(config):
        return {"ok": False, "error": f"--launch {config} not found (run from a checkout, or name "
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
