"""`lenext extend`: the paper's length-extension workflow for one pretrained run.

    lenext extend --base runs/tiny-cpu-nope --targets 256,512

For a base run (its folder holds config.yaml and checkpoints/) and target lengths T:
  1. export the base checkpoint to HF                                   out/hf/base
  2. uniform-scale sweep at the longest target; fit c(s) = 1 + a ln s  out/eval/sweep
  3. per T: HeadScale search at L' = ceil(T x overshoot) (paper: 18K for 16K), m_h initialized
     at the fitted c(T/L), everything else frozen, launched like pretraining   out/hs-T
  4. export each search                                                 out/hf/hs-T
  5. evaluate the base (as pretrained), best uniform c(T) and HeadScale: PPL at 1x..8x L, passkey, entropy
  6. one report with the tables, plots and the paper's claims checked   out/report.md
Every step is skipped when its output exists (rerun after a kill to continue; the search itself
resumes from its latest checkpoint), so the whole workflow is resumable.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Optional

import yaml

from lenext_dist.errors import UserError, entry_point

REPO = Path(__file__).resolve().parents[1]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def build_parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="lenext extend", description=__doc__)
    p.add_argument("--base", required=True, help="pretraining run folder (config.yaml, checkpoints/)")
    p.add_argument("--targets", type=_ints, required=True, help="target lengths, e.g. 256,512")
    p.add_argument("--out", default=None, help="output folder (default <base>/extend)")
    g = p.add_argument_group("HeadScale search (paper defaults)")
    g.add_argument("--steps", type=int, default=200)
    g.add_argument("--lr", type=float, default=0.1)
    g.add_argument("--warmup", type=int, default=20)
    g.add_argument("--global-batch", type=int, default=8)
    g.add_argument("--micro-batch", type=int, default=None, help="default: global / nproc")
    g.add_argument("--overshoot", type=float, default=1.125, help="L' = ceil(T x overshoot)")
    g.add_argument("--min-value", default="1.0", help="m_h lower bound, or 'none' (ablation)")
    g.add_argument("--init", default="fit", help="'fit' (the sweep's c(T)), or a number (ablation: 1)")
    g.add_argument("--zero-stage", type=int, default=2)
    g.add_argument("--nproc", type=int, default=2, help="ranks of the search (deepspeed --num_gpus)")
    g.add_argument("--port", type=int, default=29531)
    g.add_argument("--activation-checkpointing", action="store_true")
    g = p.add_argument_group("evaluation")
    g.add_argument("--data", nargs="+", default=["data/sample/heldout/books.jsonl.zst"])
    g.add_argument("--eval-factors", type=_ints, default=[1, 2, 4, 8], help="lengths = L x these")
    g.add_argument("--stride", type=int, default=None, help="PPL stride (default L/2)")
    g.add_argument("--budget-tokens", type=int, default=20000, help="scored tokens per PPL cell")
    g.add_argument("--c-min", type=float, default=0.8)
    g.add_argument("--c-max", type=float, default=2.0)
    g.add_argument("--c-step", type=float, default=0.01)
    g.add_argument("--passkey-keys", type=int, default=5, help="0 skips passkey")
    g.add_argument("--passkey-lengths", type=_ints, default=None,
                   help="default: the evaluation lengths >= 128 (a prompt needs ~80 tokens plus filler)")
    g.add_argument("--passkey-depths", default="5")
    g.add_argument("--entropy-samples", type=int, default=4, help="0 skips entropy")
    g.add_argument("--threads", type=int, default=None)
    return p


def _eval(*args: str) -> None:
    from lenext_dist.cli import main

    rc = main(["eval", *args])  # the wrapped main: a user error is printed and returned as 2
    if rc not in (0, None):
        raise UserError(f"lenext eval {' '.join(args)} exited {rc} (its error is above)")


def _done(path: Path) -> bool:
    return path.exists()


def run(a) -> str:
    from lenext_dist.convert import export
    from lenext_dist.eval.cli import result_suffix
    from lenext_dist.eval.scale_sweep import best_c_for_length
    from lenext_dist.train.checkpoint import resolve, run_config

    base = Path(a.base)
    out = Path(a.out or base / "extend")
    out.mkdir(parents=True, exist_ok=True)
    ckpt = resolve(base / "checkpoints")
    cfg = run_config(ckpt)
    L = cfg.model.base_length  # the pretrained L (an extension fine-tune runs longer than it)
    common = ["--data", *a.data, "--no-progress"] + (["--threads", str(a.threads)] if a.threads else [])

    hf_base = out / "hf" / "base"
    if not _done(hf_base / "config.json"):
        export(ckpt, hf_base, overwrite=True)
    sweep = out / "eval" / "sweep"
    if not _done(sweep / "scale_sweep.json"):
        _eval("scale-sweep", "--model", str(hf_base), "--out", str(sweep), "--length", str(max(a.targets)),
              "--c-min", str(a.c_min), "--c-max", str(a.c_max), "--c-step", str(a.c_step), *common)
    best_c = {T: round(best_c_for_length(str(sweep), T), 4) for T in a.targets}
    print(f"[extend] fitted uniform scales c(T): {best_c}", flush=True)

    models = {"base": (hf_base, None)}  # as pretrained (its own attention.scale_c, not forced to 1)
    for T in a.targets:
        models[f"uniform-{T}"] = (hf_base, best_c[T])
        hs_dir = out / f"hs-{T}"
        _search(a, cfg, ckpt, hs_dir, T, best_c[T])
        hf = out / "hf" / f"hs-{T}"
        if not _done(hf / "config.json"):
            export(hs_dir / "checkpoints", hf, overwrite=True)
        models[f"headscale-{T}"] = (hf, None)

    lengths = ",".join(str(L * f) for f in a.eval_factors)
    pk_lengths = ",".join(str(n) for n in (a.passkey_lengths or [L * f for f in a.eval_factors if L * f >= 128]))
    stride = str(a.stride or max(1, L // 2))
    for name, (model, c) in models.items():
        dst = out / "eval" / name
        scale = ["--scale-c", str(c)] if c is not None else []
        sfx = result_suffix(scale_c=c)  # exact names: a folder from another scale is not "done"
        if not _done(dst / f"ppl_last-stride{sfx}.json"):
            _eval("ppl", "--model", str(model), "--out", str(dst), "--lengths", lengths, "--stride", stride,
                  "--budget-tokens", str(a.budget_tokens), *scale, *common)
        if a.passkey_keys and pk_lengths and not _done(dst / f"passkey{sfx}.json"):
            _eval("passkey", "--model", str(model), "--out", str(dst), "--lengths", pk_lengths,
                  "--depths", a.passkey_depths, "--keys", str(a.passkey_keys), "--no-progress", *scale)
        if a.entropy_samples and not _done(dst / f"entropy{sfx}_{max(a.targets)}.json"):
            _eval("entropy", "--model", str(model), "--out", str(dst), "--length", str(max(a.targets)),
                  "--samples", str(a.entropy_samples), *scale, *common)

    from lenext_dist.eval.report import write_report

    runs = [str(out / "eval" / n) for n in ["sweep", *models]]
    report = write_report(runs, str(out / "report.md"), f"Length extension of {base.name}")
    claims = compare(out, a.targets, L, best_c)
    with open(report, "a") as f:
        f.write("\n" + claims)
    print(f"[extend] report: {report}", flush=True)
    return report


def _search(a, cfg, ckpt: Path, run_dir: Path, target: int, c_fit: float) -> None:
    """Write the search's config (the base run's, overridden) and launch it; resumes if killed."""
    from lenext_dist.train.checkpoint import latest_tag

    Lp = int(math.ceil(target * a.overshoot / 8) * 8)  # a little past the target, multiple of 8
    init = c_fit if a.init == "fit" else float(a.init)
    micro = a.micro_batch or max(1, a.global_batch // a.nproc)
    ckpt_dir = run_dir / "checkpoints"
    if latest_tag(ckpt_dir) == f"step_{a.steps:07d}":
        return
    overrides = {
        "include": [str((ckpt / "config.yaml").resolve())],
        "name": run_dir.name, "run_dir": str(run_dir), "model": {"seq_length": Lp, "train_length": cfg.model.base_length},
        "attention": {"scale_c": init, "head_scale": {
            "enabled": True, "trainable": True, "init": init,
            "min_value": None if a.min_value.lower() == "none" else float(a.min_value)}},
        "train": {"mode": "headscale", "steps": a.steps, "global_batch_size": a.global_batch,
                  "micro_batch_size": micro, "grad_accum": None, "eval_interval": 0,
                  "activation_checkpointing": a.activation_checkpointing},
        "optim": {"lr": a.lr, "warmup_steps": a.warmup, "min_lr_ratio": 0.1, "weight_decay": 0.0},
        "data": {"seed": cfg.data.seed + 1, "cache_dir": None},  # fresh data order, as the paper
        "parallel": {"zero_stage": a.zero_stage},
        "checkpoint": {"dir": str(ckpt_dir), "init_from": str(ckpt), "interval": max(1, a.steps // 4),
                       "resume": True},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    conf = run_dir / "search.yaml"
    conf.write_text(yaml.safe_dump(overrides, sort_keys=False))
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(a.nproc),
           "--master_port", str(a.port), str(REPO / "launch" / "pretrain.py"), "--config", str(conf)]
    print(f"[extend] HeadScale search for T={target}: L'={Lp}, m_h init {init}: {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd).returncode:
        raise UserError(f"the HeadScale search for T={target} failed (its error is above): {' '.join(cmd)}")


def _ppl_by_length(folder: Path, c: Optional[float] = None) -> dict[int, float]:
    from lenext_dist.eval.cli import result_suffix

    f = folder / f"ppl_last-stride{result_suffix(scale_c=c)}.json"
    return {r["length"]: r["ppl"] for r in json.loads(f.read_text())["results"]} if f.is_file() else {}


def compare(out: Path, targets: list[int], L: int, best_c: dict) -> str:
    """The paper's claims (Table 2), checked on the measured numbers, in words and a table."""
    base = _ppl_by_length(out / "eval" / "base")
    lines = ["## The paper's claims on this run", "",
             "Paper (Wang, Ji et al. 2024, Table 2): HeadScale beats the best uniform scale at long "
             "range and stays close to the base model at short range. Measured here (PPL, lower is "
             "better; the same protocol and budget for every cell):", "",
             "| target T | model | " + " | ".join(f"{n}" for n in sorted(base)) + " |",
             "|---|---|" + "---|" * len(base)]
    verdicts = []
    for T in targets:
        uni = _ppl_by_length(out / "eval" / f"uniform-{T}", best_c[T])
        hs = _ppl_by_length(out / "eval" / f"headscale-{T}")
        for name, row in (("base", base), (f"uniform c = {best_c[T]}", uni), ("HeadScale", hs)):
            lines.append(f"| {T} | {name} | " + " | ".join(f"{row.get(n, float('nan')):.2f}" for n in sorted(base)) + " |")
        if T in hs and T in uni:
            better = hs[T] < uni[T]
            verdicts.append(f"- At T = {T}: HeadScale PPL {hs[T]:.2f} vs best uniform {uni[T]:.2f}: "
                            f"{'HeadScale better, as the paper claims' if better else 'HeadScale NOT better (paper: better)'}.")
        if L in hs and L in base:
            rel = hs[L] / base[L] - 1
            verdicts.append(f"- At L = {L} (short range), HeadScale-{T} PPL {hs[L]:.2f} vs base {base[L]:.2f} "
                            f"({100 * rel:+.1f}%): {'close to base (within 5%)' if abs(rel) <= 0.05 else 'not close to base'}.")
    lines += ["", *verdicts, "",
              "These are the measured numbers of one small run; see the context-use table above before "
              "reading them as evidence either way (a model that uses little context has little to gain).", ""]
    return "\n".join(lines)


@entry_point
def main(argv=None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
