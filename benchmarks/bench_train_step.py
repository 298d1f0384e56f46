#!/usr/bin/env python
"""Training-step throughput: our megatron-core GPT under the DeepSpeed engine vs plain PyTorch
`transformers.LlamaForCausalLM` (RoPE removed) of the same shape, batch and threads.

Both do a full step (forward, backward, AdamW update) on the same random tokens. They are timed in
alternating rounds in one process, so machine noise hits both alike; the ratio of medians is the
result. MFU is quoted against a dense fp32 matmul peak measured in the same run (PaLM convention,
6N + 12LHQT FLOPs per token; the same count for both models, since they have the same shape).

    python benchmarks/bench_train_step.py [--layers 4 --hidden 512 --heads 8 --groups 4 --seq 512]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("LOCAL_RANK", "0")  # one process, no launcher: what DeepSpeed asks of one

import torch  # noqa: E402


def build_ours(cfg):
    from lenext_dist.model import build_model, init_megatron, init_single_process_group
    from lenext_dist.train.loop import skip_deepspeed_shm_op
    from lenext_dist.train.optim import build_engine

    skip_deepspeed_shm_op()
    init_single_process_group()
    init_megatron(cfg.train.seed)
    engine = build_engine(build_model(cfg), cfg, 1)  # the engine of launch/pretrain.py

    def step(tokens):
        loss = engine(input_ids=tokens[:, :-1], position_ids=None, attention_mask=None,
                      labels=tokens[:, 1:]).mean()
        engine.backward(loss)
        engine.step()
        return loss.item()

    return step


def build_hf(cfg):
    from transformers import LlamaConfig, LlamaForCausalLM

    m = cfg.model
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.kv_heads, max_position_embeddings=m.seq_length, rms_norm_eps=m.norm_epsilon,
        tie_word_embeddings=False, attn_implementation="sdpa"))
    rotary = hf.model.rotary_emb

    def no_rope(x, position_ids):  # NoPE: cos = 1, sin = 0 makes the rotation the identity
        cos, sin = type(rotary).forward(rotary, x, position_ids)
        return torch.ones_like(cos), torch.zeros_like(sin)

    hf.model.rotary_emb.forward = no_rope
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)

    def step(tokens):
        loss = hf(input_ids=tokens[:, :-1], labels=tokens[:, :-1]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1376)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per round per model")
    ap.add_argument("--out", default="results/bench/train_step.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from lenext_dist.config import load_config
    from lenext_dist.model import flops_per_token
    from lenext_dist.train.metrics import measure_matmul_tflops

    cfg = load_config(None, [f"model.num_layers={a.layers}", f"model.hidden_size={a.hidden}",
                             f"model.num_attention_heads={a.heads}", f"model.num_query_groups={a.groups}",
                             f"model.ffn_hidden_size={a.ffn}", f"model.vocab_size={a.vocab}",
                             f"model.seq_length={a.seq}", f"train.micro_batch_size={a.batch}",
                             f"train.global_batch_size={a.batch}", "parallel.zero_stage=0",
                             "attention.position=nope"])
    steps = {"ours": build_ours(cfg), "hf_llama": build_hf(cfg)}
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
    for fn in steps.values():  # warm-up (allocator, first-call paths)
        fn(tokens)
    rates = {k: [] for k in steps}
    for _ in range(a.rounds):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            for _ in range(a.steps):
                fn(tokens)
            rates[name].append(a.steps * a.batch * a.seq / (time.perf_counter() - t0))
    peak = measure_matmul_tflops("cpu", torch.float32, seconds=1.0)
    fpt = flops_per_token(cfg)
    med = {k: statistics.median(v) for k, v in rates.items()}
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": a.threads,
                    "torch": torch.__version__, "python": platform.python_version()},
        "shape": vars(a), "flops_per_token": fpt, "matmul_peak_tflops": peak,
        "tokens_per_s": rates, "median_tokens_per_s": med,
        "mfu": {k: v * fpt / 1e12 / peak for k, v in med.items()},
        "ratio_ours_over_hf": med["ours"] / med["hf_llama"],
    }
    for name in steps:
        print(f"{name:9s} median {med[name]:8.0f} tok/s  (rounds {', '.join(f'{r:.0f}' for r in rates[name])})"
              f"  MFU {100 * result['mfu'][name]:.1f}%")
    print(f"ratio ours / HF Llama: {result['ratio_ours_over_hf']:.3f}  (target >= 1.0); "
          f"fp32 matmul peak {peak * 1000:.0f} GFLOP/s on {a.threads} threads")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
