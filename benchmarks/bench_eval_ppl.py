#!/usr/bin/env python3
"""Sliding-window PPL throughput: `lenext_dist.eval.ppl` vs the paper script's loop.

Both on the same model, text and windows in one run (last-stride protocol, window W, stride S):
  reference  the nope_head_scale / HF-perplexity-guide loop: for each window, one forward of
             batch 1, `model(input_ids, labels=...)` with every unscored label set to -100 (HF
             computes logits and log-softmax on all W positions), nll * S accumulated
  ours       evaluate_ppl: B windows per forward, the output layer and the loss only on the S
             scored positions of each window (and, on our export's model, the last layer's
             queries, attention output and MLP too: `hidden_from`), inference_mode
Prints scored tokens/s of both (wall and per CPU-second, the latter immune to other load on a
shared machine), the speed-up (target >= 3x) and checks the two perplexities agree (rel 1e-5).
The model is random, of the TinyLlama vocabulary (32000) and a small body, the regime of the
small-scale study (DESIGN section 9): there the output layer is most of the cost. `--model
lenext` (default) is the model of our exports (`LenextForCausalLM`, NoPE), what `lenext eval`
runs on; `--model llama` a plain transformers LlamaForCausalLM (no last-layer saving).

  python benchmarks/bench_eval_ppl.py [--model lenext|llama] [--length 512] [--stride 64]
      [--windows 48] [--batch-size 8] [--threads 1] [--rounds 2] [--out results/bench_eval_ppl.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))  # tests/tiny_models.py

import torch  # noqa: E402

from lenext_dist.eval.data import load_documents  # noqa: E402
from lenext_dist.eval.ppl import evaluate_ppl, plan_windows  # noqa: E402
from tiny_models import SAMPLE_TOKENIZER, tiny_lenext, tiny_llama  # noqa: E402

DATA = os.path.join(REPO, "data", "sample", "heldout", "books.jsonl.zst")


def reference_ppl(model, docs, windows, W: int, S: int) -> tuple[float, int]:
    """One window at a time, as the paper's script: full logits, HF loss with -100 labels."""
    nll_sum, n = 0.0, 0
    with torch.no_grad():
        for w in windows:
            t = docs[w.doc].tokens[w.start:w.start + W + 1]
            ids = torch.as_tensor(t)[None]            # W+1 tokens: W predictions
            labels = ids.clone()
            labels[:, :-S] = -100                     # score only the last S targets
            loss = model(input_ids=ids, labels=labels).loss
            nll_sum += float(loss) * S
            n += S
    return nll_sum / n, n


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("lenext", "llama"), default="lenext")
    ap.add_argument("--length", type=int, default=512, help="window W")
    ap.add_argument("--stride", type=int, default=64, help="S")
    ap.add_argument("--windows", type=int, default=48, help="windows scored by each method")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="best of this many rounds")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(REPO, "results", "bench_eval_ppl.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    W, S = a.length, a.stride

    build = (lambda **kw: tiny_lenext("nope", **kw)) if a.model == "lenext" else tiny_llama
    model = build(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, heads=4, kv_heads=4,
                  train_length=W)
    # the model's HF ForCausalLM loss needs labels within the vocabulary: the sample tokenizer
    # (4096 ids) fits in the 32000 vocabulary
    ds = load_documents([DATA], SAMPLE_TOKENIZER, max_docs=2)
    budget = a.windows * S
    windows, _ = plan_windows(ds.docs, W, S, "last-stride", budget)
    assert len(windows) == a.windows, "not enough text for --windows"

    best = {}
    for _ in range(a.rounds):
        (ref_nll, ref_n), rw, rc = timed(lambda: reference_ppl(model, ds.docs, windows, W, S))
        ours, ow, oc = timed(lambda: evaluate_ppl(model, ds.docs, W, stride=S,
                                                  protocol="last-stride", budget_tokens=budget,
                                                  batch_size=a.batch_size, progress=False))
        for k, v in (("ref_wall", rw), ("ref_cpu", rc), ("ours_wall", ow), ("ours_cpu", oc)):
            best[k] = min(best.get(k, math.inf), v)
    assert ours["scored_tokens"] == ref_n
    rel = abs(ours["nll"] - ref_nll) / ref_nll
    res = {
        "model": {"class": type(model).__name__, "vocab": a.vocab, "hidden": a.hidden, "layers": a.layers, "heads": 4,
                  "parameters": sum(p.numel() for p in model.parameters())},
        "protocol": {"name": "last-stride", "length": W, "stride": S, "windows": a.windows,
                     "scored_tokens": ref_n, "data": DATA},
        "batch_size": a.batch_size, "threads": a.threads, "rounds": a.rounds,
        "reference": {"ppl": math.exp(ref_nll), "wall_s": best["ref_wall"],
                      "cpu_s": best["ref_cpu"], "tokens_per_s": ref_n / best["ref_wall"],
                      "tokens_per_cpu_s": ref_n / best["ref_cpu"]},
        "ours": {"ppl": ours["ppl"], "wall_s": best["ours_wall"], "cpu_s": best["ours_cpu"],
                 "tokens_per_s": ref_n / best["ours_wall"],
                 "tokens_per_cpu_s": ref_n / best["ours_cpu"]},
        "speedup_wall": best["ref_wall"] / best["ours_wall"],
        "speedup_cpu": best["ref_cpu"] / best["ours_cpu"],
        "nll_rel_diff": rel, "identical_within_1e-5": rel < 1e-5,
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__},
    }
    print(f"scored tokens: {ref_n} ({a.windows} windows of {W}, stride {S})")
    print(f"reference (1 window/forward, full logits): {res['reference']['tokens_per_s']:.0f} "
          f"tok/s wall, {res['reference']['tokens_per_cpu_s']:.0f} tok/CPU-s, "
          f"ppl {res['reference']['ppl']:.4f}")
    print(f"ours (batch {a.batch_size}, scored logits only): {res['ours']['tokens_per_s']:.0f} "
          f"tok/s wall, {res['ours']['tokens_per_cpu_s']:.0f} tok/CPU-s, ppl {ours['ppl']:.4f}")
    print(f"speed-up {res['speedup_wall']:.2f}x wall, {res['speedup_cpu']:.2f}x CPU "
          f"(target >= 3x); nll rel diff {rel:.2e}")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {a.out}")
    return 0 if rel < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
