"""Rank-0 metrics: the log line, metrics.jsonl and TensorBoard.

MFU follows PaLM (Chowdhery et al. 2022, App. B): model FLOPs per token = 6N + 12 L H Q T
(N non-embedding parameters, L layers, H heads, Q head dim, T sequence length; forward+backward,
no recompute), divided by the per-device peak x devices. The peak is `logging.peak_tflops` or,
when null, a dense matmul measured at start-up on this device in the training dtype, so the MFU
of a CPU run is quoted against what this machine can actually do.
"""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from lenext_dist.atomic import atomic_write


def measure_matmul_tflops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int = 1024,
                          seconds: float = 0.5) -> float:
    """Dense n x n matmul throughput in TFLOP/s (2 n^3 flops per product), best of a few runs."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    best = 0.0
    deadline = time.perf_counter() + seconds
    a @ b  # warm-up
    while True:  # at least one timed run: on a busy machine the warm-up alone can pass the deadline
        acc.synchronize()
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        acc.synchronize()
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t0) / 1e12)
        if time.perf_counter() >= deadline:
            return best


def peak_memory_gb() -> float:
    """Peak memory of this process: device allocator peak on accelerators, max RSS on CPU."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() != "cpu":
        return acc.max_memory_allocated() / 2**30
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports KiB
    return kb / 2**20


def _fmt_eta(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _drop_records_after(path: Path, step: int) -> None:
    """Move metrics.jsonl's records past `step` (and a line a kill cut short) to the first free
    `metrics.dropped-N.jsonl` beside it, with a note: they are run again, and nothing is deleted
    (a resume from another checkpoint.dir, with no checkpoint yet, starts at 0 and would
    otherwise wipe an earlier run's whole log)."""
    if not path.exists():
        return
    keep, drop = [], []
    for line in path.read_bytes().splitlines():  # bytes: a damaged line is moved aside as it is
        try:
            rec = json.loads(line)
        except ValueError:  # the half-written last line of a killed run (or bytes not UTF-8)
            rec = None
        (keep if isinstance(rec, dict) and rec.get("step", 0) <= step else drop).append(line + b"\n")
    if not drop:
        return
    n = 1
    while (aside := path.with_name(f"metrics.dropped-{n}.jsonl")).exists():
        n += 1
    atomic_write(aside, b"".join(drop))
    atomic_write(path, b"".join(keep))
    print(f"[lenext] resuming at step {step}: {len(drop)} lines of {path} past it (run again now) "
          f"moved to {aside}", flush=True)


class Metrics:
    """Accumulates timings between log lines; writes on rank 0 only."""

    def __init__(self, run_dir: str, total_steps: int, tokens_per_step: int, flops_per_token: float,
                 peak_tflops: float, world_size: int, tensorboard: bool, enabled: bool,
                 start_step: int = 0, stage: Optional[int] = None, tokens_offset: int = 0):
        """`start_step`: the step a resumed run starts from; what an earlier run logged past it
        (the steps between its last checkpoint and its end) is moved aside, since they are run again.
        `stage`: the length stage these steps are of (train.stages; None: a one-stage run), on
        every record and log line with its MFU and memory; `tokens_offset`: tokens at step 0 of a
        line through this stage's tokens per step (earlier stages had others)."""
        self.enabled = enabled
        self.stage = stage
        self.tokens_offset = tokens_offset
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_total = peak_tflops * world_size
        self.writer = None
        self._reset()
        if not enabled:
            return
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        jsonl = Path(run_dir) / "metrics.jsonl"
        _drop_records_after(jsonl, start_step)
        self.jsonl = open(jsonl, "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step: TensorBoard hides the events an earlier run wrote from that step on
                # (a fresh start, 0, hides them all, as metrics.jsonl drops them all)
                self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"),
                                            purge_step=start_step + 1)
            except ImportError:
                print("[lenext] tensorboard not installed: TensorBoard logging off", file=sys.stderr)

    def _reset(self):
        self.step_time = 0.0
        self.data_time = 0.0
        self.steps = 0

    def add_step(self, step_seconds: float, data_seconds: float) -> None:
        """One optimizer step took step_seconds wall time, data_seconds of it waiting for data.
        Evaluation and checkpoint time are not steps, so they do not dilute tokens/s."""
        self.step_time += step_seconds
        self.data_time += data_seconds
        self.steps += 1

    def log(self, step: int, record: dict, head_scales: Optional[dict] = None) -> None:
        """Emit one line for the steps since the last call; `record` has loss, lr, grad_norm."""
        elapsed = max(self.step_time, 1e-9)
        steps = max(1, self.steps)
        tok_s = steps * self.tokens_per_step / elapsed
        tflops = tok_s * self.flops_per_token / 1e12
        rec = {
            "step": step,
            "tokens": self.tokens_offset + step * self.tokens_per_step,
            **({} if self.stage is None else {"stage": self.stage}),
            **record,
            "tokens_per_s": tok_s,
            "tflops": tflops,
            "mfu": tflops / self.peak_total if self.peak_total else float("nan"),
            "ms_per_step": 1000 * elapsed / steps,
            "data_wait_pct": 100 * self.data_time / elapsed,
            "peak_mem_gb": peak_memory_gb(),
        }
        eta = (self.total_steps - step) * elapsed / steps
        self._reset()
        if not self.enabled:
            return
        if head_scales:
            rec["head_scales"] = {k: list(v) for k, v in head_scales.items()}
        self.jsonl.write(json.dumps(rec) + "\n")
        self.jsonl.flush()
        stage = "" if self.stage is None else f" | stage {self.stage}"
        line = (f"step {step}/{self.total_steps}{stage} | tokens {rec['tokens']:,} | loss {rec['loss']:.4f}"
                f" | lr {rec['lr']:.3e} | gnorm {rec['grad_norm']:.3f} | {tok_s:,.0f} tok/s"
                f" | {tflops:.3f} TFLOP/s | MFU {100 * rec['mfu']:.1f}% | {rec['ms_per_step']:.0f} ms/step"
                f" | data {rec['data_wait_pct']:.1f}% | mem {rec['peak_mem_gb']:.2f} GB | ETA {_fmt_eta(eta)}")
        print(line, flush=True)
        if head_scales:
            for name, (lo, mean, hi) in head_scales.items():
                print(f"    {name}: m_h min {lo:.4f} mean {mean:.4f} max {hi:.4f}", flush=True)
        if self.writer:
            for k in ("loss", "lr", "grad_norm", "tokens_per_s", "tflops", "mfu", "ms_per_step",
                      "data_wait_pct", "peak_mem_gb"):
                self.writer.add_scalar(f"train/{k}", rec[k], step)
            for name, (lo, mean, hi) in (head_scales or {}).items():
                self.writer.add_scalars(f"head_scale/{name}", {"min": lo, "mean": mean, "max": hi}, step)

    def log_eval(self, step: int, loss: float) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, "valid_loss": loss}) + "\n")
        self.jsonl.flush()
        print(f"step {step} | valid loss {loss:.4f} | valid ppl {torch.tensor(loss).exp().item():.2f}",
              flush=True)
        if self.writer:
            self.writer.add_scalar("valid/loss", loss, step)

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            if self.writer:
                self.writer.close()
