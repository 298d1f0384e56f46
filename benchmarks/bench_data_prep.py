#!/usr/bin/env python3
"""Data-prep speed: whole `shard.py` runs vs a bare SentencePiece script of the same workers.

Both sides are timed as whole processes, interpreter start to exit, on the same files:
  bare   python -c: import sentencepiece, read the jsonl lines, json.loads, sp.encode
         (numpy output, one thread); with W > 1 workers the encode runs in Pool(W)
         (imap over batches of documents), the way a user would parallelize it
  shard  data_prep/shard.py --workers W: plan, read, encode, write megatron partials,
         hash inputs/outputs, merge, manifest
ratio = bare seconds / shard seconds (>= 0.9 is the target), on wall time and on CPU time
(the commands and their workers; insensitive to other load on a shared machine). Rounds interleave bare and
shard runs so background load hits both alike; the best (lowest) time of each is kept and
every round is recorded.

Corpora (built offline, in a temporary directory):
  real-1x12MB  one 12 MB .jsonl of long real documents: the running Python's standard
               library sources, the system's /usr/share/doc texts, then the installed
               site-packages sources, one file = one document, in sorted path order
  real-4x12MB  four such files (48 MB), continuing through the same sources
  sample       the embedded sample (data/sample, 8 SlimPajama-layout .jsonl.zst files, 4K vocab)
The real corpora use the 32K Mistral v1 SentencePiece model from the `mistral-common`
wheel (Apache-2.0; `pip install --no-deps mistral-common`, done by `make bench`), found
without importing the package, or --tokenizer.

Each shard output is checked: byte-identical across worker counts, and (first corpus)
every document equal to sp.encode(text) + [eos].

  python benchmarks/bench_data_prep.py [--workers 1 2] [--rounds 2] [--tokenizer M]
                                       [--out results/bench_data_prep.json]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "data", "sample")
SHARD = os.path.join(REPO, "data_prep", "shard.py")
FILE_BYTES = 12_000_000

BARE = r"""
import json, sys
import sentencepiece as spm
model, workers, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
sp = spm.SentencePieceProcessor(model_file=model)
def read():
    for p in paths:
        if p.endswith(".zst"):
            import io, zstandard
            f = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(p, "rb")), "utf-8")
        else:
            f = open(p, encoding="utf-8")
        for line in f:
            yield json.loads(line)["text"]
def batches(n=32):
    b = []
    for t in read():
        b.append(t)
        if len(b) == n:
            yield b
            b = []
    if b:
        yield b
def enc(texts):
    ids = sp.encode(texts, num_threads=1, return_type="numpy")
    return sum(len(x) for x in ids)
if workers == 1:
    n = sum(map(enc, batches()))
else:
    from multiprocessing import Pool
    with Pool(workers) as pool:
        n = sum(pool.imap(enc, batches()))
print(n)
"""


def machine() -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import sentencepiece

    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "sentencepiece": sentencepiece.__version__}


def mistral_model() -> str | None:
    spec = importlib.util.find_spec("mistral_common")  # locate only: its deps may be absent
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "data", "tokenizer.model.v1")
    return path if os.path.isfile(path) else None


def _texts():
    """Real long documents available offline, in a fixed order (one file = one document)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    site = sysconfig.get_paths()["purelib"]
    sources = [sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)),
               sorted(p for p in glob.glob("/usr/share/doc/**/*", recursive=True)
                      if os.path.isfile(p) and not os.path.islink(p)),
               sorted(glob.glob(os.path.join(site, "**", "*.py"), recursive=True))]
    for paths in sources:
        for p in paths:
            try:
                raw = open(p, "rb").read()
                if p.endswith(".gz"):
                    raw = gzip.decompress(raw)
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
                continue
            if len(text) > 2000 and not text.isspace():
                yield text


def make_real(work: str, n_files: int) -> list[str]:
    os.makedirs(work, exist_ok=True)
    paths, texts = [], _texts()
    for i in range(n_files):
        p = os.path.join(work, f"docs-{i}.jsonl")
        size = 0
        with open(p, "w", encoding="utf-8") as f:
            for t in texts:
                line = json.dumps({"text": t}) + "\n"
                f.write(line)
                size += len(line.encode())
                if size >= FILE_BYTES:
                    break
        paths.append(p)
    return paths


def _children_cpu() -> float:
    # CPU of reaped descendants (the command and the pool workers it reaped)
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of a whole command, interpreter start to exit."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    t0, c0 = time.perf_counter(), _children_cpu()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if r.returncode != 0:
        sys.exit(f"benchmark command failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return dt, cpu


def outputs(out: str) -> str:
    h = hashlib.sha256()
    for ext in (".bin", ".idx"):
        h.update(open(os.path.join(out, "b_train" + ext), "rb").read())
    return h.hexdigest()


def check_tokens(inputs: list[str], out: str, model: str) -> int:
    """Every document of the shard equals sp.encode(text) + [eos], in input order."""
    import numpy as np
    import sentencepiece as spm

    sys.path.insert(0, REPO)
    from lenext_dist.prep.mcore_io import indexed_dataset

    sp = spm.SentencePieceProcessor(model_file=model)
    idx = indexed_dataset()._IndexReader(os.path.join(out, "b_train.idx"), multimodal=False)
    data = np.fromfile(os.path.join(out, "b_train.bin"), dtype=idx.dtype)
    texts = [json.loads(ln)["text"] for p in inputs for ln in open(p, encoding="utf-8")]
    assert len(texts) == len(idx), (len(texts), len(idx))
    for k, t in enumerate(texts):
        a = idx.sequence_pointers[k] // idx.dtype_size
        got = data[a:a + idx.sequence_lengths[k]].tolist()
        assert got == sp.encode(t) + [sp.eos_id()], f"document {k} differs from sp.encode"
    return len(texts)


def bench(name: str, inputs: list[str], fmt: str, model: str, workers: list[int], rounds: int,
          work: str, check: bool) -> dict:
    rows = {w: {"workers": w, "bare_s": [], "shard_s": [], "bare_cpu_s": [], "shard_cpu_s": [],
                "load1": []} for w in workers}
    digests = {}
    for r in range(rounds):
        for w in workers:
            rows[w]["load1"].append(os.getloadavg()[0])
            bare, bare_cpu = timed([sys.executable, "-c", BARE, model, str(w), *inputs])
            out = os.path.join(work, f"out-{name}-w{w}-r{r}")
            shard, shard_cpu = timed([sys.executable, SHARD, "--input", *inputs, "--format", fmt,
                              "--tokenizer", model, "--out", out, "--name", "b", "--workers",
                              str(w), "--no-progress"])
            rows[w]["bare_s"].append(round(bare, 3))
            rows[w]["shard_s"].append(round(shard, 3))
            rows[w]["bare_cpu_s"].append(round(bare_cpu, 3))
            rows[w]["shard_cpu_s"].append(round(shard_cpu, 3))
            digests.setdefault(outputs(out), []).append(f"w{w}r{r}")
            if check and r == 0 and w == workers[0]:
                rows[w]["documents_checked"] = check_tokens(inputs, out, model)
    if len(digests) != 1:
        sys.exit(f"{name}: shard outputs differ between runs: {digests}")
    for row in rows.values():
        row["ratio"] = round(min(row["bare_s"]) / min(row["shard_s"]), 3)
        # CPU seconds are immune to other load on a shared machine (wall times are not)
        row["ratio_cpu"] = round(min(row["bare_cpu_s"]) / min(row["shard_cpu_s"]), 3)
    m = json.load(open(os.path.join(work, f"out-{name}-w{workers[0]}-r0", "b.manifest.json")))
    return {"corpus": name, "files": len(inputs), "bytes": sum(map(os.path.getsize, inputs)),
            "documents": m["documents"]["read"], "tokens": m["tokens"]["train"],
            "tokenizer": model, "identical_across_workers": True, "results": list(rows.values())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=2, help="rounds (best time of each side kept)")
    p.add_argument("--tokenizer", default=None, help="32K model (default: mistral-common's v1)")
    p.add_argument("--corpora", nargs="+", default=["real-1x12MB", "real-4x12MB", "sample"],
                   choices=["real-1x12MB", "real-4x12MB", "sample"])
    p.add_argument("--out", default=os.path.join(REPO, "results", "bench_data_prep.json"))
    args = p.parse_args()

    model = args.tokenizer or mistral_model()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-prep-") as work:
        real = [c for c in args.corpora if c.startswith("real")]
        if real and model is None:
            print("note: no 32K model (pip install --no-deps mistral-common, or --tokenizer): "
                  "real corpora skipped", file=sys.stderr)
        elif real:
            files = make_real(os.path.join(work, "real"), 4 if "real-4x12MB" in real else 1)
            if "real-1x12MB" in real:
                results.append(bench("real-1x12MB", files[:1], "jsonl", model, args.workers,
                                     args.rounds, work, check=True))
            if "real-4x12MB" in real:
                results.append(bench("real-4x12MB", files, "jsonl", model, args.workers,
                                     args.rounds, work, check=False))
        if "sample" in args.corpora:
            sample = sorted(glob.glob(os.path.join(SAMPLE, "slimpajama", "chunk*", "*.jsonl.zst")))
            results.append(bench("sample", sample, "slimpajama",
                                 os.path.join(SAMPLE, "tokenizer.model"), args.workers,
                                 args.rounds, work, check=False))
    result = {"benchmark": "data_prep", "machine": machine(), "rounds": args.rounds,
              "target_ratio": 0.9, "corpora": results}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    m = result["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
          f"sentencepiece {m['sentencepiece']}")
    for c in results:
        print(f"{c['corpus']}: {c['files']} files, {c['bytes'] / 1e6:.1f} MB, {c['documents']} docs, "
              f"{c['tokens']:,} tokens ({os.path.basename(c['tokenizer'])})")
        for r in c["results"]:
            print(f"  {r['workers']} worker(s): bare {min(r['bare_s']):.2f} s, shard.py "
                  f"{min(r['shard_s']):.2f} s: {r['ratio']:.2f}x wall, {r['ratio_cpu']:.2f}x CPU "
                  f"(rounds: bare {r['bare_s']}, "
                  f"shard {r['shard_s']}; load {r['load1']})")
    print(f"result: {args.out}")


if __name__ == "__main__":
    main()
