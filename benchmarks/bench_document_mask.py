#!/usr/bin/env python
"""Cost of document masking (data.document_mask) in training: tokens/s and memory of full
training steps of our megatron-core model under the DeepSpeed engine, on the same packed tokens,
with the document ids as attention mask vs without (plain causal attention over the row).

Per position variant (default NoPE, whose unmasked path is one fused causal SDPA call, and ALiBi,
which runs the chunked kernel either way), both settings are timed in alternating rounds in one
process (machine noise hits both alike; the ratio of medians is the result). Memory: on CUDA the
peak allocated bytes of a step; on CPU each setting runs in a fresh child process and reports its
peak RSS increase over the RSS before its first step (ru_maxrss).

Documents: random tokens with EOS at document ends, lengths drawn from a geometric distribution
with mean --doc-mean (a packed row of --seq tokens holds seq / doc-mean documents on average).

    python benchmarks/bench_document_mask.py [--seq 512 --doc-mean 128 --variants nope,alibi]
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("LOCAL_RANK", "0")
ON_CUDA = os.environ["DS_ACCELERATOR"] == "cuda"
"""Where the model runs (DeepSpeed's accelerator: the CPU unless DS_ACCELERATOR=cuda), whatever torch sees."""

import torch  # noqa: E402

EOS = 2


def packed_tokens(batch: int, seq: int, vocab: int, doc_mean: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(3, vocab, (batch, seq + 1), generator=gen)
    p = 1.0 / doc_mean  # geometric document lengths, mean doc_mean
    x[torch.rand(batch, seq + 1, generator=gen) < p] = EOS
    return x


def build_step(a, position: str):
    from lenext_dist.attention import document_ids
    from lenext_dist.config import load_config
    from lenext_dist.model import build_model, init_megatron, init_single_process_group
    from lenext_dist.train.loop import skip_deepspeed_shm_op
    from lenext_dist.train.optim import build_engine

    cfg = load_config(None, [f"model.num_layers={a.layers}", f"model.hidden_size={a.hidden}",
                             f"model.num_attention_heads={a.heads}",
                             f"model.num_query_groups={a.groups}", f"model.ffn_hidden_size={a.ffn}",
                             f"model.vocab_size={a.vocab}", f"model.seq_length={a.seq}",
                             f"train.micro_batch_size={a.batch}", f"train.global_batch_size={a.batch}",
                             "parallel.zero_stage=0", f"attention.position={position}"])
    skip_deepspeed_shm_op()
    init_single_process_group()
    init_megatron(cfg.train.seed)
    engine = build_engine(build_model(cfg), cfg, 1)  # the engine of launch/pretrain.py
    device = next(engine.module.parameters()).device
    tokens = packed_tokens(a.batch, a.seq, a.vocab, a.doc_mean).to(device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    ids = document_ids(inputs, eos_id=EOS)

    def step(masked: bool) -> float:
        # what train/loop.py does: the document ids travel as megatron's attention mask
        loss = engine(input_ids=inputs, position_ids=None, attention_mask=ids if masked else None,
                      labels=labels).mean()
        engine.backward(loss)
        engine.step()
        return loss.item()

    docs_per_row = float((ids[:, -1] + 1).float().mean())
    return step, docs_per_row


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(a, position: str, masked: bool) -> dict:
    """Fresh process: peak RSS increase of `a.steps` training steps (CPU)."""
    step, _ = build_step(a, position)
    base = _rss()
    for _ in range(a.steps):
        step(masked)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_increase_bytes": max(0, peak - base), "method": "ru_maxrss - RSS before"}


def memory(a, position: str, step) -> dict:
    if ON_CUDA:
        out = {}
        for masked in (False, True):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step(masked)
            torch.cuda.synchronize()
            out["masked" if masked else "causal"] = {
                "peak_increase_bytes": torch.cuda.max_memory_allocated() - base,
                "method": "torch.cuda.max_memory_allocated over one step"}
        return out
    out = {}
    for masked in (False, True):
        cmd = [sys.executable, __file__, *a.argv, "--_memory-child", position,
               "--_masked", str(int(masked))]
        p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if p.returncode:
            raise RuntimeError(f"memory child failed: {p.stderr[-2000:]}")
        out["masked" if masked else "causal"] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="nope,alibi", help="attention.position values")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--doc-mean", type=int, default=128, help="mean document length (tokens)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="steps per round per setting")
    ap.add_argument("--out", default="results/bench/document_mask.json")
    ap.add_argument("--_memory-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_masked", type=int, default=0, help=argparse.SUPPRESS)
    raw = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(raw)
    a.argv = [x for i, x in enumerate(raw) if not x.startswith("--_") and
              (i == 0 or not raw[i - 1].startswith("--_"))]
    torch.set_num_threads(a.threads)
    if a._memory_child:
        print(json.dumps(memory_child(a, a._memory_child, bool(a._masked))))
        return None

    results = {}
    for position in a.variants.split(","):
        step, docs = build_step(a, position)
        step(False), step(True)  # warm-up (allocator, first-call paths)
        rates = {"causal": [], "masked": []}
        for _ in range(a.rounds):
            for name in rates:
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    step(name == "masked")
                rates[name].append(a.steps * a.batch * a.seq / (time.perf_counter() - t0))
        med = {k: statistics.median(v) for k, v in rates.items()}
        mem = memory(a, position, step)
        results[position] = {
            "documents_per_row": docs, "tokens_per_s": rates, "median_tokens_per_s": med,
            "throughput_ratio_masked_over_causal": med["masked"] / med["causal"],
            "memory": mem,
            "memory_ratio_masked_over_causal": (mem["masked"]["peak_increase_bytes"]
                                                / max(1, mem["causal"]["peak_increase_bytes"])),
        }
        r = results[position]
        print(f"{position:8s} {docs:.1f} docs/row: causal {med['causal']:7.0f} tok/s, masked "
              f"{med['masked']:7.0f} tok/s (x{r['throughput_ratio_masked_over_causal']:.3f}); "
              f"peak +{mem['causal']['peak_increase_bytes'] / 2**20:.0f} MiB vs "
              f"+{mem['masked']['peak_increase_bytes'] / 2**20:.0f} MiB "
              f"(x{r['memory_ratio_masked_over_causal']:.2f})", flush=True)
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "threads": a.threads,
                       "torch": torch.__version__, "cuda": ON_CUDA,
                       "loadavg": os.getloadavg()},
           "shape": {k: v for k, v in vars(a).items() if not k.startswith("_") and k != "argv"},
           "results": results}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
