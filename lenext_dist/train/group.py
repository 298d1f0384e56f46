"""The process group of a run: torch.distributed through DeepSpeed from any launcher (or none),
and its orderly end. Split out of train/loop.py, which re-exports these names."""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from lenext_dist.config import ConfigError, RunConfig
from lenext_dist.train.device import check_gpu_visible, local_rank, visible_device_index


def skip_deepspeed_shm_op() -> None:
    """Keep DeepSpeed from building its CPU shared-memory all-reduce.

    Its CPU backend JIT-compiles that op in every new environment (a minute of g++) and each rank
    of each run then leaves a 66 MB /dev/shm buffer behind that is never unlinked (hundreds of runs
    filled this machine's memory). Only DeepSpeed-Inference's inference_all_reduce uses it; training
    collectives go through torch.distributed. Marking the op incompatible is DeepSpeed's own switch
    (deepspeed/comm/torch.py:build_shm_op). Call before deepspeed.init_distributed/initialize.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


# Set by mpirun/mpiexec (Open MPI, MPICH/Intel MPI's Hydra PMI, PMIx, MVAPICH) and by srun
_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def _launched(environ) -> bool:
    """Started by a launcher, MPI or an srun of several tasks. A step of one task (`srun --pty
    bash`, `salloc`, a one-task batch step) with no MPI variable is a shell a user runs a single
    process in: left to DeepSpeed's MPI discovery it failed on mpi4py, a dev extra."""
    one_srun_task = environ.get("SLURM_STEP_NUM_TASKS") == "1"
    return "RANK" in environ or any(k in environ for k in _MPI_ENV
                                    if not (one_srun_task and k == "SLURM_STEP_NUM_TASKS"))


def one_process_env(environ=os.environ) -> bool:
    """`python -m lenext_dist.train` with no launcher: set the env:// variables of a one-rank group.

    DeepSpeed's auto MPI discovery runs whenever RANK/WORLD_SIZE/... are missing and imports
    mpi4py (a dev extra here), so a plain package install failed with ModuleNotFoundError. Only a
    process started by MPI or srun (one of _MPI_ENV set) is left to that discovery."""
    if _launched(environ):
        return False
    import socket

    port = environ.get("MASTER_PORT")
    if not port:  # a free port: several one-process runs may share a machine
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
    environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR=environ.get("MASTER_ADDR", "127.0.0.1"), MASTER_PORT=port)
    return True


_ENV_RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
"""DeepSpeed's own test for an env:// launch (comm.init_distributed's required_env); without one of
them it runs its MPI discovery, which sets them, and binds the group itself."""


def bind_group(backend: str, device: torch.device) -> None:
    """The env:// process group, its NCCL communicator bound to `device`, the one this rank chose.

    DeepSpeed would bind it to cuda:$LOCAL_RANK (deepspeed/comm/torch.py, init_process_group's
    device_id), which a task shown only its own GPU does not have: torch refuses "device_id cuda:3
    is out of range". DeepSpeed adopts a group that exists (comm.init_distributed), with the same
    arguments as its own otherwise: its timeout (DEEPSPEED_TIMEOUT), no device bound for one rank
    (DeepSpeed #8248: a bound group splits every later new_group over NCCL, with no peer to reach).
    """
    from deepspeed.constants import default_pg_timeout

    bound = {"device_id": device} if int(os.environ["WORLD_SIZE"]) != 1 else {}
    dist.init_process_group(backend, init_method="env://", timeout=default_pg_timeout, **bound)


def init_distributed(cfg: RunConfig) -> tuple[int, int]:
    """torch.distributed through DeepSpeed (env:// from any launcher, or MPI discovery)."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    check_gpu_visible(cfg.parallel.backend)  # before DeepSpeed picks an accelerator (CPU fallback)
    skip_deepspeed_shm_op()

    acc = get_accelerator()
    backend = cfg.parallel.backend or acc.communication_backend_name()
    if acc.device_name() == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # N ranks on one host would each take every core and thrash; share the cores instead.
        # ranks per host as told by torchrun / deepspeed / Open MPI / Slurm
        local = next((int(os.environ[k]) for k in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE") if k in os.environ), 1)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    device = None
    if acc.device_name() != "cpu":  # Slurm may show each task only its own GPU: index 0;
        # set before the process group so NCCL binds each rank to its own device
        index = visible_device_index(local_rank(), acc.device_count())
        acc.set_device(index)
        device = torch.device(acc.device_name(index))
    if not dist.is_initialized():
        one_process_env()
        if not all(k in os.environ for k in _ENV_RENDEZVOUS):
            # MPI discovery ignores MASTER_PORT unless it is passed as distributed_port
            _discover_rendezvous(int(os.environ.get("MASTER_PORT", 29500)))
        with _port_in_use_named():
            if device is not None:
                bind_group(backend, device)
            deepspeed.init_distributed(dist_backend=backend, verbose=False)  # adopts the group, if made
    return dist.get_rank(), dist.get_world_size()


def _discover_rendezvous(port: int) -> None:
    """DeepSpeed's discovery of the env:// variables (its comm.init_distributed: Azure ML, SageMaker,
    else mpi4py over MPI or srun --mpi=pmix), run before the group is made so that a GPU rank binds
    the device it chose: DeepSpeed's own group binds cuda:$LOCAL_RANK, out of range where Slurm
    shows each task its GPU only (--gpus-per-task=1: LOCAL_RANK 3, one device)."""
    from deepspeed.comm import comm as ds

    if ds.in_aml() and not ds.in_dlts():
        ds.patch_aml_env_for_torch_nccl_backend(verbose=False)
    elif ds.in_aws_sm():
        ds.patch_aws_sm_env_for_torch_nccl_backend(verbose=False)
    else:
        try:
            ds.mpi_discovery(distributed_port=port, verbose=False)
        except ImportError:
            started = next((k for k in _MPI_ENV if k in os.environ), "no launcher variable")
            raise ConfigError(f"this process was started by MPI or srun ({started} set) but mpi4py, "
                              "which finds the ranks then, is not installed: pip install mpi4py, or "
                              "start the ranks with torchrun, deepspeed or `python -m "
                              "lenext_dist.cluster task`") from None


@contextlib.contextmanager
def _port_in_use_named():
    """Rank 0's rendezvous store on a port another process holds (another run, a torchrun at the
    default 29500): a one-line error naming the port instead of every rank's traceback."""
    try:
        yield
    except dist.DistNetworkError as e:
        if "EADDRINUSE" not in str(e):
            raise
        raise ConfigError(f"MASTER_PORT {os.environ.get('MASTER_PORT')}: in use on this host (another "
                          "run?); pass `lenext train --port` a free one, or leave it unset for a free "
                          "port") from None


def shutdown_distributed() -> None:
    """Tear the process group down while the interpreter is still whole.

    Exiting with a live gloo group lets its worker threads outlive Python: async work still holding
    tensors (ZeRO-3's parameter prefetch) is destroyed during finalization and the rank aborts with
    SIGABRT, "terminate called without an active exception" (pytorch/pytorch#190489; seen here as a
    ZeRO-3 rank exiting -6 after its last step). Called only after a clean finish, when every rank is
    here: after an error another rank may still sit in a collective and destroying would hang
    (torchtitan #1342), so errors leave the group to the process exit.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
