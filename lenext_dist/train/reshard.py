"""Resume a ZeRO-1/2 checkpoint at another data-parallel size, from its fp32 master partitions.

DeepSpeed 0.19.8 refuses it ("The checkpoint being loaded used a DP world size of 2 but the
current world size is 1", engine._load_zero_checkpoint) unless the checkpoint is first converted
to its universal format, whose converter (checkpoint/ds_to_universal.py) fails on megatron's
`_extra_state` entries (None). The layout is simple enough to reshard here:

ZeRO-1/2 keep, per param group i, one flat fp32 vector of every trainable parameter of the group
(in the order of optimizer.bit16_groups[i]) padded at its end to a multiple of the DP size and cut
into DP equal partitions; rank r holds partition r (`single_partition_of_fp32_groups[i]`, saved
without its padding as SINGLE_PARTITION_OF_FP32_GROUPS) and the torch optimizer's state of that
partition (exp_avg, exp_avg_sq: same padded shape; step), saved as BASE_OPTIMIZER_STATE with the
padding given by GROUP_PADDINGS. Concatenating the saved ranks' unpadded pieces gives the group's
full vector, which is padded and cut again for the current DP size. ZeRO-1 with bf16 weights and
fp32 gradient accumulation (our bf16 config) runs DeepSpeed's BF16_Optimizer instead, with the
same layout (the padding aligned to 2 x DP) under other names: `fp32_groups_flat_partition`,
saved with its padding (bf16_optimizer.py, state_dict). The module weights come from
the module file (`load_module_only`), the data position from our client state (consumed samples
are global, so the data order does not depend on the rank count).

ZeRO-3 partitions each parameter on its own; resharding it is not done here (refused before the
model is built, with what to do instead).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist

from lenext_dist.errors import CheckpointError

_RANK = re.compile(r"zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


def optim_files(step_dir: Path) -> list[Path]:
    """This step's ZeRO optimizer partitions, in data-parallel rank order."""
    found = [(int(m.group(1)), p) for p in step_dir.glob("*optim_states.pt") if (m := _RANK.search(p.name))]
    return [p for _, p in sorted(found)]


def saved_dp_size(step_dir: Path) -> int:
    """The data-parallel size a checkpoint was written at (0: ZeRO-0, no partitions)."""
    return len(optim_files(Path(step_dir)))


def check_dp_size(step_dir: Path, zero_stage: int, world: int) -> bool:
    """True when resuming at `world` ranks needs resharding; CheckpointError (before any model is
    built) where it cannot be done."""
    saved = saved_dp_size(Path(step_dir))
    if saved in (0, world):
        return False
    if zero_stage not in (1, 2):
        raise CheckpointError(
            f"{step_dir} holds ZeRO-{zero_stage} optimizer partitions of {saved} ranks; this run has "
            f"{world}. Resuming at another rank count works for ZeRO-0, 1 and 2 only: resume with "
            f"{saved} ranks, or start a new run from its weights (checkpoint.init_from; the "
            "optimizer state starts afresh)")
    return True


def partition(full: torch.Tensor, part: torch.Tensor, rank: int, dp: int, where) -> torch.Tensor:
    """Rank `rank`'s piece [part.numel()] of a group's full vector `full` [<= dp * part.numel()]
    zero-padded at its end to dp equal partitions (ZeRO's layout), in part's dtype, on the CPU."""
    n = part.numel()
    if full.numel() > n * dp:
        raise CheckpointError(f"{where}: a param group has {full.numel()} values, more than "
                              f"{dp} x {n}: not this model's optimizer")
    padded = torch.zeros(n * dp, dtype=part.dtype)
    padded[:full.numel()] = full.to(part.dtype)
    return padded[rank * n:(rank + 1) * n]


def unpadded(saved_state: torch.Tensor, padding: int) -> torch.Tensor:
    """A saved rank's partition-shaped Adam state, flat, less the zero padding at its end."""
    return saved_state.reshape(-1)[:saved_state.numel() - padding]


def load_resharded(engine, step_dir: Path) -> dict:
    """Module weights, fp32 masters and Adam state of a ZeRO-1/2 checkpoint written at another DP
    size; returns our client state. Call on every rank."""
    from deepspeed.checkpoint.constants import (BASE_OPTIMIZER_STATE, GROUP_PADDINGS, OPTIMIZER_STATE_DICT,
                                                SINGLE_PARTITION_OF_FP32_GROUPS, ZERO_STAGE)

    from lenext_dist.checkpoint.safe_load import weights_only_loads

    step_dir = Path(step_dir)
    with weights_only_loads(step_dir):
        _, client = engine.load_checkpoint(str(step_dir.parent), tag=step_dir.name,
                                           load_module_only=True, load_optimizer_states=False,
                                           load_lr_scheduler_states=False)
        # memory-mapped: every rank reads every partition (its own piece is cut from their
        # concatenation below); the ranks of a node then share one page-cached copy of the files
        # (1.1B params: ~13 GB of fp32 masters and Adam moments) instead of each holding its own
        saved = [torch.load(f, map_location="cpu", weights_only=True, mmap=True)[OPTIMIZER_STATE_DICT]
                 for f in optim_files(step_dir)]
    opt = engine.optimizer
    group = opt.dp_process_group
    rank, dp = dist.get_rank(group=group), dist.get_world_size(group=group)

    def mine(full: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        return partition(full, part, rank, dp, step_dir).to(part.device)

    def masters(sd: dict, i: int) -> torch.Tensor:
        # ZeRO-1/2 save them unpadded (stage_1_and_2.py state_dict), BF16_Optimizer padded and
        # without a ZERO_STAGE entry (bf16_optimizer.py state_dict)
        m = sd[SINGLE_PARTITION_OF_FP32_GROUPS][i]
        return m.reshape(-1) if ZERO_STAGE in sd else unpadded(m, sd[GROUP_PADDINGS][i])

    parts = getattr(opt, "single_partition_of_fp32_groups", None) or opt.fp32_groups_flat_partition
    for i, part in enumerate(parts):
        part.data.copy_(mine(torch.cat([masters(sd, i) for sd in saved]), part))
        states = [sd[BASE_OPTIMIZER_STATE]["state"].get(i, {}) for sd in saved]
        new = {}
        for key, value in states[0].items():
            if torch.is_tensor(value) and value.dim() > 0:  # partition-shaped: exp_avg, exp_avg_sq
                pieces = [unpadded(s[key], sd[GROUP_PADDINGS][i]) for s, sd in zip(states, saved)]
                new[key] = mine(torch.cat(pieces), part).clone()
            else:  # the step count, the same on every rank (checkpoint.load places it for a fused
                # kernel: optim.settings_kept)
                new[key] = value.clone() if torch.is_tensor(value) else value
        if new:
            opt.optimizer.state[part] = new
    return client
