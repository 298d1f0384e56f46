"""The training loop: DeepSpeed engine around the megatron GPT, pretrain and HeadScale modes.

Run on every rank by `python -m lenext_dist.train` (train/cli.py; `lenext train` starts the ranks,
deepspeed / torchrun / mpirun / srun set the rank env). `train` reads as its steps: set-up (groups,
data, model, engine), resume, the step loop (with its evaluations and checkpoints), finish.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from lenext_dist.checkpoint.layout import CONFIG, latest_tag, latest_tag_name, step_of
from lenext_dist.config import ConfigError, RunConfig, deepspeed_config, save_config, stages, to_dict
from lenext_dist.data.gpt_data import (build_datasets, check_shards, loader_workers, train_batches,
                                       valid_batches)
from lenext_dist.errors import UserError
from lenext_dist.model import ulysses
from lenext_dist.train import checkpoint, fp32_params, optim
from lenext_dist.train.group import (  # noqa: F401  (re-exported: callers import them from here)
    init_distributed, one_process_env, shutdown_distributed, skip_deepspeed_shm_op)
from lenext_dist.train.metrics import Metrics
from lenext_dist.train.peak import peak_tflops
from lenext_dist.train.reshard import check_dp_size, saved_dp_size
from lenext_dist.train.run_dir import HEAD_SCALES, claim as claim_run_dir, finished, last_step, refuse_if_busy
from lenext_dist.train.signals import StopSignal


def _print0(*args):
    if dist.get_rank() == 0:
        print(*args, flush=True)


def _header(cfg: RunConfig, model, world: int, dp: int, accum: int, fpt: float, peak: float) -> None:
    import deepspeed
    import megatron.core

    from lenext_dist.attention.layout import summary as layout_summary
    from lenext_dist.model import parameter_counts

    c = parameter_counts(model)
    _print0(
        f"[lenext] run {cfg.name} ({cfg.train.mode}) -> {cfg.run_dir}\n"
        f"[lenext] model {cfg.model.name}: {c['total']:,} params ({c['non_embedding']:,} non-embedding, "
        f"{c['head_scales']:,} head scales), attention {cfg.attention.position}"
        f"{layout_summary(cfg.attention, cfg.model.num_layers)} c={cfg.attention.scale_c}\n"
        f"[lenext] FLOPs/token {fpt:.3e} (PaLM 6N+12LHQT), peak {peak:.3f} TFLOP/s per device\n"
        f"[lenext] world {world}, ZeRO-{cfg.parallel.zero_stage}, ulysses {world // dp}, micro "
        f"{cfg.train.micro_batch_size} x accum {accum} x dp {dp} = global {cfg.train.global_batch_size} seqs = "
        f"{cfg.train.global_batch_size * cfg.model.seq_length:,} tokens/step, {cfg.train.precision}\n"
        f"[lenext] torch {torch.__version__}, deepspeed {deepspeed.__version__}, megatron-core "
        f"{megatron.core.__version__}, python {platform.python_version()}, {torch.get_num_threads()} threads")


def _mean_over_ranks(value, device) -> float:
    """A float or a device tensor, averaged over ranks; one all-reduce and one host sync."""
    # NCCL reduces device tensors only
    t = torch.as_tensor(value, dtype=torch.float64, device=device).reshape(1).clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _micro_loss(engine, batch: dict, device, share: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean loss of the micro-batch; under sequence parallelism this rank's shard's share of it
    (its sum over the group's token count: the group's partial losses add up to the mean).
    `share` (train.per_token_loss): the divisor instead of the micro-batch's token count, the
    step's loss tokens per micro-batch (_per_token_share)."""
    b = {k: v.to(device) for k, v in ulysses.shard_batch(batch).items()}
    # data.document_mask: document ids [b, s] travel as megatron's attention mask to our core
    # attention (LenextCoreAttention), which keeps attention inside each document
    per_token = engine(input_ids=b["tokens"], position_ids=b["position_ids"],
                       attention_mask=b.get("document_ids"), labels=b["labels"])  # [b, s] fp32
    mask = b["loss_mask"].float()
    # at least 1: under data.task_loss=answers a micro-batch of task windows may hold no answer
    # (a zero loss and gradient then, not 0/0)
    denominator = ulysses.loss_denominator(mask.sum()) if share is None else share
    return (per_token.float() * mask).sum() / denominator.clamp(min=1.0)


def _per_token_share(micro_batches: list, device) -> torch.Tensor:
    """train.per_token_loss: the loss-mask tokens of the whole global batch (every rank's micro-
    batches) over its number of micro-batches. Each micro-batch's sum over it, averaged over the
    micro-batches by DeepSpeed's backward (1 / accumulation) and over the data-parallel ranks by
    its all-reduce, makes the gradient of sum / tokens over the global batch: the micro-batch mean
    exactly when every micro-batch holds as many tokens. One scalar all-reduce per step."""
    # [tokens, micro-batches] over every rank: a Ulysses group's ranks each count the whole
    # sequences (not their shards), which multiplies both by the group size and not the ratio
    t = torch.tensor([float(sum(mb["loss_mask"].sum().item() for mb in micro_batches)),
                      float(len(micro_batches))], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t[0] / t[1]).float()


@torch.no_grad()
def evaluate(engine, dataset, cfg: RunConfig, rank: int, world: int, eval_index: int, device) -> float:
    """`rank`, `world`: the data-parallel rank and size."""
    engine.eval()
    batches = list(valid_batches(dataset, cfg, rank, world, eval_index))
    share = _per_token_share(batches, device) if cfg.train.per_token_loss else None
    losses = [_micro_loss(engine, b, device, share).item() for b in batches]
    engine.train()
    # sequence parallelism: the group's partial losses add up (mean over ranks x group size)
    return _mean_over_ranks(sum(losses) / len(losses), device) * ulysses.size()


def train(cfg: RunConfig) -> dict:
    """Train per cfg; returns {'step', 'stopped_by_signal'}. Call on every rank."""
    stop = StopSignal()  # first: a USR1/TERM during start-up must not kill a rank
    owns_group = not dist.is_initialized()  # a caller's process group is the caller's to end
    if owns_group:  # before the rendezvous (a busy run_dir binds no port); in a caller's group
        refuse_if_busy(cfg)  # a faster rank 0 may already hold the lock: claim alone decides
    rank, world = init_distributed(cfg)
    # rank 0 locks run_dir for the whole run; an earlier run there is refused or moved aside
    lock = claim_run_dir(cfg, rank)
    try:
        return _train(cfg, stop, owns_group, rank, world)
    finally:
        lock.release()


def _train(cfg: RunConfig, stop: StopSignal, owns_group: bool, rank: int, world: int) -> dict:
    """Stage by stage (train.stages; one stage without): each from the checkpoint at its boundary
    with its own model, data and engine (config/stages.py has the rules)."""
    start = _resume_step(cfg)
    if finished(cfg, start):  # no engine built for no step
        # a requeued or relaunched finished run: building a 1B engine would take minutes for nothing
        limit = "train.exit_at" if cfg.train.exit_at else "train.steps"
        _print0(f"[lenext] nothing to do: the latest checkpoint (step {start}) is at or past "
                f"{limit}={last_step(cfg)}; checkpoints in {cfg.checkpoint.dir}")
        if owns_group:
            shutdown_distributed()
        return {"step": start, "stopped_by_signal": False}
    k = first = stages.index_at(cfg, start)
    _check_later_stages(cfg, first, world)
    while True:
        # a later stage goes on from the checkpoint its boundary just saved, whatever
        # checkpoint.resume says (false only asks not to resume an earlier run's)
        run = _set_up(stages.stage_config(cfg, k), rank, world, base=cfg, stage=k,
                      resume=cfg.checkpoint.resume or k > first)
        step, consumed = _resume(run)
        if k > first and step != stages.bounds(cfg)[k][0]:
            raise RuntimeError(f"stage {k} resumed at step {step}, not at its first step "
                               f"{stages.bounds(cfg)[k][0]}: the boundary's checkpoint is not the latest")
        if rank == 0:
            save_config(cfg, os.path.join(cfg.run_dir, CONFIG))
            name = "deepspeed.json" if k == 0 else f"deepspeed.stage{k}.json"
            with open(os.path.join(cfg.run_dir, name), "w") as f:
                json.dump(run.ds_config, f, indent=2)
        end = min(stages.bounds(cfg)[k][1], last_step(cfg))
        with sdpa_preference(cfg):
            step, stopped, diverged = _step_loop(run, stop, step, consumed, end)
        if stopped or diverged is not None or step >= last_step(cfg):
            return _finish(run, step, stopped, diverged, owns_group)
        k += 1  # the boundary's checkpoint is saved: free this stage's engine, build the next
        optim.release_engine(run.engine)
        del run
        _free_device_memory()


def sdpa_preference(cfg: RunConfig):
    """attention.sdpa_backends as torch's SDPA priority for the step loop (a no-op when empty)."""
    import contextlib

    from lenext_dist.attention.backends import prefer_sdpa_backends

    names = cfg.attention.sdpa_backends
    return prefer_sdpa_backends(names) if names else contextlib.nullcontext()


def _check_later_stages(cfg: RunConfig, first: int, world: int) -> None:
    """What the stages after `first` ask of this world and disk (batch sizes that split over its
    data-parallel ranks, a stage's own shards), checked before anything trains: found at a
    boundary hours in, the error would stop the run there, and every requeue with it."""
    dp = cfg.parallel.data_parallel_size(world)
    for k in range(first + 1, len(cfg.train.stages) + 1):
        where, s = f"train.stages[{k - 1}]", stages.stage_config(cfg, k)
        try:
            s.train.accum_steps(dp)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if cfg.train.stages[k - 1].blend:
            check_shards(s.data, f"{where}.blend")


def _resume_step(cfg: RunConfig) -> int:
    """The step the run resumes from (its latest complete checkpoint's), 0 for a fresh start: it
    picks the stage whose model and data are built."""
    tag = latest_tag(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    return (step_of(tag) or 0) if tag else 0


def _free_device_memory() -> None:
    """Between stages: the last stage's engine released, and the device's peak-memory counter
    restarted so that the log's memory is the new stage's own (a CPU's max RSS cannot restart)."""
    import gc

    from deepspeed.accelerator import get_accelerator

    gc.collect()
    acc = get_accelerator()
    if acc.device_name() != "cpu":
        acc.empty_cache()
        acc.reset_peak_memory_stats()


@dataclass
class _Run:
    """What set-up builds for the step loop, on one rank."""
    cfg: RunConfig
    rank: int
    world: int
    dp_rank: int  # data-parallel rank and size: every rank of a Ulysses group reads the same samples
    dp: int
    device: str
    engine: Any
    ds_config: dict
    train_ds: Any
    valid_ds: Any  # None without data.valid_blend
    fpt: float  # FLOPs per token and the device's peak TFLOP/s: the MFU the metrics report
    peak: float
    tag: Optional[str]  # the checkpoint to resume from
    reshard: bool  # its ZeRO partitions are of another data-parallel size
    base: RunConfig  # the run's whole config (train.stages included): what checkpoints record
    stage: int  # the stage `cfg` is of (0 without train.stages)

    @property
    def span(self) -> tuple[int, int]:
        """The optimizer steps [first, end) of the stage: the steps train_ds holds samples for."""
        return stages.bounds(self.base)[self.stage]

    @property
    def trainable_scales(self) -> bool:
        hs = self.cfg.attention.head_scale
        return hs.enabled and hs.trainable


def _set_up(cfg: RunConfig, rank: int, world: int, base: RunConfig, stage: int, resume: bool) -> _Run:
    """Parallel groups, data, model and DeepSpeed engine of `cfg` (stage `stage` of the run
    `base`), resuming from the latest checkpoint if `resume`; what is wrong with the batch sizes,
    the shards or the checkpoint to resume fails here, before anything is trained."""
    from deepspeed.accelerator import get_accelerator

    from lenext_dist.model import build_model, flops_per_token, init_megatron

    cfg.parallel.data_parallel_size(world)  # raises when the world does not split into groups
    mpu = ulysses.init_sequence_parallel(cfg.parallel.ulysses_size)  # None without SP
    dp_rank, dp = ulysses.data_parallel(rank, world)  # every rank of a group reads the same samples
    accum = cfg.train.accum_steps(dp)  # raises on batch sizes that do not divide
    ds_config = deepspeed_config(cfg, dp)
    first, end = stages.bounds(base)[stage]  # a stage reads a dataset of its own steps (config/stages.py)
    train_ds, valid_ds = build_datasets(cfg, dp, record=rank == 0, steps=end - first)  # bad shards fail here
    device = get_accelerator().current_device_name()
    init_megatron(cfg.train.seed)
    model = build_model(cfg)
    tag, reshard = _checkpoint_to_resume(base, world, resume)
    if tag is None and cfg.checkpoint.init_from:  # before DeepSpeed wraps the model
        src = checkpoint.load_weights(model, cfg.checkpoint.init_from, keep=optim.is_head_scale)
        _print0(f"[lenext] initialized weights from {src}; head scales start at {cfg.head_scale_init}")
    optim.freeze_for_mode(model, cfg)
    engine = optim.build_engine(model, cfg, world, mpu=mpu)
    # MFU against the peak of the training dtype on an accelerator (an fp16 run against the fp32
    # peak would read ~10x too high); on CPU against the fp32 peak, as before
    mm_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision, torch.float32)
    # by device name from the table in train/peak.py, else measured
    peak, peak_src = peak_tflops(device, mm_dtype if device != "cpu" else torch.float32,
                                 cfg.logging.peak_tflops)
    fpt = flops_per_token(cfg)
    _header(cfg, model, world, dp, accum, fpt, peak)
    _print0(f"[lenext] peak from {peak_src}")
    if base.train.stages:
        _print0(f"[lenext] {stages.describe(base, stage)} ({len(base.train.stages) + 1} stages)")
    return _Run(cfg, rank, world, dp_rank, dp, device, engine, ds_config, train_ds, valid_ds, fpt, peak,
                tag, reshard, base, stage)


def _checkpoint_to_resume(cfg: RunConfig, world: int, resume: bool) -> tuple[Optional[str], bool]:
    """(the tag to resume from, None without `resume` or a checkpoint; whether its ZeRO partitions
    must be cut again), checked against this config before the model is built on it."""
    tag = latest_tag(cfg.checkpoint.dir) if resume else None
    if not tag:
        return tag, False
    step_dir = os.path.join(cfg.checkpoint.dir, tag)
    for note in checkpoint.check_resume(cfg, step_dir):
        _print0(f"[lenext] warning: resuming with a changed data order: {note}")
    changed = checkpoint.optim_changes(cfg, step_dir)
    if changed:
        _print0(f"[lenext] optimizer settings changed since the checkpoint (this run's apply): {'; '.join(changed)}")
    # another data-parallel size: ZeRO-1/2 partitions are cut again, ZeRO-3 refused here
    return tag, check_dp_size(Path(cfg.checkpoint.dir) / tag, cfg.parallel.zero_stage, world)


def _resume(run: _Run) -> tuple[int, int]:
    """(step, consumed samples): the checkpoint's, loaded into the engine, else (0, 0)."""
    cfg = run.cfg
    if not run.tag:
        return 0, 0
    client = checkpoint.load(run.engine, cfg.checkpoint.dir, run.tag, reshard=run.reshard)
    step, consumed = client["step"], client["consumed_samples"]
    fp32_params.restore(run.engine, client.get(fp32_params.FROZEN, {}))  # frozen ones: saved exact
    fp32_params.refresh(run.engine)  # the loaded fp32 masters into the forward's fp32 values
    _print0(f"[lenext] resumed from {cfg.checkpoint.dir}/{run.tag}: step {step}, {consumed:,} samples"
            + (f" (ZeRO partitions of {saved_dp_size(Path(cfg.checkpoint.dir) / run.tag)} ranks "
               f"resharded to {run.world})" if run.reshard else ""))
    return step, consumed


def _step_loop(run: _Run, stop: StopSignal, step: int, consumed: int,
               end: Optional[int] = None) -> tuple[int, bool, Optional[int]]:
    """Steps until `end` (the stage's end; default train.steps, saved there), a stop signal (a
    checkpoint, then out) or divergence; returns (step, stopped by a signal, the step it
    diverged at or None)."""
    end = run.cfg.train.steps if end is None else end
    cfg, engine, device = run.cfg, run.engine, run.device
    metrics = Metrics(cfg.run_dir, cfg.train.steps, cfg.train.global_batch_size * cfg.model.seq_length,
                      run.fpt, run.peak, run.world, cfg.logging.tensorboard, enabled=run.rank == 0,
                      start_step=step, stage=run.stage if run.base.train.stages else None,
                      tokens_offset=stages.tokens_offset(run.base, run.stage))
    bar = _progress(cfg, step, run.rank)
    stopped, diverged = False, None
    loss_sum, n_loss = 0.0, 0  # the mean loss over the steps since the last log line
    bad_steps = 0  # consecutive non-finite steps
    micro_step = _micro_steps(run)
    batches = train_batches(run.train_ds, cfg, run.dp_rank, run.dp, step, loader_workers(cfg, device),
                            span=run.span)
    while step < end:
        t0 = time.perf_counter()
        micro_batches = next(batches)
        data_s = time.perf_counter() - t0
        lr = optim.cosine_lr(step, cfg.optim, cfg.train.steps)
        optim.set_lr(engine.optimizer, lr)
        log_now = (step + 1) % cfg.logging.interval == 0 or step + 1 == end
        step_loss, gnorm = micro_step(micro_batches, log_now)
        step += 1
        consumed += cfg.train.global_batch_size
        # NaN on any rank -> NaN on all; x group size: the group's partial losses add up
        mean_loss = _mean_over_ranks(step_loss, device) * ulysses.size()
        # timed after that host sync: on an accelerator the optimizer's update is still queued
        # when engine.step() returns, and the next step's clock would not count it either
        metrics.add_step(time.perf_counter() - t0, data_s)
        loss_sum += mean_loss
        n_loss += 1
        # fp16: an inf grad norm is the loss scaler's overflow, a skipped step, not divergence
        step_gnorm = (gnorm if gnorm is not None else engine.get_global_grad_norm()
                      if cfg.train.precision != "fp16" else None)
        bad_steps = _count_nonfinite(cfg, step, mean_loss, step_gnorm, bad_steps)
        if bad_steps > cfg.train.nonfinite_patience:
            metrics.log(step, {"loss": mean_loss, "lr": lr, "grad_norm": float(
                "nan" if step_gnorm is None else step_gnorm)})
            diverged = step
            break
        if bar:
            bar.update(1)
        if log_now:
            _log(run, metrics, step, loss_sum / n_loss, lr, gnorm)
            loss_sum, n_loss = 0.0, 0
        if run.valid_ds is not None and cfg.train.eval_interval and step % cfg.train.eval_interval == 0:
            metrics.log_eval(step, evaluate(engine, run.valid_ds, cfg, run.dp_rank, run.dp,
                                            step // cfg.train.eval_interval - 1, device))
        signalled = stop.agreed(device)
        if not _save_if_due(run, stop, signalled, step, consumed, end):
            diverged = step
            break
        if signalled:
            stopped = True
            break
    if bar:
        bar.close()
    metrics.close()
    return step, stopped, diverged


def _micro_steps(run: _Run):
    """step(micro_batches, log_now) -> (the step's mean loss, a device tensor; the gradient norm
    measured before the optimizer step, or None): one optimizer step over the micro-batches."""
    cfg, engine, device = run.cfg, run.engine, run.device
    hs_cfg = cfg.attention.head_scale
    # one scalar all-reduce per step: a NaN on any rank stops every rank at the same step
    # (train.nonfinite_patience); the micro-batch losses stay on the device until then
    zero = torch.zeros((), dtype=torch.float64, device=device)
    # DeepSpeed clips fp32 ZeRO-0 gradients but keeps no norm: measure it before the step then
    own_gnorm = cfg.parallel.zero_stage == 0 and cfg.train.precision == "fp32"
    exact_params = fp32_params.has_trainable(engine)
    grad_factor = ulysses.backward_factor(cfg.parallel.zero_stage)  # 1 but for ZeRO-3 under Ulysses

    def step(micro_batches: list, log_now: bool) -> tuple[torch.Tensor, Any]:
        step_loss, gnorm = zero, None
        share = _per_token_share(micro_batches, device) if cfg.train.per_token_loss else None
        for i, mb in enumerate(micro_batches):
            loss = _micro_loss(engine, mb, device, share)
            engine.backward(loss * grad_factor)  # averages the gradients over ranks on the last micro-batch
            if log_now and own_gnorm and i == len(micro_batches) - 1:
                gnorm = optim.grad_norm(engine.module)
            engine.step()  # DeepSpeed steps the optimizer on the accumulation boundary only
            step_loss = step_loss + loss.detach().double() / len(micro_batches)
        if run.trainable_scales and hs_cfg.min_value is not None:
            optim.clamp_head_scales(engine.module, hs_cfg.min_value)
        if exact_params:  # m_h / KERPLE under bf16: the stepped fp32 masters into the forward
            fp32_params.refresh(engine)
        return step_loss, gnorm

    return step


def _count_nonfinite(cfg: RunConfig, step: int, loss: float, gnorm, bad_steps: int) -> int:
    """Consecutive non-finite steps, this one included (0 after a finite one)."""
    if _finite(loss) and (gnorm is None or _finite(float(gnorm))):
        return 0
    _print0(f"[lenext] step {step}: non-finite loss {loss} / grad norm {gnorm} "
            f"({bad_steps + 1} in a row, train.nonfinite_patience={cfg.train.nonfinite_patience})")
    return bad_steps + 1


def _log(run: _Run, metrics: Metrics, step: int, loss: float, lr: float, gnorm) -> None:
    gnorm = run.engine.get_global_grad_norm() if gnorm is None else gnorm
    scales = optim.head_scale_stats(optim.head_scale_matrix(run.engine)) if run.trainable_scales else None
    metrics.log(step, {"loss": loss, "lr": lr,
                       "grad_norm": float(gnorm) if gnorm is not None else float("nan")}, scales)


def _save_if_due(run: _Run, stop: StopSignal, signalled: bool, step: int, consumed: int, end: int) -> bool:
    """A checkpoint on a signal, at the stage's (the run's) last step and every
    checkpoint.interval steps; False (nothing saved) when the weights hold NaN/inf."""
    interval = run.cfg.checkpoint.interval
    if not (signalled or step == end or (interval and step % interval == 0)):
        return True
    if not _weights_finite(run.engine, run.device):  # a finite loss, then an update with lr=inf
        _print0(f"[lenext] step {step}: the weights hold NaN/inf after the update; not saved")
        return False
    if signalled:
        _print0(f"[lenext] {stop.name} received: saving a checkpoint at step {step} and exiting")
    checkpoint.save(run.engine, run.base, step, consumed,  # the whole run's config, stages included
                    extra={fp32_params.FROZEN: fp32_params.frozen(run.engine)})
    return True


def _finish(run: _Run, step: int, stopped: bool, diverged: Optional[int], owns_group: bool) -> dict:
    """The searched head scales, then Diverged or the summary; the group ends if it is ours."""
    cfg = run.cfg
    if run.trainable_scales:
        _write_head_scales(optim.head_scale_matrix(run.engine), cfg.run_dir, run.rank)
    optim.release_engine(run.engine)
    if diverged is not None:
        if owns_group:
            shutdown_distributed()
        good = latest_tag_name(Path(cfg.checkpoint.dir)) if os.path.isdir(cfg.checkpoint.dir) else None
        raise Diverged(f"training diverged: non-finite loss, grad norm or weights at step {diverged} "
                       f"(train.nonfinite_patience={cfg.train.nonfinite_patience}); nothing saved after "
                       f"it, the last good checkpoint is {os.path.join(cfg.checkpoint.dir, good) if good else 'none'}. "
                       "Lower optim.lr (or raise optim.warmup_steps / lower optim.grad_clip) and resume")
    what = "stopped" if stopped else "done" if step >= cfg.train.steps else "exited (train.exit_at)"
    _print0(f"[lenext] {what} at step {step}; checkpoints in {cfg.checkpoint.dir}")
    if owns_group:
        shutdown_distributed()
    return {"step": step, "stopped_by_signal": stopped}


class Diverged(UserError):
    """The loss or gradient norm became NaN/inf (the message names the step and the last good
    checkpoint)."""


def _finite(x: float) -> bool:
    return math.isfinite(x)


@torch.no_grad()
def _weights_finite(engine, device) -> bool:
    """All ranks: every parameter this rank holds is finite (ZeRO-3: its partition, ds_tensor)."""
    # one device sync for the whole model, not one per parameter
    ok = [torch.isfinite(getattr(p, "ds_tensor", p)).all() for p in engine.module.parameters()]
    t = torch.stack(ok).all().to(device=device, dtype=torch.float32).reshape(1)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _write_head_scales(matrix: torch.Tensor, run_dir: str, rank: int) -> None:
    """The searched per-head scales as JSON and a layer x head heatmap (rank 0)."""
    if rank != 0:
        return
    from lenext_dist.plotting import plot_head_scales

    with open(os.path.join(run_dir, HEAD_SCALES), "w") as f:
        json.dump({"head_scales": matrix.tolist(), "lambda": "m_h / sqrt(head_dim)"}, f, indent=1)
    try:  # a node set up from the wheelhouse has no matplotlib (gpu/wheelhouse.py): the JSON is the result
        png = plot_head_scales(matrix, os.path.join(run_dir, "head_scales.png"))
    except ImportError as e:
        png = f"no heatmap ({e})"
    print(f"[lenext] head scales: {run_dir}/{HEAD_SCALES}, {png}", flush=True)  # rank 0 here


def _progress(cfg: RunConfig, step: int, rank: int):
    if rank != 0 or not cfg.logging.progress_bar or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.train.steps, initial=step, unit="step", dynamic_ncols=True)


__all__ = ["train", "evaluate", "init_distributed", "shutdown_distributed", "to_dict"]
