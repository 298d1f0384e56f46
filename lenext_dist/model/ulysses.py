"""DeepSpeed-Ulysses sequence parallelism (`parallel.ulysses_size` = N > 1).

Layout: ranks [i N, (i + 1) N) form sequence-parallel group i (DeepSpeed's
`runtime/sequence_parallel/parallel_state_sp`, passed to `deepspeed.initialize` as `mpu`); the
data-parallel size is world / N. Every rank of a group reads the same samples and keeps its
sequence shard s/N of tokens, labels, loss mask and position ids (`shard_batch`); document ids
stay whole (the attention sees the whole sequence). The transformer runs on [s/N, b, H] shards;
around the project's core attention `deepspeed.sequence.layer.DistributedAttention` all-to-alls
q/k/v from sequence shards [s/N, b, h, d] to head shards [s, b, h/N, d] and back
(Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509, sec. 3). Inside, this rank computes
query heads [r h/N, (r + 1) h/N) (r: rank in the group) over the whole sequence, so positions are
global as they are (RoPE, XPOS, the log-length scale, windows, document ids) and per-head
quantities are sliced at the head offset: m_h (head_scale; indexing keeps autograd, so m_h
gradients land on this rank's entries and DeepSpeed's sum over the group fills the rest) and the
rows of the ALiBi / KERPLE / Sandwich bias table (`PositionVariant.heads`).

GQA: the KV heads g must split over N ranks so that each query head lands beside its group. When
N does not divide g, k/v are repeated (repeat_interleave, megatron's group order) to lcm(g, N)
heads before the all-to-all: query head j still reads original group j // (h / g). Costs
(lcm / g - 1) x the k/v all-to-all bytes; the alternative (refusing g < N) would bar TinyLlama
(g = 4) from SP = 8.

Gradients: DeepSpeed reduces over the sequence-data-parallel group (the whole world) and divides
by world / N (engine._reduce_non_expert_gradients, zero/stage_1_and_2.py average_tensor), i.e.
sums over the N ranks of a group and averages over data parallelism. So each rank's loss is its
shard's sum over the *group's* token count (`loss_denominator`); the N partial losses add up to
the sequence mean. ZeRO-3 is the exception: `backward_factor`.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

_SHARDED = ("tokens", "labels", "loss_mask", "position_ids")  # [b, s] tensors cut along s
_state: dict = {}  # {"size": N, "mpu": parallel_state_sp}


def init_sequence_parallel(size: int):
    """Build the sequence-parallel groups of size `size` (all ranks call it); returns the `mpu`
    for deepspeed.initialize, or None for size 1. Idempotent for the same size."""
    if size == 1:
        _state.clear()
        return None
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu

    if _state.get("size") != size:
        mpu._release_sequence_parallel_groups()
        mpu.initialize_sequence_parallel(size)
        _state.update(size=size, mpu=mpu)
    return _state["mpu"]


def size() -> int:
    return _state.get("size", 1)


def group():
    return _state["mpu"].get_sequence_parallel_group()


def rank() -> int:
    return _state["mpu"].get_sequence_parallel_rank() if size() > 1 else 0


def data_parallel(world_rank: int, world: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel size): the group's index and the number of groups."""
    n = size()
    return world_rank // n, world // n


def shard_batch(batch: dict) -> dict:
    """This rank's sequence shard of a micro-batch (same samples on every rank of the group)."""
    n = size()
    if n == 1:
        return batch
    r = rank()
    out = dict(batch)
    for k in _SHARDED:
        s = batch[k].shape[1]
        out[k] = batch[k][:, r * s // n:(r + 1) * s // n]  # [b, s/N]
    return out


def loss_denominator(mask_sum: Tensor) -> Tensor:
    """Loss-mask tokens of the whole sequence: the sum of `mask_sum` over the group (no grad)."""
    if size() == 1:
        return mask_sum
    total = mask_sum.detach().clone()
    dist.all_reduce(total, group=group())
    return total


def backward_factor(zero_stage: int) -> int:
    """What each rank's loss is multiplied by before the backward so the reduced gradient is the
    sum over the group and the mean over data parallelism.

    DeepSpeed 0.19.8 ZeRO-3 reduce-scatters every gradient over the sequence-data-parallel group
    (world W = dp x N) and divides by W (stage3.py `__avg_scatter_grads` ->
    comm/coalesced_collectives.py `reduce_scatter_coalesced`, which pre-divides by the group size):
    unlike its all-reduce paths (stage3.py `__avg_scatter_contiguous_grads`, `allreduce_bucket`) it
    never multiplies the sequence-parallel size back. So under ZeRO-3 the loss carries x N
    (the config pins `reduce_scatter` so every bucket takes that path). Measured without it on 2
    ranks: the gradient norm halved at ulysses 2; tests/distributed/test_ulysses.py compares the
    norms, so a DeepSpeed that fixes this fails there rather than doubling gradients silently."""
    return size() if zero_stage == 3 else 1


def kv_repeat(num_heads: int, num_kv: int, n: int) -> int:
    """How many times k/v heads are repeated so that n ranks split them evenly (1: not at all)."""
    if num_heads % n:
        raise ValueError(f"{num_heads} attention heads do not split over sequence parallel size {n}")
    return math.lcm(num_kv, n) // num_kv


class UlyssesAttention(torch.nn.Module):
    """`local(q, k, v)` ([b, h/N, s, d] -> same) inside DeepSpeed's DistributedAttention.

    forward: query [s/N, b, h, d], key/value [s/N, b, g, d] -> [s/N, b, h, d]."""

    def __init__(self, num_heads: int, num_kv: int):
        super().__init__()
        from deepspeed.sequence.layer import DistributedAttention

        n = size()
        self.repeat = kv_repeat(num_heads, num_kv, n)
        r, per = rank(), num_heads // n
        self.heads = (r * per, (r + 1) * per)  # this rank's query heads after the all-to-all
        # scatter the heads (dim 2), gather the sequence (dim 0); batch is dim 1
        self.dist_attn = DistributedAttention(_Local(), group(), scatter_idx=2, gather_idx=0,
                                              num_kv_heads=num_kv * self.repeat)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, local: Callable) -> Tensor:
        if self.repeat > 1:  # [s/N, b, g, d] -> [s/N, b, g * repeat, d], group order kept
            key = key.repeat_interleave(self.repeat, dim=2)
            value = value.repeat_interleave(self.repeat, dim=2)
        return self.dist_attn(query, key, value, 1, None, local)


class _Local(torch.nn.Module):
    """q/k/v [s, b, h/N | g/N, d] (whole sequence, this rank's heads) -> [s, b, h/N, d]."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, local: Callable) -> Tensor:
        q, k, v = (x.permute(1, 2, 0, 3) for x in (q, k, v))  # -> [b, heads, s, d]
        return local(q, k, v).permute(2, 0, 1, 3)  # [b, h/N, s, d] -> [s, b, h/N, d]


def heads_slice(m: Tensor, heads: Optional[tuple[int, int]]) -> Tensor:
    """m [h] -> this rank's m [h/N] (or m itself without sequence parallelism)."""
    if heads is None or not isinstance(m, Tensor):
        return m  # a python float: the uniform scale of every head
    return m[heads[0]:heads[1]]
