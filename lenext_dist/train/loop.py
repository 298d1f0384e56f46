"""The training loop: DeepSpeed engine around the megatron GPT, pretrain and HeadScale modes.

Run by launch/pretrain.py on every rank (deepspeed / torchrun / mpirun / srun set the rank env).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

import torch
import torch.distributed as dist

from lenext_dist.config import RunConfig, deepspeed_config, save_config, to_dict
from lenext_dist.data.gpt_data import build_datasets, train_batches, valid_batches
from lenext_dist.train import checkpoint, fp32_params, optim
from lenext_dist.train.device import check_gpu_visible, local_rank, visible_device_index
from lenext_dist.train.metrics import Metrics
from lenext_dist.train.peak import peak_tflops
from lenext_dist.train.signals import StopSignal


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
    if acc.device_name() != "cpu":  # Slurm may show each task only its own GPU: index 0;
        # set before the process group so NCCL binds each rank to its own device
        acc.set_device(visible_device_index(local_rank(), acc.device_count()))
    if not dist.is_initialized():
        # DeepSpeed's MPI discovery ignores MASTER_PORT unless it is passed as distributed_port
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=True, verbose=False,
                                   distributed_port=int(os.environ.get("MASTER_PORT", 29500)))
    return dist.get_rank(), dist.get_world_size()


def _print0(*args):
    if dist.get_rank() == 0:
        print(*args, flush=True)


def _header(cfg: RunConfig, model, world: int, accum: int, fpt: float, peak: float) -> None:
    import deepspeed
    import megatron.core

    from lenext_dist.model import parameter_counts

    c = parameter_counts(model)
    _print0(
        f"[lenext] run {cfg.name} ({cfg.train.mode}) -> {cfg.run_dir}\n"
        f"[lenext] model {cfg.model.name}: {c['total']:,} params ({c['non_embedding']:,} non-embedding, "
        f"{c['head_scales']:,} head scales), attention {cfg.attention.position} c={cfg.attention.scale_c}\n"
        f"[lenext] FLOPs/token {fpt:.3e} (PaLM 6N+12LHQT), peak {peak:.3f} TFLOP/s per device\n"
        f"[lenext] world {world}, ZeRO-{cfg.parallel.zero_stage}, micro {cfg.train.micro_batch_size} x accum "
        f"{accum} x dp {world} = global {cfg.train.global_batch_size} seqs = "
        f"{cfg.train.global_batch_size * cfg.model.seq_length:,} tokens/step, {cfg.train.precision}\n"
        f"[lenext] torch {torch.__version__}, deepspeed {deepspeed.__version__}, megatron-core "
        f"{megatron.core.__version__}, python {platform.python_version()}, {torch.get_num_threads()} threads")


def _mean_over_ranks(value, device) -> float:
    """A float or a device tensor, averaged over ranks; one all-reduce and one host sync."""
    # NCCL reduces device tensors only
    t = torch.as_tensor(value, dtype=torch.float64, device=device).reshape(1).clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _micro_loss(engine, batch: dict, device) -> torch.Tensor:
    b = {k: v.to(device) for k, v in batch.items()}
    # data.document_mask: document ids [b, s] travel as megatron's attention mask to our core
    # attention (LenextCoreAttention), which keeps attention inside each document
    per_token = engine(input_ids=b["tokens"], position_ids=b["position_ids"],
                       attention_mask=b.get("document_ids"), labels=b["labels"])  # [b, s] fp32
    mask = b["loss_mask"].float()
    return (per_token.float() * mask).sum() / mask.sum()


@torch.no_grad()
def evaluate(engine, dataset, cfg: RunConfig, rank: int, world: int, eval_index: int, device) -> float:
    engine.eval()
    losses = [_micro_loss(engine, b, device).item()
              for b in valid_batches(dataset, cfg, rank, world, eval_index)]
    engine.train()
    return _mean_over_ranks(sum(losses) / len(losses), device)


def train(cfg: RunConfig) -> dict:
    """Train per cfg; returns {'step', 'stopped_by_signal'}. Call on every rank."""
    from deepspeed.accelerator import get_accelerator

    from lenext_dist.model import build_model, flops_per_token, init_megatron

    stop = StopSignal()  # first: a USR1/TERM during start-up must not kill a rank
    rank, world = init_distributed(cfg)
    accum = cfg.train.accum_steps(world)  # raises on batch sizes that do not divide
    ds_config = deepspeed_config(cfg, world)
    train_ds, valid_ds = build_datasets(cfg, world)  # bad shards fail here, before the model
    device = get_accelerator().current_device_name()
    init_megatron(cfg.train.seed)
    model = build_model(cfg)
    tag = checkpoint.latest_tag(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    if tag:
        for note in checkpoint.check_resume(cfg, os.path.join(cfg.checkpoint.dir, tag)):
            _print0(f"[lenext] warning: resuming with a changed data order: {note}")
    if tag is None and cfg.checkpoint.init_from:
        src = checkpoint.load_weights(model, cfg.checkpoint.init_from, keep=optim.is_head_scale)
        _print0(f"[lenext] initialized weights from {src}; head scales start at {cfg.head_scale_init}")
    optim.freeze_for_mode(model, cfg)
    engine = optim.build_engine(model, cfg, world)
    # MFU against the peak of the training dtype on an accelerator (an fp16 run against the fp32
    # peak would read ~10x too high); on CPU against the fp32 peak, as before
    mm_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision, torch.float32)
    # by device name from the table in train/peak.py, else measured
    peak, peak_src = peak_tflops(device, mm_dtype if device != "cpu" else torch.float32,
                                 cfg.logging.peak_tflops)
    fpt = flops_per_token(cfg)
    _header(cfg, model, world, accum, fpt, peak)
    _print0(f"[lenext] peak from {peak_src}")

    step, consumed = 0, 0
    if tag:
        client = checkpoint.load(engine, cfg.checkpoint.dir, tag)
        step, consumed = client["step"], client["consumed_samples"]
        fp32_params.refresh(engine)  # the loaded fp32 masters into the forward's fp32 values
        _print0(f"[lenext] resumed from {cfg.checkpoint.dir}/{tag}: step {step}, {consumed:,} samples")
    if rank == 0:
        save_config(cfg, os.path.join(cfg.run_dir, "config.yaml"))
        with open(os.path.join(cfg.run_dir, "deepspeed.json"), "w") as f:
            json.dump(ds_config, f, indent=2)

    metrics = Metrics(cfg.run_dir, cfg.train.steps, cfg.train.global_batch_size * cfg.model.seq_length,
                      fpt, peak, world, cfg.logging.tensorboard, enabled=rank == 0, start_step=step)
    hs_cfg = cfg.attention.head_scale
    trainable_scales = hs_cfg.enabled and hs_cfg.trainable
    bar = _progress(cfg, step, rank)
    stopped = False
    # the loss stays on the device between log lines: no host sync or all-reduce per step
    zero = torch.zeros((), dtype=torch.float64, device=device)
    loss_sum, n_loss = zero, 0

    # DeepSpeed clips fp32 ZeRO-0 gradients but keeps no norm: measure it before the step then
    own_gnorm = cfg.parallel.zero_stage == 0 and cfg.train.precision == "fp32"
    exact_params = fp32_params.has_trainable(engine)
    batches = train_batches(train_ds, cfg, rank, world, step)
    while step < cfg.train.steps:
        t0 = time.perf_counter()
        micro_batches = next(batches)
        data_s = time.perf_counter() - t0
        lr = optim.cosine_lr(step, cfg.optim, cfg.train.steps)
        optim.set_lr(engine.optimizer, lr)
        step_loss = zero
        log_now = (step + 1) % cfg.logging.interval == 0 or step + 1 == cfg.train.steps
        gnorm = None
        for i, mb in enumerate(micro_batches):
            loss = _micro_loss(engine, mb, device)
            engine.backward(loss)  # averages the gradients over ranks on the last micro-batch
            if log_now and own_gnorm and i == len(micro_batches) - 1:
                gnorm = optim.grad_norm(engine.module)
            engine.step()  # DeepSpeed steps the optimizer on the accumulation boundary only
            step_loss = step_loss + loss.detach().double() / len(micro_batches)
        if trainable_scales and hs_cfg.min_value is not None:
            optim.clamp_head_scales(engine.module, hs_cfg.min_value)
        if exact_params:  # m_h / KERPLE under bf16: the stepped fp32 masters into the forward
            fp32_params.refresh(engine)
        step += 1
        consumed += cfg.train.global_batch_size
        metrics.add_step(time.perf_counter() - t0, data_s)
        loss_sum = loss_sum + step_loss
        n_loss += 1
        if bar:
            bar.update(1)
        if log_now:
            gnorm = engine.get_global_grad_norm() if gnorm is None else gnorm
            scales = optim.head_scale_stats(optim.head_scale_matrix(engine)) if trainable_scales else None
            metrics.log(step, {"loss": _mean_over_ranks(loss_sum / n_loss, device), "lr": lr,
                               "grad_norm": float(gnorm) if gnorm is not None else float("nan")}, scales)
            loss_sum, n_loss = zero, 0
        if valid_ds is not None and cfg.train.eval_interval and step % cfg.train.eval_interval == 0:
            metrics.log_eval(step, evaluate(engine, valid_ds, cfg, rank, world,
                                            step // cfg.train.eval_interval - 1, device))
        if stop.agreed(device):
            _print0(f"[lenext] {stop.name} received: saving a checkpoint at step {step} and exiting")
            checkpoint.save(engine, cfg, step, consumed)
            stopped = True
            break
        interval = cfg.checkpoint.interval
        if step == cfg.train.steps or (interval and step % interval == 0):
            checkpoint.save(engine, cfg, step, consumed)
    if bar:
        bar.close()
    metrics.close()
    if trainable_scales:
        _write_head_scales(optim.head_scale_matrix(engine), cfg.run_dir, rank)
    _print0(f"[lenext] {'stopped' if stopped else 'done'} at step {step}; checkpoints in {cfg.checkpoint.dir}")
    shutdown_distributed()
    return {"step": step, "stopped_by_signal": stopped}


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


def _write_head_scales(matrix: torch.Tensor, run_dir: str, rank: int) -> None:
    """The searched per-head scales as JSON and a layer x head heatmap (rank 0)."""
    if rank != 0:
        return
    from lenext_dist.eval.plots import plot_head_scales

    with open(os.path.join(run_dir, "head_scales.json"), "w") as f:
        json.dump({"head_scales": matrix.tolist(), "lambda": "m_h / sqrt(head_dim)"}, f, indent=1)
    png = plot_head_scales(matrix, os.path.join(run_dir, "head_scales.png"))
    _print0(f"[lenext] head scales: {run_dir}/head_scales.json, {png}")


def _progress(cfg: RunConfig, step: int, rank: int):
    if rank != 0 or not cfg.logging.progress_bar or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.train.steps, initial=step, unit="step", dynamic_ncols=True)


__all__ = ["train", "evaluate", "init_distributed", "shutdown_distributed", "to_dict"]
