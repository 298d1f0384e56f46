"""megatron-core global state on top of an already initialized torch.distributed.

megatron keeps process groups and RNG trackers in module globals (`parallel_state`,
`tensor_parallel.random`). This module sets them up the same way on CPU and GPU:

- `initialize_model_parallel(1, 1)`: tensor and pipeline parallel are fixed at 1 (DeepSpeed ZeRO
  does the data parallelism). torch.distributed must already be up (the training loop calls
  `deepspeed.init_distributed`; tests make a 1-rank gloo group).
- RNG: on CUDA megatron's normal `model_parallel_cuda_manual_seed` (it seeds CUDA generators and
  registers the tracker states dropout forks from). On CPU that function calls
  `torch.cuda.manual_seed` / `torch.cuda.get_rng_state` and fails, so we install megatron's own
  *inference* tracker (`initialize_rng_tracker(inference_rng_tracker=True)`: `fork()` is a no-op,
  `add()` ignored) and seed the CPU generator. This is enough because our models have no dropout
  and no activation recompute (both use the tracker); weights are initialized with
  `use_cpu_initialization=True`, i.e. from the default torch generator.
"""
from __future__ import annotations

import torch


def accelerator_name() -> str:
    """'cpu', 'cuda', ... from DeepSpeed's accelerator (honours DS_ACCELERATOR)."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name()


def current_device() -> torch.device:
    """The accelerator device of this rank ('cpu', or e.g. 'cuda:3' as set by the launcher)."""
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


def on_cpu() -> bool:
    return accelerator_name() == "cpu"


def init_single_process_group() -> bool:
    """Make a 1-rank gloo group in memory (a `HashStore`: no port, no file) if torch.distributed
    is not initialized yet; returns whether it did. For the dry run and tests, which need
    megatron's parallel groups but no real communication."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def init_megatron(seed: int) -> None:
    """Idempotent: set up megatron's parallel state (TP = PP = 1) and RNG for `seed`.

    Raises RuntimeError if torch.distributed is not initialized.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        raise RuntimeError("init_megatron needs torch.distributed initialized first "
                           "(deepspeed.init_distributed or dist.init_process_group)")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1,
                                                 pipeline_model_parallel_size=1)
    torch.manual_seed(seed)
    if on_cpu():
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    else:
        from deepspeed.accelerator import get_accelerator

        get_accelerator().manual_seed_all(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)


def destroy_megatron() -> None:
    """Undo `init_megatron` (tests: a later init_megatron starts fresh); keeps torch.distributed."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
