"""The steps of `lenext extend` (see lenext_dist/extend/__init__.py): `ExtendOptions.run()`.

Evaluations are typed jobs (lenext_dist.eval.jobs) run in this process; a step is skipped when
its job's result exists (`job.done()`: the job names its file, with its scale in the name, so a
folder evaluated at another scale is not "done"). The options pickle, so a caller may run
them in worker processes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from lenext_dist.eval.jobs import EntropyJob, EvalJob, PasskeyJob, PplJob, ScaleSweepJob


@dataclass(kw_only=True)
class ExtendOptions:
    """What `lenext extend` does (its flags, same names; defaults are the paper's)."""
    base: str
    targets: list[int]
    out: Optional[str] = None
    steps: int = 200
    lr: float = 0.1
    warmup: int = 20
    global_batch: int = 8
    micro_batch: Optional[int] = None
    overshoot: float = 1.125
    min_value: Optional[float] = 1.0
    init: Union[str, float] = "fit"
    zero_stage: int = 2
    nproc: int = 2
    port: int = 29531
    activation_checkpointing: bool = False
    data: list[str] = field(default_factory=lambda: ["data/sample/heldout/books.jsonl.zst"])
    eval_factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    stride: Optional[int] = None
    budget_tokens: int = 20000
    c_min: float = 0.8
    c_max: float = 2.0
    c_step: float = 0.01
    passkey_keys: int = 5
    passkey_lengths: Optional[list[int]] = None
    passkey_depths: str = "5"
    entropy_samples: int = 4
    threads: Optional[int] = None

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
        from lenext_dist.convert import export
        from lenext_dist.eval.claims import extend_claims
        from lenext_dist.eval.report import write_report
        from lenext_dist.eval.scale_sweep import best_c_for_length
        from lenext_dist.checkpoint.layout import latest_tag, resolve, run_config, tag_for

        from .search import launch, search_config

        base, out = Path(self.base), self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        ckpt = resolve(base / "checkpoints")
        L = run_config(ckpt).model.base_length  # the pretrained L (an extension runs longer)

        hf_base = self.base_export
        if not (hf_base / "config.json").exists():
            export(ckpt, hf_base, overwrite=True)
        sweep = self.sweep_job()
        if not sweep.done():
            sweep.run()
        best_c = {T: round(best_c_for_length(str(sweep.out_dir), T), 4) for T in self.targets}
        print(f"[extend] fitted uniform scales c(T): {best_c}", flush=True)

        # every search's config is built and validated before the first one is launched
        micro = self.micro_batch or max(1, self.global_batch // self.nproc)
        searches = {T: search_config(
            ckpt, self.search_dir(T), target=T, init=best_c[T] if self.init == "fit" else float(self.init),
            steps=self.steps, lr=self.lr, warmup=self.warmup, global_batch=self.global_batch,
            micro_batch=micro, overshoot=self.overshoot, min_value=self.min_value,
            zero_stage=self.zero_stage, activation_checkpointing=self.activation_checkpointing)
            for T in self.targets}
        models = {"base": (hf_base, None)}  # as pretrained (its own attention.scale_c, not forced to 1)
        for T, cfg in searches.items():
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
