"""`--launch CONFIG`: short trainings of CONFIG started as users start them, bf16, NCCL:
- launch/zero2: ZeRO-2 through DeepSpeed's launcher (`lenext train`), on all GPUs present;
- launch/gpu-per-task: one rank as a Slurm task shown only its own GPU (`--gpus-per-task=1`):
  local rank 3 of 4 with one visible device, which is index 0 for it (train/device.py).
Its data must exist (in a checkout: `make shards` for configs/exp/tiny-cpu-nope.yaml); off by
default, since a node without network may have no shards.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _overrides(run_dir: Path, zero: int, batch: int) -> list[str]:
    return ["--train.precision=bf16", f"--parallel.zero_stage={zero}", "--parallel.backend=nccl",
            "--train.steps=10", f"--train.global_batch_size={batch}", "--train.eval_interval=5",
            "--checkpoint.interval=0", "--logging.interval=5", "--logging.tensorboard=false",
            f"--run_dir={run_dir}", "--checkpoint.resume=false"]


def _unready(config: str, overrides: list[str]) -> Optional[str]:
    """Why CONFIG cannot be trained here (missing, or its data not made), or None."""
    from lenext_dist.cluster.run_state import preflight
    from lenext_dist.config import load_config, split_cli_overrides

    if not os.path.isfile(config):
        return f"--launch {config} not found (run from a checkout, or name a config)"
    problems = preflight(load_config(config, split_cli_overrides(overrides)))
    if problems:
        return "; ".join(problems) + " (make its data first: in a checkout, `make shards`)"
    return None


LAUNCH_BOUND_S = 300.0
"""A launch case's time bound (its steps take seconds): a rank that hangs, e.g. in a collective
waiting on a peer that died, would otherwise hold the check until DeepSpeed's own 10 minutes."""


def launch(cmd: list[str], env: dict) -> tuple[Optional[int], str]:
    """(exit status, stderr) of `cmd` in a session of its own; past LAUNCH_BOUND_S the whole
    session (launcher and ranks) is killed and the status is None."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=LAUNCH_BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return None, p.communicate()[1]
    return p.returncode, err


def _run(cmd: list[str], env: dict, run_dir: Path) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)  # this check's own scratch run, started afresh
    t0 = time.perf_counter()
    rc, err = launch(cmd, env)
    recs = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    out = {"ok": rc == 0, "seconds": round(time.perf_counter() - t0, 1), "records": recs[-3:],
           "stderr_tail": err[-2000:] if rc else ""}
    if rc is None:
        out["error"] = f"not done within {LAUNCH_BOUND_S:.0f} s: launcher and ranks killed"
    return out


def check_zero2(run_dir: Path, config: str) -> dict:
    from lenext_dist.train.launch import launch_command

    n = torch.cuda.device_count()
    overrides = _overrides(run_dir, 2, 8 * n)
    error = _unready(config, overrides)
    if error:
        return {"ok": False, "error": error}
    # the launcher sets each rank's own RANK / LOCAL_RANK / WORLD_SIZE / MASTER_PORT
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    return {"gpus": n, **_run(launch_command(config, n, None, overrides), env, run_dir)}


def check_gpu_per_task(run_dir: Path, config: str) -> dict:
    """One rank that sees one GPU at local rank 3: DeepSpeed bound cuda:$LOCAL_RANK ("invalid device
    ordinal"). One rank binds no NCCL communicator (train/group.py bind_group), so this checks the
    device choice and the engine's; the communicator's binding needs two GPUs, one a task."""
    from lenext_dist.train.launch import MODULE, free_port

    overrides = _overrides(run_dir, 0, 8)
    error = _unready(config, overrides)
    if error:
        return {"ok": False, "error": error}
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    env = {**{k: v for k, v in os.environ.items() if k not in _RANK_VARS},
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": visible}
    return {"gpus": 1, **_run([sys.executable, "-m", MODULE, "--config", config, *overrides], env, run_dir)}
