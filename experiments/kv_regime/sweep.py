"""The kv regime's runs (issue 43, item 1): many small trainings at once on one GPU, then the
gate of analysis.py on the held-out formats, scored at home on the CPU.

  train   (on the GPU node) kv documents of each run's training mixture (Run.mix, L tokens; the
          skip-bigram text too where a run has Run.lm),
          every run of --grid in parallel (one process each, one GPU shared), cut at --seconds
          (SIGTERM: a checkpoint, exit 0; rerunning resumes), then each run's last checkpoint
          exported; models and metrics packed into <= 15 MB tars under --out (what a device call
          may bring back: 8 files of 16 MiB)
  collect (here) the device calls' $OUT folders, in order: the last call's models and logs
          unpacked under --into (models/, logs/), every call's summary.json in train-summary.json
  score   (anywhere) each exported model on every format of analysis.FORMATS at L and 2L, the
          no-retrieval baseline beside; the gate per position; results.json + REGIME.md
  keep    (here) finished runs' exports, without their code, into a folder kept in git
          (models/vary: the study's grids), which score and the study read like any export

  python -m experiments.kv_regime.sweep train --shards /tmp/sh --work /tmp/w --out $OUT --grid seeds
  python -m experiments.kv_regime.sweep score --models DIR --out experiments/kv_regime/results/NAME

The runs, grid by grid: grids.py; the texts they train and are scored on: data.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Optional

from experiments.nope_length.study import TEST_SEED

from .analysis import FORMATS, TRAIN_MIX, gate, passes
from .data import SKIP_TEXTS, VARY, kv_data, skip_name, skip_text, vary_filler, zipf_filler
from .exports import KEPT, blend, finished, finished_run, first_blend, shard_name, shard_sets
from .grids import GRIDS, L, Run
from lenext_dist.flags import Parser

REPO = Path(__file__).resolve().parents[2]


def blend_yaml(pairs: list[tuple[str, float]], shards: Path) -> str:
    return "[" + ", ".join(f"{{prefix: {shards}/{n}, weight: {w}}}" for n, w in pairs) + "]"


def config(name: str, spec: Run, shards: Path, work: Path, backend: str) -> str:
    pos, layers, hidden, heads, batch, lr, seed, mix, window, bos, warm, steps = spec[:12]
    shard, bos_line = shard_name(mix, bos, fill=spec.fill), "\n  bos: true" if bos else ""
    seq, stages = L, ""
    if warm:  # stage 0 on the short documents, then the run's own mix at L (one run: train.stages)
        seq = warm.length
        stages = (f"\n        stages: [{{start_step: {warm.steps}, seq_length: {L}, global_batch_size: {batch}, "
                  f"blend: {blend_yaml(blend(shard, spec), shards)}}}],")
    inc = ", ".join(str(REPO / "configs" / c) for c in ("model/kv-tiny.yaml", "data/kv.yaml", "train/kv.yaml"))
    return f"""include: [{inc}]
name: {name}
run_dir: {work / "runs" / name}
model: {{num_layers: {layers}, hidden_size: {hidden}, num_attention_heads: {heads},
         num_query_groups: {heads}, ffn_hidden_size: {int(2.75 * hidden)}, seq_length: {seq},
         train_length: {L}}}
attention: {{position: {pos}{f", window: {window}" if window else ""}}}
data:
  tokenizer: {kv_data() / "tokenizer.model"}
  blend: {blend_yaml(first_blend(spec), shards)}
  valid_blend: [{{prefix: {shards}/{shard}_valid, weight: 1.0}}]
  seed: {1234 + seed}{bos_line}
train: {{steps: {steps}, seed: {1234 + seed}, micro_batch_size: {batch}, global_batch_size: {batch},{stages}
        eval_interval: 1000, eval_iters: 2}}
optim: {{lr: {lr}, warmup_steps: 200}}
checkpoint: {{interval: 500, keep_last: 2}}
logging: {{interval: 250}}
parallel: {{backend: {backend}}}
"""


def shard_command(shards: Path, workers: int, mix: tuple[str, ...] = TRAIN_MIX,
                  bos: bool = False, length: int = L, fill: str = "uniform") -> list[str]:
    sets = [a for p in mix for a in ("--task-set", f"kv.{p}")]
    data = kv_data()  # made here on a clean checkout: the vary filler needs its tokenizer too
    filler = data / "train" if fill == "uniform" else vary_filler(shards / VARY)
    return [sys.executable, str(REPO / "data_prep/shard.py"), "--format", "tasks", "--tasks", "kv",
            "--input", str(filler / "*.jsonl"), "--tokenizer", str(data / "tokenizer.model"),
            "--out", str(shards), "--name", shard_name(mix, bos, length, fill), "--task-passes", "32",
            "--valid-fraction", "0.01", "--workers", str(workers), *sets,
            "--task-set", f"kv.length={length - bos}", "--no-progress"]


def skip_command(shards: Path, workers: int, text: str = "filler") -> list[str]:
    """The skip-bigram text's shard: a text shard (every token trains), no validation part."""
    name = skip_name(text)
    return [sys.executable, str(REPO / "data_prep/shard.py"), "--format", "jsonl",
            "--input", str(skip_text(shards / f"{name}-text", SKIP_TEXTS[text]) / "*.jsonl"),
            "--tokenizer", str(kv_data() / "tokenizer.model"), "--out", str(shards),
            "--name", name, "--workers", str(workers), "--no-progress"]


def train(a) -> dict:
    grid = GRIDS[a.grid]
    only = [n for n in a.only.split(",") if n]
    if unknown := sorted(set(only) - set(grid)):
        raise SystemExit(f"error: --only {','.join(unknown)}: no such run in grid {a.grid} "
                         f"(its runs: {','.join(grid)})")
    names = [n for n in grid if not only or n in only]
    work, out, shards = Path(a.work), Path(a.out), Path(a.shards)
    (work / "cfg").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    for shard_set in sorted({s for n in names for s in shard_sets(grid[n])}):
        if not (shards / f"{shard_name(*shard_set)}.manifest.json").exists():
            subprocess.run(shard_command(shards, a.workers, *shard_set), check=True)
    for text in sorted({grid[n].lm_text for n in names if grid[n].lm}):
        if not (shards / f"{skip_name(text)}.manifest.json").exists():
            subprocess.run(skip_command(shards, a.workers, text), check=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "PYTHONUNBUFFERED": "1"}
    procs, logs, t0, cpus = {}, [], time.time(), os.cpu_count() or 1
    began = {n: _latest(work, n) for n in names}
    for i, n in enumerate(names):
        cfg = work / "cfg" / f"{n}.yaml"
        cfg.write_text(config(n, grid[n], shards, work, a.backend))
        pin = ["taskset", "-c", f"{(2 * i) % cpus},{(2 * i + 1) % cpus}"] if cpus >= 2 * len(names) else []
        logs.append(open(work / f"{n}.log", "a"))
        procs[n] = subprocess.Popen([*pin, sys.executable, "-m", "lenext_dist.train", "--config", str(cfg)],
                                    stdout=logs[-1], stderr=subprocess.STDOUT, env=env)
    deadline = min(t0 + a.seconds, a.until or float("inf"))
    while any(p.poll() is None for p in procs.values()) and time.time() < deadline:
        time.sleep(2)
    for p in procs.values():
        if p.poll() is None:
            p.terminate()  # the run saves a checkpoint at its next step and exits 0
    for p in procs.values():
        p.wait()
    logs += [open(work / f"{n}.convert.log", "w") for n in names]
    conv = {n: subprocess.Popen([sys.executable, "-m", "lenext_dist", "convert", "--overwrite",
                                 "--checkpoint", str(work / "runs" / n / "checkpoints"),
                                 "--out", str(work / "hf" / n)],
                                stdout=f, stderr=subprocess.STDOUT, env=env)
            for n, f in zip(names, logs[len(names):])}
    for p in conv.values():
        p.wait()
    for f in logs:
        f.close()
    summary = {"wall_s": round(time.time() - t0, 1), "runs": {}}
    for n in names:
        summary["runs"][n] = {"spec": grid[n], "rc": procs[n].returncode, "convert_rc": conv[n].returncode,
                              "latest": _latest(work, n)}
    write_summary(work, summary, a.grid, t0, began)
    _pack(work, out, names)
    return summary


def write_summary(work: Path, summary: dict, grid: str, t0: float, began: dict) -> None:
    """<work>/summary.json: this sitting's runs, and every sitting of the work folder so far (a run
    resumed over sessions says when it trained what: [checkpoint before, checkpoint after])."""
    f = work / "summary.json"
    sittings = json.loads(f.read_text()).get("sittings", []) if f.exists() else []
    sittings.append({"grid": grid, "start": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0)),
                     "end": time.strftime("%Y-%m-%dT%H:%M:%S"),
                     "runs": {n: [began[n], r["latest"]] for n, r in summary["runs"].items()}})
    f.write_text(json.dumps({**summary, "sittings": sittings}, indent=1))


def _latest(work: Path, name: str) -> Optional[str]:
    """The tag of a run's last complete checkpoint (None before its first)."""
    latest = work / "runs" / name / "checkpoints" / "latest"
    return latest.read_text().strip() if latest.exists() else None


def _pack(work: Path, out: Path, names: list[str]) -> None:
    with tarfile.open(out / "logs.tar.gz", "w:gz") as t:
        t.add(work / "summary.json", "summary.json")
        for n in names:
            for f in (work / f"{n}.log", work / f"{n}.convert.log", work / "runs" / n / "metrics.jsonl"):
                if f.exists():
                    t.add(f, f"{n}/{f.name}")
    packs, size = [[]], 0
    for n in names:
        if (work / "hf" / n / "config.json").exists():
            s = sum(f.stat().st_size for f in (work / "hf" / n).rglob("*") if f.is_file())
            if packs[-1] and size + s > 15e6:
                packs.append([])
                size = 0
            packs[-1].append(n)
            size += s
    for i, pk in enumerate(p for p in packs if p):
        with tarfile.open(out / f"hf{i}.tar.gz", "w:gz") as t:
            for n in pk:
                t.add(work / "hf" / n, n)


def collect(a) -> dict:
    """What the device calls brought back -> <into>/models, <into>/logs, <into>/train-summary.json.
    A later call resumed the runs of the one before and packed everything again: its models and
    logs are the runs' last; each call's summary.json (wall time, each run's last checkpoint)."""
    calls = [Path(c) for c in a.calls]
    for c in calls:
        if not (c / "logs.tar.gz").is_file():
            raise SystemExit(f"error: {c} has no logs.tar.gz: not the $OUT of a `sweep.py train` call")
    into = Path(a.into)
    if (into / "models").exists() or (into / "logs").exists():
        raise SystemExit(f"error: {into} already holds models/ or logs/: collect into a new folder")
    last = calls[-1]
    packs = sorted(last.glob("hf*.tar.gz"))
    if not packs:
        raise SystemExit(f"error: {last} (the last call) has no hf*.tar.gz: its exports failed "
                         "(see its logs.tar.gz: <run>/<run>.convert.log)")
    try:
        summaries = []
        for c in calls:
            with tarfile.open(c / "logs.tar.gz") as t:
                summaries.append(json.load(t.extractfile("summary.json")))
        with tarfile.open(last / "logs.tar.gz") as t:
            t.extractall(into / "logs", filter="data")
        for pack in packs:
            with tarfile.open(pack) as t:
                t.extractall(into / "models", filter="data")
    except (tarfile.TarError, KeyError, ValueError, OSError) as e:
        raise SystemExit(f"error: a damaged pack under {', '.join(map(str, calls))}: {e}") from None
    record = {"device": a.device, "calls": summaries}
    (into / "train-summary.json").write_text(json.dumps(record, indent=1))
    return record


def keep(a) -> dict:
    """Finished runs' exports (<models>/<run>) -> <into>/<run>: weights, config, tokenizer, run
    config and the run's <logs>/<run>/metrics.jsonl, not the modeling code (a copy of lenext_dist's,
    written back when the folder is scored or studied: exports.finished). What is kept in git
    outlives the work folder, which a new machine does not bring (29 Nov: three finished NoPE runs,
    ~7 h of CPU, lost with it). --models/--logs: a CPU work folder's hf/ and runs/, or what `collect`
    unpacked (models/, logs/)."""
    grid, models, into = GRIDS[a.grid], Path(a.models), Path(a.into)
    kept = {}
    for n in [n for n in a.only.split(",") if n]:
        src, dst = models / n, into / n
        if not (src / "config.json").is_file():
            raise SystemExit(f"error: {src} holds no export (config.json): is --models the exports' folder?")
        _, kept[n] = finished_run(src, grid, f"grid {a.grid}", "keep finished runs only")
        if dst.exists():
            raise SystemExit(f"error: {dst} exists: a kept run is never overwritten (remove it first)")
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        metrics = Path(a.logs) / n / "metrics.jsonl" if a.logs else None
        if metrics and metrics.is_file():
            shutil.copyfile(metrics, dst / "metrics.jsonl")
        (dst / KEPT).write_text(json.dumps({"grid": a.grid, "run": n, "checkpoint": kept[n],
                                            "from": str(src.resolve()),
                                            **({"device": a.device} if a.device else {}),
                                            "kept": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                            "sittings": _sittings(a.summary, n)}, indent=1))
    return {"runs": kept}


def _sittings(summary: Optional[str], name: str) -> list[dict]:
    """When a run trained what: each sitting of a work folder's summary.json (write_summary's
    record) that trained it, as {start, end, checkpoints: [before, after]}."""
    f = Path(summary) if summary else None
    sittings = json.loads(f.read_text()).get("sittings", []) if f and f.is_file() else []
    return [{"start": s["start"], "end": s["end"], "checkpoints": s["runs"][name]}
            for s in sittings if name in s.get("runs", {})]


def score(a) -> dict:
    from lenext_dist.eval.jobs import TasksJob

    out, grid = Path(a.out), GRIDS[a.grid]
    filler = {"uniform": kv_data() / "heldout/filler.jsonl", "zipf": zipf_filler(out / "filler-zipf.jsonl")}
    found = finished(Path(a.models), grid, f"grid {a.grid}",
                     "score finished runs only (a folder of them: sweep keep)", named=True)
    if not found:
        raise SystemExit(f"error: {a.models} holds no run of grid {a.grid} ({', '.join(grid)})")
    models, tags = [f for f, _, _ in found], {f.name: tag for f, _, tag in found}
    scores, cells, versions = {}, {}, set()
    for m in models:
        for fname, params, fill in FORMATS:
            # the checkpoint names the folder: a later export of the same run is another model
            job = TasksJob(model=str(m), data=[str(filler[fill])], lengths=[L, 2 * L], tasks=["kv"],
                           docs=a.docs, seed=TEST_SEED, task_set=[f"kv.{p}" for p in params],
                           out=str(out / "eval" / m.name / tags[m.name]
                                   / fname.replace(" ", "_").replace(",", "")),
                           no_progress=True)
            if not job.done():
                job.run()
            res = json.loads(job.result_path.read_text())
            versions.add(res["args"]["protocol_version"])
            res = res["cells"]
            cells.setdefault(m.name, {})[fname] = [
                {"length": c["length"], "accuracy": c["accuracy"], "baseline": c["baseline"]["accuracy"]}
                for c in res]
            scores.setdefault(m.name, {})[fname] = (res[0]["accuracy"], res[0]["baseline"]["accuracy"])
    (version,) = versions  # one job class scored them all
    record = {"L": L, "docs": a.docs, "test_seed": TEST_SEED, "grid": a.grid, "checkpoints": tags,
              "tasks_protocol_version": version, "formats": [list(f) for f in FORMATS],
              "cells": cells, "gate": gate(scores), "valid_loss": _valid_losses(a.logs, cells),
              "note": a.note}
    (out / "results.json").write_text(json.dumps(record, indent=1))
    (out / "REGIME.md").write_text(render(record))
    return record


def _valid_losses(logs, names) -> dict:
    """model -> [[step, validation loss], ...] from <logs>/<model>/metrics.jsonl (none without logs)."""
    out = {}
    for n in names if logs else ():
        f = Path(logs) / n / "metrics.jsonl"
        if f.exists():
            rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
            out[n] = [[r["step"], round(r["valid_loss"], 4)] for r in rows if "valid_loss" in r]
    return out


def render(r: dict) -> str:
    fm = [f[0] for f in r["formats"]]
    lines = ["# The kv regime: retrieval in held-out formats", "",
             f"Generated by experiments/kv_regime/sweep.py from results.json. Whole-answer accuracy at "
             f"L = {r['L']} / 2L of {r['docs']} test documents per format (held-out filler, test seed "
             f"{r['test_seed']}); in brackets the no-retrieval baseline at L; * = passes the gate at L "
             "(analysis.py)."
             + (f" Runs of grid {r['grid']} at their checkpoints "
                + ", ".join(f"{m} {t}" for m, t in sorted(r["checkpoints"].items()))
                + f"; `lenext eval tasks` protocol version {r['tasks_protocol_version']}."
                if "grid" in r else ""), ""]
    if r.get("note"):
        lines += [r["note"], ""]
    lines += ["| model | " + " | ".join(fm) + " |", "|---|" + "---|" * len(fm)]
    for m, row in sorted(r["cells"].items()):
        def cell(f):
            c = row[f]
            star = "*" if passes(c[0]["accuracy"], c[0]["baseline"]) else ""
            return f"{c[0]['accuracy']:.2f}{star} / {c[1]['accuracy']:.2f} ({c[0]['baseline']:.2f})"
        lines.append(f"| {m} | " + " | ".join(cell(f) for f in fm) + " |")
    lines += ["", "## Gate (every seed, every format; analysis.py)", ""]
    for pos, g in r["gate"].items():
        lines.append(f"- {pos}: **{g['verdict']}** (seeds {', '.join(g['seeds'])}; "
                     f"{len(g['failures'])} failing cell{'' if len(g['failures']) == 1 else 's'})")
    if r.get("valid_loss"):
        lines += ["", "## Validation loss on the training mixture (answer tokens), by step", "",
                  "| model | " + " | ".join(str(s) for s, _ in max(r["valid_loss"].values(), key=len)) + " |"]
        width = len(max(r["valid_loss"].values(), key=len))
        lines.append("|---|" + "---|" * width)
        for m, v in sorted(r["valid_loss"].items()):
            lines.append(f"| {m} | " + " | ".join(f"{x:.3f}" for _, x in v) + " |" + " |" * (width - len(v)))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = Parser(prog="python -m experiments.kv_regime.sweep", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--shards", required=True)
    t.add_argument("--work", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--grid", choices=sorted(GRIDS), default="seeds")
    t.add_argument("--only", default="", help="the grid's runs to train, comma-separated (default: all)")
    t.add_argument("--seconds", type=float, default=300, help="training time after the data are made")
    t.add_argument("--until", type=float, default=0,
                   help="also stop training by this Unix time (gpu.sh: its call's end less the export's)")
    t.add_argument("--backend", default="nccl")
    t.add_argument("--workers", type=int, default=8, help="data prep processes")
    t.add_argument("--threads", type=int, default=1, help="CPU threads per run (a CPU-only run: the cores)")
    c = sub.add_parser("collect")
    c.add_argument("calls", nargs="+", help="each device call's $OUT folder (files_at), in order")
    c.add_argument("--into", required=True, help="a new folder: models/, logs/, train-summary.json")
    c.add_argument("--device", required=True, help="the device, as its reply named it")
    s = sub.add_parser("score")
    s.add_argument("--models", required=True, help="folder of exported models (one folder each)")
    s.add_argument("--grid", choices=sorted(GRIDS), required=True,
                   help="the grid the models are finished runs of")
    s.add_argument("--out", required=True)
    s.add_argument("--logs", help="folder of <model>/metrics.jsonl (the train step's logs.tar.gz)")
    s.add_argument("--docs", type=int, default=128)
    s.add_argument("--note", default="")
    k = sub.add_parser("keep", help="copy finished runs' exports into a folder kept in git (no code)")
    k.add_argument("--grid", choices=sorted(GRIDS), required=True)
    k.add_argument("--models", required=True, help="folder of exports, <run>/ each (a work folder's hf/)")
    k.add_argument("--logs", help="folder of <run>/metrics.jsonl (a work folder's runs/)")
    k.add_argument("--summary", help="the work folder's summary.json (the sittings that trained each run)")
    k.add_argument("--only", required=True, help="the runs to keep, comma-separated")
    k.add_argument("--into", required=True, help="e.g. experiments/kv_regime/models/vary")
    k.add_argument("--device", default="", help="where the runs trained, if not this machine's CPU "
                   "(collect's --device; the run config's parallel.backend says gloo or nccl)")
    a = ap.parse_args(argv)
    res = {"train": train, "collect": collect, "score": score, "keep": keep}[a.cmd](a)
    print(json.dumps(res.get("gate", res.get("runs", res.get("calls"))), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
