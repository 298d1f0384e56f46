"""The steps of `lenext extend` (see lenext_dist/extend/__init__.py): `ExtendOptions.run()`.

Evaluations are typed jobs (lenext_dist.eval.jobs) run in this process; a step is skipped when
its job's result exists (`job.done()`: the job names its file, with its scale in the name, so a
folder evaluated at another scale is not "done"). The options pickle, so a caller may run
them in worker processes.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from lenext_dist.errors import UserError
from lenext_dist.eval.jobs import EntropyJob, EvalJob, PasskeyJob, PplJob, ScaleSweepJob
from lenext_dist.eval.options import depths, ints
from lenext_dist.flags import check_fields, float_, nonneg_int, option, pos_float, pos_int, port_number


SEARCH, EVAL = "HeadScale search (paper defaults)", "evaluation"  # the --help groups


def _min_value(s) -> Optional[float]:
    return None if isinstance(s, str) and s.lower() == "none" else float_(s)


def _zero_stage(s) -> int:
    # checked here, not when the search's config is built: that comes after the export and the sweep
    v = nonneg_int(s)
    if v > 3:
        raise argparse.ArgumentTypeError(f"must be 0, 1, 2 or 3 (a ZeRO stage), got {v}")
    return v


def _init(s) -> Union[str, float]:
    return "fit" if s == "fit" else pos_float(s)


@dataclass(kw_only=True)
class ExtendOptions:
    """What `lenext extend` does: each field is one of its flags (lenext_dist/flags.py writes the
    parser from them); defaults are the paper's."""
    base: str = option(check=str, required=True, help="pretraining run folder (config.yaml, checkpoints/)")
    targets: list[int] = option(check=ints, required=True, help="target lengths, e.g. 256,512")
    out: Optional[str] = option(None, help="output folder (default <base>/extend)")
    steps: int = option(200, pos_int, group=SEARCH)
    lr: float = option(0.1, pos_float, group=SEARCH)
    warmup: int = option(20, nonneg_int, group=SEARCH)
    global_batch: int = option(8, pos_int, group=SEARCH)
    micro_batch: Optional[int] = option(None, pos_int, "default: global / nproc", group=SEARCH)
    overshoot: float = option(1.125, pos_float, "L' = ceil(T x overshoot)", group=SEARCH)
    min_value: Optional[float] = option(1.0, _min_value, "m_h lower bound, or 'none' (ablation)", group=SEARCH)
    init: Union[str, float] = option("fit", _init, "'fit' (the sweep's c(T)), or a number (ablation: 1)",
                                     group=SEARCH)
    zero_stage: int = option(2, _zero_stage, "ZeRO stage 0-3 of the search", group=SEARCH)
    nproc: int = option(2, pos_int, "ranks of the search (deepspeed --num_gpus)", group=SEARCH)
    port: int = option(29531, port_number, "rendezvous port of the search's ranks, 1-65535", group=SEARCH)
    activation_checkpointing: bool = option(False, group=SEARCH, action="store_true")
    data: list[str] = option(default_factory=lambda: ["data/sample/heldout/books.jsonl.zst"], group=EVAL,
                             nargs="+")
    eval_factors: list[int] = option(default_factory=lambda: [1, 2, 4, 8], check=ints,
                                     help="lengths = L x these", group=EVAL)
    stride: Optional[int] = option(None, pos_int, "PPL stride (default L/2)", group=EVAL)
    budget_tokens: int = option(20000, pos_int, "scored tokens per PPL cell", group=EVAL)
    c_min: float = option(0.8, pos_float, group=EVAL)
    c_max: float = option(2.0, pos_float, group=EVAL)
    c_step: float = option(0.01, pos_float, group=EVAL)
    passkey_keys: int = option(5, nonneg_int, "0 skips passkey", group=EVAL)
    passkey_lengths: Optional[list[int]] = option(
        None, ints, "default: the evaluation lengths >= 128 (a prompt needs ~80 tokens plus filler)", group=EVAL)
    passkey_depths: str = option("5", depths, group=EVAL)
    entropy_samples: int = option(4, nonneg_int, "0 skips entropy", group=EVAL)
    threads: Optional[int] = option(None, pos_int, group=EVAL)

    def __post_init__(self) -> None:
        check_fields(self, lambda message: UserError(f"lenext extend: {message}"))

    # ------------------------------------------------------------------ paths and jobs
    @property
    def out_dir(self) -> Path:
        return Path(self.out or Path(self.base) / "extend")

    @property
    def report_path(self) -> Path:
        """The workflow's last output (written when every step is done)."""
        return self.out_dir / "report.md"

    @property
    def base_export(self) -> Path:
        """The base checkpoint's HF export."""
        return self.out_dir / "hf" / "base"

    def eval_dir(self, name: str) -> Path:
        """Results of one model (`base`, `uniform-T`, `headscale-T`) or of the `sweep`."""
        return self.out_dir / "eval" / name

    def search_dir(self, target: int) -> Path:
        """The HeadScale search run for target T (config.yaml, checkpoints/, head_scales.json)."""
        return self.out_dir / f"hs-{target}"

    def export_dir(self, target: int) -> Path:
        """The HF export of that search."""
        return self.out_dir / "hf" / f"hs-{target}"

    def sweep_job(self) -> ScaleSweepJob:
        return ScaleSweepJob(model=str(self.base_export), out=str(self.eval_dir("sweep")),
                             length=max(self.targets), c_min=self.c_min, c_max=self.c_max,
                             c_step=self.c_step, data=self.data, no_progress=True,
                             threads=self.threads)

    def eval_jobs(self, name: str, model: Path, c: Optional[float], L: int) -> dict[str, EvalJob]:
        """The evaluations of one model (`base`, `uniform-T` at scale c, `headscale-T`)."""
        dst = str(self.eval_dir(name))
        common = dict(model=str(model), out=dst, scale_c=c, no_progress=True)
        jobs: dict[str, EvalJob] = {"ppl": PplJob(
            **common, lengths=[L * f for f in self.eval_factors],
            stride=self.stride or max(1, L // 2), budget_tokens=self.budget_tokens,
            data=self.data, threads=self.threads)}
        pk = self.passkey_lengths or [L * f for f in self.eval_factors if L * f >= 128]
        if self.passkey_keys and pk:
            jobs["passkey"] = PasskeyJob(**common, lengths=pk, depths=self.passkey_depths,
                                         keys=self.passkey_keys)
        if self.entropy_samples:
            jobs["entropy"] = EntropyJob(**common, length=max(self.targets),
                                         samples=self.entropy_samples, data=self.data,
                                         threads=self.threads)
        return jobs

    # ------------------------------------------------------------------ the workflow
    def run(self) -> str:
        from lenext_dist.convert.export import export
        from lenext_dist.eval.claims import extend_claims
        from lenext_dist.eval.report import write_report
        from lenext_dist.eval.scale_sweep import best_c_for_length
        from lenext_dist.checkpoint.layout import latest_tag, resolve, run_config, tag_for

        from .search import launch, search_config

        base, out = Path(self.base), self.out_dir
        ckpt = resolve(base / "checkpoints")  # before --out is made: a wrong --base leaves nothing
        L = run_config(ckpt).model.train_length  # the pretrained L (an extension runs longer)
        out.mkdir(parents=True, exist_ok=True)

        # every search's config is built and validated before anything runs (the export and the
        # sweep take long), and again with the fitted init once the sweep has given it
        micro = self.micro_batch or max(1, self.global_batch // self.nproc)

        def searches(init: dict) -> dict:
            return {T: search_config(
                ckpt, self.search_dir(T), target=T, init=init[T], steps=self.steps, lr=self.lr,
                warmup=self.warmup, global_batch=self.global_batch, micro_batch=micro,
                overshoot=self.overshoot, min_value=self.min_value, zero_stage=self.zero_stage,
                activation_checkpointing=self.activation_checkpointing) for T in self.targets}

        searches({T: 1.0 if self.init == "fit" else float(self.init) for T in self.targets})
        hf_base = self.base_export
        if not (hf_base / "config.json").exists():
            export(ckpt, hf_base, overwrite=True)
        sweep = self.sweep_job()
        if not sweep.done():
            sweep.run()
        best_c = {T: round(best_c_for_length(str(sweep.out_dir), T), 4) for T in self.targets}
        print(f"[extend] fitted uniform scales c(T): {best_c}", flush=True)
        configs = searches({T: best_c[T] if self.init == "fit" else float(self.init) for T in self.targets})
        models = {"base": (hf_base, None)}  # as pretrained (its own attention.scale_c, not forced to 1)
        for T, cfg in configs.items():
            models[f"uniform-{T}"] = (hf_base, best_c[T])
            hs_dir = self.search_dir(T)
            if latest_tag(hs_dir / "checkpoints") != tag_for(self.steps):
                launch(cfg, T, self.nproc, self.port)
            hf = self.export_dir(T)
            if not (hf / "config.json").exists():
                export(hs_dir / "checkpoints", hf, overwrite=True)
            models[f"headscale-{T}"] = (hf, None)

        ppl = {}
        for name, (model, c) in models.items():
            jobs = self.eval_jobs(name, model, c, L)
            for job in jobs.values():
                if not job.done():
                    job.run()
            ppl[name] = _ppl_by_length(jobs["ppl"].result_path)

        runs = [str(self.eval_dir(n)) for n in ["sweep", *models]]
        report = write_report(runs, str(self.report_path), f"Length extension of {base.name}")
        with open(report, "a") as f:
            f.write("\n" + extend_claims(ppl, self.targets, L, best_c))
        print(f"[extend] report: {report}", flush=True)
        return report


def _ppl_by_length(f: Path) -> dict[int, float]:
    return {r["length"]: r["ppl"] for r in json.loads(f.read_text())["results"]} if f.is_file() else {}
