"""Which device a rank uses, and the check that a GPU job really sees a GPU.

Pure functions first (tested with simulated device counts and environments), then the thin
wrappers `init_distributed` calls.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from lenext_dist.config import ConfigError


def visible_device_index(local_rank: int, device_count: int) -> int:
    """The index (among the devices this process sees) of the device of local rank `local_rank`.

    - Every GPU of the node visible to every task (`--gpus-per-node`, torchrun, the deepspeed
      launcher): device_count >= ranks per node and the index is LOCAL_RANK.
    - Slurm shows each task only its own GPU (`--gpus-per-task=1`, `--gpu-bind=single:1`, many
      site defaults): CUDA_VISIBLE_DEVICES names one GPU, device_count is 1, and the index is 0
      for every rank (LOCAL_RANK 3 would be "invalid device ordinal").
    - A task shown k > 1 GPUs that do not include its LOCAL_RANK: ambiguous, refused.
    """
    if device_count < 1:
        raise ConfigError("no accelerator device is visible to this process "
                          "(CUDA_VISIBLE_DEVICES empty?); check the job's GPU allocation")
    if local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    raise ConfigError(
        f"LOCAL_RANK {local_rank} but this task sees only {device_count} devices "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): give every "
        "task all GPUs of its node (--gpus-per-node) or exactly one (--gpus-per-task=1)")


def launcher_devices(nproc: int, env: Mapping[str, str] = os.environ, flag: str = "--nproc") -> Optional[list[int]]:
    """The devices a DeepSpeed launcher is to start `nproc` local ranks on: the first `nproc` of
    CUDA_VISIBLE_DEVICES when it names some (a shared workstation, a Slurm step without device
    cgroups), None when it is unset or empty (devices 0..nproc-1; a CPU run).

    DeepSpeed's runner drops the variable when told --num_gpus, and its launch.py sets it to the
    world_info's ids: left to themselves both start the ranks on devices 0..N-1, which may be
    another job's. torchrun leaves the variable alone (LOCAL_RANK indexes the visible devices)."""
    text = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not text or env.get("DS_ACCELERATOR", "").lower() == "cpu":
        return None
    names = [x.strip() for x in text.split(",")]
    if not all(x.isdigit() for x in names):
        raise ConfigError(f"CUDA_VISIBLE_DEVICES={text}: DeepSpeed's launcher takes device indices "
                          "(not UUIDs or MIG names); give indices, or launch with torchrun")
    if nproc > len(names):
        raise ConfigError(f"{flag} {nproc}: CUDA_VISIBLE_DEVICES={text} gives this process "
                          f"{len(names)} device(s); lower {flag} or make more devices visible")
    return [int(x) for x in names[:nproc]]


def gpu_job_reason(backend: Optional[str], env: Mapping[str, str]) -> Optional[str]:
    """Why this run is a GPU job (a string naming the setting), or None for a CPU job.

    Signals: `parallel.backend: nccl`, DS_ACCELERATOR=cuda, or Slurm GPUs allocated to the job
    (SLURM_GPUS_ON_NODE > 0) without an explicit gloo backend (a CPU run on a GPU node that sets
    parallel.backend=gloo on purpose is left alone).
    """
    if backend == "nccl":
        return "parallel.backend is nccl"
    if env.get("DS_ACCELERATOR", "").lower() == "cuda":
        return "DS_ACCELERATOR=cuda"
    gpus = env.get("SLURM_GPUS_ON_NODE", "")
    if backend is None and gpus.isdigit() and int(gpus) > 0:
        return f"Slurm allocated SLURM_GPUS_ON_NODE={gpus} GPUs"
    return None


def check_gpu_visible(backend: Optional[str], env: Mapping[str, str] = os.environ,
                      cuda_available: Optional[bool] = None) -> None:
    """Pre-flight: a GPU job must see CUDA, else it would start on CPU with gloo (slowly, or hang
    at the first NCCL call). Raises ConfigError (exit 2, one line) naming the reason and the fix."""
    reason = gpu_job_reason(backend, env)
    if reason is None:
        return
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        import torch

        raise ConfigError(
            f"this is a GPU job ({reason}) but torch {torch.__version__} sees no CUDA device "
            f"(CPU-only wheel, or no GPU visible: CUDA_VISIBLE_DEVICES="
            f"{env.get('CUDA_VISIBLE_DEVICES', '<unset>')}); install the CUDA torch build "
            "(docs/cluster.md) or set parallel.backend=gloo for a CPU run")


LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                   "SLURM_LOCALID")
"""Where the rank within the node is found, first match wins: torchrun / deepspeed, Open MPI,
MVAPICH, srun tasks. Read before the process group exists (DeepSpeed's MPI discovery would set
LOCAL_RANK only inside init_distributed, after the device must already be chosen for NCCL)."""


def local_rank(env: Mapping[str, str] = os.environ) -> int:
    """The rank within this node (0 when no launcher says)."""
    return next((int(env[k]) for k in LOCAL_RANK_VARS if env.get(k, "").isdigit()), 0)
