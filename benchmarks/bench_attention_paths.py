#!/usr/bin/env python
"""Kernels for attention with a distance bias / window mask, side by side on this machine:

  chunked    query chunks of SDPA with [h, chunk, keys] additive mask blocks (lenext default on CPU)
  flex       FlexAttention under torch.compile (score_mod + block mask; compile time reported
             apart; forward only on CPU: torch has no FlexAttention backward there)
  sdpa_mask  one SDPA call with the full [h, L, L] additive mask
  eager      explicit fp32 softmax by query chunks (the reference)
  (sdpa_causal: plain causal SDPA without bias, the floor)

Cases: `alibi` (bias, full causal), `window` (NoPE with a sliding window W, mask only),
`alibi_window` (both). Time = median of --repeats rounds in which every path runs once in turn
(so load from other processes hits all paths alike); forward without autograd, and with --train
also forward+backward of the differentiable paths. Peak memory = the largest increase of the
bytes glibc malloc has handed out (`mallinfo2`: uordblks + hblkhd, i.e. live tensors), sampled
every 0.5 ms by a thread during one call (torch ops release the GIL).

    python benchmarks/bench_attention_paths.py [--lengths 2048 4096 8192 --heads 4 --window 2048]
        [--threads 2] [--train] [--out runs/bench_attention_paths.json]
"""
import argparse
import ctypes
import functools
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lenext_dist.attention import build_position  # noqa: E402
from lenext_dist.attention.core import BIAS_IMPLS, eager_causal_attention  # noqa: E402
from lenext_dist.attention.paths import flex_available  # noqa: E402


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _Mallinfo2


def malloc_in_use() -> int:
    """Bytes the glibc allocator has handed out and not taken back (heap + mmapped chunks): live
    tensors, independent of what the allocator keeps cached in RSS."""
    mi = _libc.mallinfo2()
    return mi.uordblks + mi.hblkhd


class PeakMem:
    """Peak increase of `malloc_in_use` while the block runs, sampled every `every` seconds."""

    def __init__(self, every: float = 0.0005):
        self.every = every

    def __enter__(self):
        self.base = self.peak = malloc_in_use()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, malloc_in_use())
            time.sleep(self.every)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.delta = self.peak - self.base


def variant_for(case: str, heads: int, head_dim: int, window: int, train_length: int):
    from types import SimpleNamespace as NS

    pos = "alibi" if case.startswith("alibi") else "nope"
    w = window if case.endswith("window") else None
    return build_position(NS(position=pos, window=w), head_dim=head_dim,
                          train_length=train_length, num_heads=heads)


def run_path(path, q, k, v, m, var, chunk_size):
    bias = var.distance_bias(k.shape[2]) if var.has_bias else None
    if path == "eager":
        return eager_causal_attention(q, k, v, m, score_mod=var.score_mod, chunk_size=1024)
    if path == "sdpa_causal":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=k.shape[1] != q.shape[1])
    return BIAS_IMPLS[path](q, k, v, m, bias=bias, mask=var.mask, chunk_size=chunk_size)


def interleaved(fns: dict, repeats: int) -> dict:
    """{name: (median seconds, peak malloc increase bytes)}: every fn warmed up once, then timed in
    `repeats` alternating rounds (machine noise hits all alike), then one call each under PeakMem."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    out = {}
    for name, fn in fns.items():
        with PeakMem() as mem:
            fn()
        out[name] = (statistics.median(times[name]), mem.delta)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--groups", type=int, default=None, help="key/value heads (default: heads)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--cases", nargs="+", default=["alibi", "window"])
    ap.add_argument("--paths", nargs="+", default=["chunked", "flex", "sdpa_mask", "eager",
                                                   "sdpa_causal"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train", action="store_true", help="also time forward+backward (no flex)")
    ap.add_argument("--max-mask-gib", type=float, default=2.0,
                    help="skip sdpa_mask when its [h, L, L] mask would exceed this")
    ap.add_argument("--out", default="runs/bench_attention_paths.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = a.groups or a.heads
    paths = [p for p in a.paths if p != "flex" or flex_available()]
    rows = []
    load_start = os.getloadavg()
    print(f"load average {load_start[0]:.2f} (other processes share these cores: compare paths "
          f"within a run, they are timed in alternating rounds)")
    print(f"torch {torch.__version__}, {a.threads} threads, b=1 h={a.heads} g={g} d={a.head_dim}, "
          f"window {a.window}, chunk {a.chunk_size}")
    for case in a.cases:
        for s in a.lengths:
            var = variant_for(case, a.heads, a.head_dim, a.window, train_length=a.window)
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(1, a.heads, s, a.head_dim, generator=gen)
            k = torch.randn(1, g, s, a.head_dim, generator=gen)
            v = torch.randn(1, g, s, a.head_dim, generator=gen)
            m = torch.ones(a.heads)
            fwd, compile_s = {}, {}
            for path in paths:
                if path == "sdpa_mask" and a.heads * s * s * 4 / 2 ** 30 > a.max_mask_gib:
                    rows.append(dict(case=case, length=s, path=path, mode="fwd",
                                     skipped="mask too big"))
                    continue
                fwd[path] = functools.partial(run_path, path, q, k, v, m, var, a.chunk_size)
                if path == "flex":  # first call compiles: time it apart
                    with torch.no_grad():
                        t0 = time.perf_counter()
                        fwd[path]()
                        compile_s[path] = round(time.perf_counter() - t0, 2)
            with torch.no_grad():
                res = interleaved(fwd, a.repeats)
                ref = run_path("eager", q, k, v, m, var, a.chunk_size)
                for path, (sec, mem) in res.items():
                    rec = dict(case=case, length=s, path=path, mode="fwd", sec=round(sec, 4),
                               peak_mib=round(mem / 2 ** 20, 1))
                    if path in compile_s:
                        rec["compile_s"] = compile_s[path]
                    if path != "sdpa_causal":
                        rec["max_abs_err_vs_eager"] = float((fwd[path]() - ref).abs().max())
                    rows.append(rec)
                    print(f"{case:13s} L={s:5d} {path:11s} fwd  {sec * 1e3:9.1f} ms  "
                          f"peak +{mem / 2 ** 20:8.1f} MiB"
                          + (f"  (compile {compile_s[path]} s)" if path in compile_s else ""))
            if a.train:
                train = {}
                for path in [p for p in fwd if p in ("chunked", "sdpa_mask", "eager", "sdpa_causal")]:
                    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

                    def step(path=path, qg=qg, kg=kg, vg=vg):
                        run_path(path, qg, kg, vg, m, var, a.chunk_size).sum().backward()

                    train[path] = step
                for path, (sec, mem) in interleaved(train, a.repeats).items():
                    rows.append(dict(case=case, length=s, path=path, mode="fwd+bwd",
                                     sec=round(sec, 4), peak_mib=round(mem / 2 ** 20, 1)))
                    print(f"{case:13s} L={s:5d} {path:11s} f+b  {sec * 1e3:9.1f} ms  "
                          f"peak +{mem / 2 ** 20:8.1f} MiB")
    # ratios against chunked (time and memory), per case / length / mode
    print("\nratios vs chunked (time x, peak-memory x):")
    by = {(r["case"], r["length"], r["mode"], r["path"]): r for r in rows if "sec" in r}
    for (case, s, mode, path), r in sorted(by.items()):
        base = by.get((case, s, mode, "chunked"))
        if base and path != "chunked":
            r["time_vs_chunked"] = round(r["sec"] / base["sec"], 3)
            r["mem_vs_chunked"] = (round(r["peak_mib"] / base["peak_mib"], 3)
                                   if base["peak_mib"] > 0 else None)
            print(f"  {case:13s} L={s:5d} {mode:7s} {path:11s} time x{r['time_vs_chunked']:6.2f}"
                  f"  mem x{r['mem_vs_chunked']}")
    result = dict(torch=torch.__version__, threads=a.threads, cpu=platform.processor() or
                  platform.machine(), cores=os.cpu_count(), heads=a.heads, groups=g,
                  head_dim=a.head_dim, window=a.window, chunk_size=a.chunk_size,
                  load_avg_start=load_start[0], load_avg_end=os.getloadavg()[0], rows=rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
