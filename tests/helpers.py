"""Helpers for tests that run the real commands (launch/pretrain.py under real launchers)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from lenext_dist.config.load import deep_merge

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# The tiny model of the multi-process tests: 2 layers, GQA, real tokenizer vocabulary.
TINY = {
    "model": {"name": "test-tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "num_query_groups": 2, "ffn_hidden_size": 176, "vocab_size": 4096, "seq_length": 32},
    "train": {"steps": 6, "micro_batch_size": 2, "global_batch_size": 4, "eval_interval": 3,
              "eval_iters": 1},
    "optim": {"lr": 3.0e-3, "warmup_steps": 2},
    "checkpoint": {"interval": 2, "keep_last": 2},
    "logging": {"interval": 1, "tensorboard": False, "peak_tflops": 1.0, "progress_bar": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp: Path, shards: dict, name: str = "run", **sections) -> Path:
    """A full YAML config for the tiny model on `shards` (from the sample_shards fixture)."""
    cfg = json.loads(json.dumps(TINY))
    cfg["name"] = name
    cfg["run_dir"] = str(tmp / name)
    cfg["data"] = {"tokenizer": shards["tokenizer"], "blend": shards["blend"],
                   "valid_blend": shards["valid_blend"]}
    deep_merge(cfg, sections)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def env(threads: int = 1) -> dict:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS=str(threads), DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1",
             MASTER_ADDR="127.0.0.1", TOKENIZERS_PARALLELISM="false")
    e.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    e["PATH"] = f"{BIN}:{e.get('PATH', '')}"
    return e


LAUNCHER = "torchrun"
"""The launcher of tests whose subject is not the launcher: torchrun starts a 2-rank run in about
8 s where DeepSpeed's runner + launch.py take 13-16 s (two more processes importing deepspeed;
measured here, 6 steps of the tiny model). The DeepSpeed launcher, a user's entry point, keeps
tests of its own: test_pretrain_ranks, test_two_nodes, test_concurrent_runs, test_resume's signal
and refusal tests (torchrun adds a traceback of its own to a rank's exit 1), test_run_dir_cli,
test_pretrain_cli, and every `lenext train` (launch.launch_command)."""


def launcher_cmd(launcher: str, nproc: int, port: int) -> list[str]:
    if launcher == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_addr", "127.0.0.1",
                "--master_port", str(port)]
    if launcher == "torchrun":
        return [str(BIN / "torchrun"), "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
                "--master_port", str(port)]
    raise ValueError(launcher)


def pretrain_cmd(config: Path, launcher: str, nproc: int, port: int, *overrides: str) -> list[str]:
    return launcher_cmd(launcher, nproc, port) + [str(REPO / "launch" / "pretrain.py"), "--config",
                                                  str(config), *overrides]


def run(cmd: list[str], timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n--- stdout\n{p.stdout[-6000:]}"
                             f"\n--- stderr\n{p.stderr[-6000:]}")
    return p


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """Start in its own process group so a test can kill -9 the launcher and every rank."""
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL to the launcher's process group and every process under it, as Slurm's kill of a
    job (its cgroup) does: torchrun starts each rank in a session of its own, out of the group."""
    import psutil

    tree = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=60)
    psutil.wait_procs(tree, timeout=60)


def wait_for(pred, timeout: float = 300, every: float = 0.01) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(every)
    return False


def losses(run_dir: Path, key: str = "loss") -> dict[int, float]:
    """step -> training loss (or another logged `key`) from metrics.jsonl."""
    out = {}
    f = Path(run_dir) / "metrics.jsonl"
    for line in f.read_text().splitlines():
        rec = json.loads(line)
        if key in rec:
            out[rec["step"]] = rec[key]
    return out


def tiny_shard(prefix: str, docs=None) -> str:
    """A real megatron .bin/.idx shard at `prefix` (IndexedDatasetBuilder, uint16), one document
    per tensor of `docs`; by default 40 documents of 50 consecutive ids (5 + i .. 54 + i)."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in docs if docs is not None else (torch.arange(5 + i, 55 + i) for i in range(40)):
        b.add_item(d.to(torch.int64))
        b.end_document()
    b.finalize(prefix + ".idx")
    return prefix
