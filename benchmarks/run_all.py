#!/usr/bin/env python3
"""`make bench`: every benchmark one after another, small settings (a few minutes on 2 cores),
each ratio printed side by side with the machine description, all saved as one JSON.

  train_step   benchmarks/bench_train_step.py: training tokens/s and MFU of our megatron-core
               model under DeepSpeed vs HF LlamaForCausalLM of the same shape (ratio, target >= 1)
  data_prep    benchmarks/bench_data_prep.py: data_prep tokens/s per worker vs bare SentencePiece
               encode (ratio, target >= 0.9; wall and per CPU-second)
  eval_ppl     benchmarks/bench_eval_ppl.py: batched sliding-window PPL vs one window per forward
               (speed-up, target >= 3x; the PPLs must agree to 1e-5)
  document_mask benchmarks/bench_document_mask.py: training tokens/s and peak memory with document
               masking of packed sequences (data.document_mask) vs plain causal attention, same
               tokens, NoPE and ALiBi (ratio masked / causal: the cost of the option)
  entropy_mem  new here: peak memory of the chunked attention-entropy computation
               (`lenext eval entropy`'s `evaluate_entropy`) for one window of 16K positions on a
               small random lenext model, against the size of the dense [h, L, L] fp32
               probabilities it avoids (ratio dense / measured peak increase; the peak is the
               child process's max RSS minus its RSS just before the computation)

Each benchmark runs in its own process (a failure is recorded and the others still run).

  python benchmarks/run_all.py [--only train_step,eval_ppl] [--out results/bench/all.json]
      [--entropy-length 16384]
  python benchmarks/run_all.py --render results/bench/all.json   # only rewrite all.md from the JSON

Beside the JSON it writes a Markdown table generated from it (same name, .md), headed by the
machine and the date the JSON records: the only place benchmark numbers are written down
(docs/benchmarks.md says how to publish one).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # tests/tiny_models.py (the tiny random models)
PY = sys.executable

# small settings: (script, args); the JSON each writes is read back
BENCHES = {
    "train_step": ("bench_train_step.py", ["--layers", "2", "--hidden", "256", "--heads", "4",
                                           "--groups", "2", "--ffn", "704", "--vocab", "4096",
                                           "--seq", "256", "--batch", "2", "--rounds", "7",
                                           "--steps", "3"]),
    # each timed part lasts a second or more, best of 3 rounds: shorter parts were at the mercy
    # of a single scheduler hiccup on this shared machine (ratios swung 0.85-1.3x run to run)
    "data_prep": ("bench_data_prep.py", ["--workers", "1", "2", "--rounds", "2"]),
    "eval_ppl": ("bench_eval_ppl.py", ["--windows", "32", "--rounds", "3"]),
    "document_mask": ("bench_document_mask.py", ["--seq", "1024", "--doc-mean", "128",
                                                 "--rounds", "3", "--steps", "2"]),
}


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        info["mem_total_gb"] = round(int(next(x for x in Path("/proc/meminfo").read_text().splitlines()
                                              if x.startswith("MemTotal")).split()[1]) / 2**20, 1)
        info["loadavg_at_start"] = os.getloadavg()
    except (OSError, StopIteration, ValueError):
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def entropy_child(length: int, heads: int, chunk_mb: int) -> dict:
    """Run in a fresh process: peak memory of chunked entropy at `length` positions."""
    import torch

    from lenext_dist.eval.data import EvalDoc
    from lenext_dist.eval.entropy import evaluate_entropy
    from tiny_models import tiny_lenext

    torch.manual_seed(0)
    model = tiny_lenext("nope", hidden=32 * heads, layers=1, heads=heads, kv_heads=1,
                        train_length=128)
    ids = torch.randint(3, 4096, (length + 1,)).numpy()
    doc = EvalDoc(name="random", path="(random tokens)", tokens=ids.astype("int64"))
    base = _rss_bytes()
    t0 = time.perf_counter()
    res = evaluate_entropy(model, [doc], length, samples=1, mem_bytes=chunk_mb << 20, progress=False)
    sec = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    dense = heads * length * length * 4
    inc = max(1, peak - base)
    return {"length": length, "heads": heads, "layers": 1, "chunk_budget_mb": chunk_mb,
            "rss_before_bytes": base, "peak_rss_bytes": peak, "peak_increase_bytes": inc,
            "dense_probs_bytes": dense, "ratio_dense_over_peak_increase": dense / inc,
            "seconds": sec, "finite": bool(float(abs(res["entropy"]).max()) < float("inf")),
            "method": "ru_maxrss of this process minus /proc/self/statm RSS before the call"}


def run_bench(name: str, out_dir: Path, log) -> dict:
    script, args = BENCHES[name]
    out = out_dir / f"{name}.json"
    cmd = [PY, str(REPO / "benchmarks" / script), *args, "--out", str(out)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "DS_ACCELERATOR": "cpu"})
    rec = {"command": " ".join(cmd), "seconds": round(time.perf_counter() - t0, 1),
           "returncode": p.returncode, "stdout_tail": p.stdout.splitlines()[-8:]}
    if p.returncode != 0:
        rec["error"] = p.stderr.splitlines()[-10:]
        log(f"[bench] {name} FAILED (exit {p.returncode})")
        return rec
    rec["result"] = json.loads(out.read_text())
    return rec


def ratios(res: dict) -> list[tuple[str, str, str]]:
    """(benchmark, ratio text, target) rows for the side-by-side table."""
    rows = []
    r = res.get("train_step", {}).get("result")
    if r:
        rows.append(("train_step", f"ours/HF tokens/s {r['ratio_ours_over_hf']:.3f}; MFU "
                     + ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["mfu"].items()), ">= 1.0"))
    r = res.get("data_prep", {}).get("result")
    if r:
        for c in r.get("corpora", []):
            for run in c["results"]:
                rows.append(("data_prep", f"{c['corpus']}, {run['workers']} worker(s): whole run "
                             f"{run['ratio']:.2f}x bare wall, {run['ratio_cpu']:.2f}x CPU", ">= 0.9"))
    r = res.get("eval_ppl", {}).get("result")
    if r:
        rows.append(("eval_ppl", f"speed-up {r['speedup_wall']:.2f}x wall, {r['speedup_cpu']:.2f}x CPU; "
                     f"PPL agree {r['identical_within_1e-5']}", ">= 3x"))
    r = res.get("document_mask", {}).get("result")
    if r:
        for pos, x in r["results"].items():
            rows.append(("document_mask", f"{pos}: masked/causal tokens/s "
                         f"{x['throughput_ratio_masked_over_causal']:.3f}, peak memory "
                         f"{x['memory_ratio_masked_over_causal']:.2f}x "
                         f"({x['documents_per_row']:.1f} docs/row)", "cost, no target"))
    r = res.get("entropy_mem", {}).get("result")
    if r:
        rows.append(("entropy_mem", f"dense [h,L,L] {r['dense_probs_bytes'] / 2**30:.2f} GiB vs measured peak "
                     f"+{r['peak_increase_bytes'] / 2**20:.0f} MiB: {r['ratio_dense_over_peak_increase']:.1f}x less "
                     f"({r['seconds']:.1f} s)", "peak << dense"))
    return rows


def markdown(res: dict, source: str) -> str:
    """The results table of one run, generated from its JSON (`res`, read from `source`)."""
    m = res.get("machine", {})
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `python benchmarks/run_all.py` from `{source}`; do not edit by hand.",
        "",
        f"- date: {res.get('created', '?')}",
        f"- machine: {m.get('cpu_model', m.get('processor', '?'))}, {m.get('cores', '?')} cores, "
        f"{m.get('mem_total_gb', '?')} GB, {m.get('platform', '?')}",
        f"- software: Python {m.get('python', '?')}, torch {m.get('torch', '?')}",
        f"- load average at start: {m.get('loadavg_at_start', '?')}",
        "",
        "| benchmark | measured | target |",
        "|---|---|---|",
    ]
    lines += [f"| {b} | {txt} | {tgt} |" for b, txt, tgt in ratios(res)]
    for k, v in res.items():
        if isinstance(v, dict) and v.get("returncode"):
            lines.append(f"| {k} | FAILED (exit {v['returncode']}) | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma list of " + ",".join([*BENCHES, "entropy_mem"]))
    ap.add_argument("--out", default=str(REPO / "results" / "bench" / "all.json"))
    ap.add_argument("--entropy-length", type=int, default=16384)
    ap.add_argument("--entropy-heads", type=int, default=2)
    ap.add_argument("--entropy-chunk-mb", type=int, default=64)
    ap.add_argument("--render", metavar="JSON", default=None,
                    help="only write the Markdown table of an earlier run's JSON (beside it, .md)")
    ap.add_argument("--_entropy-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.render:
        src = Path(a.render)
        src.with_suffix(".md").write_text(markdown(json.loads(src.read_text()), src.name))
        print(f"wrote {src.with_suffix('.md')}")
        return 0
    if a._entropy_child:
        print(json.dumps(entropy_child(a.entropy_length, a.entropy_heads, a.entropy_chunk_mb)))
        return 0
    names = a.only.split(",") if a.only else [*BENCHES, "entropy_mem"]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {"machine": machine(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for name in names:
        print(f"[bench] {name} ...", flush=True)
        if name == "entropy_mem":
            t0 = time.perf_counter()
            p = subprocess.run([PY, __file__, "--_entropy-child", "--entropy-length", str(a.entropy_length),
                                "--entropy-heads", str(a.entropy_heads), "--entropy-chunk-mb",
                                str(a.entropy_chunk_mb)], cwd=REPO, capture_output=True, text=True)
            rec = {"seconds": round(time.perf_counter() - t0, 1), "returncode": p.returncode}
            if p.returncode == 0:
                rec["result"] = json.loads(p.stdout.strip().splitlines()[-1])
            else:
                rec["error"] = p.stderr.splitlines()[-10:]
            res[name] = rec
        elif name in BENCHES:
            res[name] = run_bench(name, out.parent, print)
        else:
            raise SystemExit(f"unknown benchmark {name!r}")
    out.write_text(json.dumps(res, indent=2, default=str))
    out.with_suffix(".md").write_text(markdown(json.loads(out.read_text()), out.name))
    m = res["machine"]
    print(f"\nmachine: {m.get('cpu_model', m['processor'])}, {m['cores']} cores, "
          f"{m.get('mem_total_gb', '?')} GB, {m['platform']}, torch {m.get('torch')}, "
          f"load {m.get('loadavg_at_start')}")
    print(f"{'benchmark':12s} | {'measured ratio':70s} | target")
    for b, txt, tgt in ratios(res):
        print(f"{b:12s} | {txt:70s} | {tgt}")
    for k in names:
        if res[k].get("returncode"):
            print(f"{k:12s} | FAILED: {' / '.join(res[k].get('error', [])[-2:])}")
    print(f"saved {out} and {out.with_suffix('.md')}")
    return 0 if all(not res[k].get("returncode") for k in names) else 1


if __name__ == "__main__":
    sys.exit(main())
