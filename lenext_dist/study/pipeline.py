"""The study's steps, each skipped when its output exists (rerun after a kill to continue):

  1. shards       data/sample -> shards/sample (as `make shards`), unless present
  2. pretrain     every run: deepspeed launch/pretrain.py --config <plan.config> --attention.position=X
                  --train.seed=S, side by side on `workers` lanes        -> <out>/runs/<run>/
  3. export       python API of lenext_dist.convert                     -> <out>/models/<run>/
  4. sweep        a scale-sweep job (lenext_dist.eval.jobs) at 8L per NoPE run -> <out>/eval/<run>-sweep/
  5. cells        per cell (plan.py), typed evaluation jobs on the run's export with the cell's
                  eval-time options (RoPE+PI/NTK/YaRN, window, log-length scale, uniform c): ppl
                  (last-stride, L..8L, + context diagnostics), retrieval by length (LongLoRA passkey
                  and task-format documents, 1x..16x L), for curve cells ppl full/curve-all
                  at 8L and entropy at 8L                                 -> <out>/eval/<cell>/
  6. HeadScale    `lenext extend`'s workflow (ExtendOptions) per NoPE run (the first
                  `headscale_seeds`), seeded with the export, the sweep and the base evaluation
                  above so it only searches, exports and evaluates uniform c(T) and HeadScale
                  and its two ablations (plan.ABLATIONS) at the largest target
                                                                         -> <out>/extend/<run>[-<ablation>]/
Jobs are objects run in the study's pool workers (jobs.py); each names its own result file, which
the analysis reads back through the same job (`cell_jobs`, `sweep_job`).
Analysis and STUDY.md: analysis.py, figures.py, writeup.py.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from lenext_dist.eval.jobs import EntropyJob, EvalJob, PasskeyJob, PplJob, ScaleSweepJob, TasksJob
from lenext_dist.extend.workflow import ExtendOptions

from .jobs import REPO, Command, Task, run_commands, run_tasks
from .plan import ABLATIONS, PASSKEY_MIN, Cell, Run, StudyPlan, cells, runs

PY = sys.executable
SAMPLE_TASKS = "passkey:2,recall,copy"
"""The generators of the sample's task shards (`make task-shards`; docs/data-preparation.md): the
passkey twice as often as recall and copy; the mix of the study's regime (STUDY.md, regime table)."""
TASK_PASSES = 2


def sample_shard_commands(cfg, logs: Path) -> list[Command]:
    """The data-prep commands (as `make shards task-shards`) for the sample's shards that `cfg`'s
    training blend names and that are not there yet: SlimPajama + Starcoder text, and the
    generated task documents over the prose."""
    wanted = {Path(b.prefix).name.removesuffix("_train") for b in cfg.data.blend}
    spec = {
        "slimpajama": ["--input", "data/sample/slimpajama/chunk*/*.jsonl.zst", "--format", "slimpajama",
                       "--valid-fraction", "0.02"],
        "starcoder": ["--input", "data/sample/starcoderdata/*/*.parquet", "--format", "starcoder"],
        "tasks": ["--format", "tasks", "--tasks", SAMPLE_TASKS, "--input",
                  "data/sample/slimpajama/chunk*/*.jsonl.zst", "--task-passes", str(TASK_PASSES)]}
    return [Command(f"shards-{name}", [PY, "data_prep/shard.py", *args, "--tokenizer", cfg.data.tokenizer,
                                       "--out", "shards/sample", "--name", name, "--workers", "1",
                                       "--no-progress"], logs / f"shards-{name}.log")
            for name, args in spec.items()
            if name in wanted and not _made(name)]


def _made(name: str) -> bool:
    """Whether shard run `name` is done: its train shard is there, and for the task shards the
    answer mask too (shards made before masks existed lack it) and the manifest's generator list
    is SAMPLE_TASKS (older sample shards had another); stale task shards are an error, not reused."""
    from lenext_dist.prep.manifest import answers_prefix
    from lenext_dist.prep.task_source import task_spec

    prefix = REPO / f"shards/sample/{name}_train"
    if name != "tasks":
        return prefix.with_suffix(".idx").exists()
    manifest = REPO / "shards/sample/tasks.manifest.json"
    if not manifest.exists():
        return False
    made = json.loads(manifest.read_text())["settings"]["tasks"]
    if (made != task_spec(SAMPLE_TASKS, [], 0, TASK_PASSES)
            or not Path(f"{answers_prefix(str(prefix))}.idx").exists()):
        raise SystemExit(f"[study] {manifest}: task shards of another generator list or without "
                         "answer masks; remake them with `make task-shards`")
    return True


class Study:
    def __init__(self, plan: StudyPlan, out: Path, port: int = 29650,
                 log: Callable[[str], None] = print):
        from lenext_dist.attention.registry import POSITIONS
        from lenext_dist.config import load_config, split_cli_overrides

        self.plan, self.out, self.port, self.log = plan, Path(out), port, log
        self.cfg = load_config(REPO / plan.config, split_cli_overrides(list(plan.overrides)))
        self.L = self.cfg.model.seq_length
        self.steps = self.cfg.train.steps
        self.runs, self.notes = runs(plan, set(POSITIONS))
        self.timings: dict[str, dict] = {}
        self.out.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ paths
    def run_dir(self, run: str) -> Path:
        return self.out / "runs" / run

    def model_dir(self, name: str) -> Path:
        return self.out / "models" / name

    def eval_dir(self, name: str) -> Path:
        return self.out / "eval" / name

    def extend_dir(self, run: str) -> Path:
        return self.out / "extend" / run

    @property
    def lengths(self) -> list[int]:
        return [self.L * f for f in self.plan.factors]

    # ------------------------------------------------------------------ 1. shards
    def shards(self) -> None:
        cmds = sample_shard_commands(self.cfg, self.out / "logs")
        if cmds:
            self.timings["shards"] = run_commands(cmds, self.plan.workers, self.log)

    # ------------------------------------------------------------------ 2. pretrain
    def _trained(self, run: str) -> bool:
        from lenext_dist.train.checkpoint import latest_tag

        return latest_tag(self.run_dir(run) / "checkpoints") == f"step_{self.steps:07d}"

    def pretrain(self) -> None:
        cmds = []
        for i, r in enumerate(self.runs):
            argv = [PY, "-m", "deepspeed.launcher.runner", "--num_gpus", str(self.plan.train_ranks),
                    "--master_port", str(self.port + i), "launch/pretrain.py",
                    "--config", self.plan.config, f"--attention.position={r.position}",
                    f"--train.seed={r.seed}", f"--name=study-{r.name}",
                    f"--run_dir={self.run_dir(r.name)}", *self.plan.overrides]
            cmds.append(Command(f"pretrain {r.name}", argv, self.out / "logs" / f"pretrain-{r.name}.log",
                                threads=1, done=lambda n=r.name: self._trained(n)))
        self.timings["pretrain"] = run_commands(cmds, self.plan.workers, self.log)

    # ------------------------------------------------------------------ 3. export
    def export(self) -> None:
        from lenext_dist.convert import export

        t0 = time.perf_counter()
        for r in self.runs:
            dst = self.model_dir(r.name)
            ckpt = self.run_dir(r.name) / "checkpoints"
            cfg_json = dst / "config.json"
            if cfg_json.exists() and cfg_json.stat().st_mtime >= (ckpt / "latest").stat().st_mtime:
                continue
            export(ckpt, dst, overwrite=True)
        self.timings["export"] = {"seconds": round(time.perf_counter() - t0, 1)}

    # ------------------------------------------------------------------ 4-6. evaluation
    def _common(self) -> dict:
        return dict(data=list(self.plan.data), no_progress=True, threads=1)

    def sweep_job(self, run: str) -> ScaleSweepJob:
        p = self.plan
        return ScaleSweepJob(model=str(self.model_dir(run)), out=str(self.eval_dir(f"{run}-sweep")),
                             length=self.L * max(p.factors), c_min=p.sweep_c[0], c_max=p.sweep_c[1],
                             c_step=p.sweep_c[2], samples=p.sweep_samples, **self._common())

    def sweep_tasks(self) -> list[Task]:
        tasks = []
        for r in self.runs:
            if r.position != "nope" or (job := self.sweep_job(r.name)).done():
                continue
            tasks.append(Task(f"sweep {r.name}", jobs=[job],
                              log=self.out / "logs" / f"sweep-{r.name}.log"))
        return tasks

    def fitted(self) -> dict[str, dict]:
        out = {}
        for r in self.runs:
            f = self.sweep_job(r.name).result_path
            if f.exists():
                out[r.name] = json.loads(f.read_text())["fit"]
        return out

    def cells(self) -> list[Cell]:
        return cells(self.plan, self.runs, self.L, self.fitted())

    def retrieval_lengths(self) -> list[int]:
        """The passkey and task-format lengths: retrieval_factors x L, those >= PASSKEY_MIN."""
        ns = [self.L * f for f in self.plan.retrieval_factors]
        return [n for n in ns if n >= PASSKEY_MIN] or [max(ns)]

    @property
    def task_names(self) -> list[str]:
        """The task generators the study scores: those of the sample's task shards."""
        return [t.partition(":")[0] for t in SAMPLE_TASKS.split(",")]

    def model_path(self, cell: Cell) -> Path:
        """The model folder a cell evaluates: its run's export, or a HeadScale export of extend."""
        if cell.headscale_target is None:
            return self.model_dir(cell.run)
        run = next(r for r in self.runs if r.name == cell.run)
        return self.extend_options(run, cell.ablation).export_dir(cell.headscale_target)

    def cell_jobs(self, cell: Cell) -> dict[str, EvalJob]:
        """Every evaluation of a cell: `ppl` (last-stride), `passkey` (LongLoRA) and `tasks`
        (task-format retrieval) by length, and as the cell asks `curve` (ppl full/curve-all at
        8L) and `entropy` (at 8L)."""
        p, L, N = self.plan, self.L, self.L * max(self.plan.factors)
        model = self.model_path(cell)
        m = dict(model=str(model), out=str(self.eval_dir(cell.name)), scale_c=cell.scale_c,
                 window=cell.window, rope_scaling=cell.rope_scaling, rope_factor=cell.rope_factor,
                 log_scale_a=cell.log_scale_a)
        jobs: dict[str, EvalJob] = {"ppl": PplJob(
            **m, lengths=self.lengths, stride=max(1, L // 2), budget_tokens=p.budget_tokens,
            **self._common())}
        if cell.curve:
            jobs["curve"] = PplJob(**m, lengths=[N], protocol="full", curve_all=True,
                                   no_penalty=True, budget_tokens=p.curve_windows * N,
                                   **self._common())
        if cell.curve and p.entropy_samples:
            jobs["entropy"] = EntropyJob(**m, length=N, samples=p.entropy_samples, **self._common())
        if p.passkey_keys:
            jobs["passkey"] = PasskeyJob(**m, lengths=self.retrieval_lengths(),
                                         depths=str(p.passkey_depths), keys=p.passkey_keys,
                                         no_progress=True, threads=1)
        if p.task_docs:
            jobs["tasks"] = TasksJob(**m, lengths=self.retrieval_lengths(), tasks=self.task_names,
                                     docs=p.task_docs, **self._common())
        return jobs

    def cell_task(self, cell: Cell) -> Optional[Task]:
        todo = [j for j in self.cell_jobs(cell).values() if not j.done()]
        if not todo:
            return None
        return Task(f"eval {cell.name}", jobs=todo, log=self.out / "logs" / f"eval-{cell.name}.log")

    def extend_options(self, r: Run, ablation: Optional[str] = None) -> ExtendOptions:
        """extend only searches and exports here (evaluation at L alone, no passkey/entropy): the
        study evaluates the exports itself (cells with `headscale_target`) with the protocol of
        every cell. An ablation (plan.ABLATIONS) searches the largest target alone, in a folder
        of its own."""
        p, L = self.plan, self.L
        i = self.runs.index(r)
        opts = ExtendOptions(
            base=str(self.run_dir(r.name)), targets=[L * f for f in p.headscale_targets],
            out=str(self.extend_dir(r.name)), steps=p.headscale_steps, nproc=1, global_batch=8,
            port=self.port + 40 + i, data=list(p.data), eval_factors=[1],
            stride=max(1, L // 2), budget_tokens=p.budget_tokens, passkey_keys=0,
            entropy_samples=0, threads=1)
        if ablation is None:
            return opts
        k = list(ABLATIONS).index(ablation) + 1
        return replace(opts, **ABLATIONS[ablation][1], targets=[L * max(p.headscale_targets)],
                       out=str(self.extend_dir(f"{r.name}-{ablation}")),
                       port=self.port + 40 + k * len(self.runs) + i)

    def extend_task(self, r: Run, ablation: Optional[str] = None) -> Optional[Task]:
        ext = self.extend_options(r, ablation)
        if ext.report_path.exists():
            return None
        # seed lenext extend with what the study already has (it skips a step whose output exists)
        for link, target in ((ext.base_export, self.model_dir(r.name)),
                             (ext.eval_dir("sweep"), self.eval_dir(f"{r.name}-sweep")),
                             (ext.eval_dir("base"), self.eval_dir(r.name))):
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(os.path.relpath(target.resolve(), link.parent))
        name = r.name if ablation is None else f"{r.name}-{ablation}"
        return Task(f"extend {name}", jobs=[ext],
                    log=self.out / "logs" / f"extend-{name}.log", after=(f"eval {r.name}",))

    def evaluate(self) -> None:
        t = self.sweep_tasks()
        if t:
            self.timings["sweep"] = run_tasks(t, self.plan.workers, log=self.log)
        tasks: list[Task] = []
        hs_runs = [r for r in self.runs if r.position == "nope"][: self.plan.headscale_seeds]
        for r in hs_runs:  # the longest jobs first: they run on one lane while the other evaluates
            for ablation in (None, *self.plan.headscale_ablations):
                if (task := self.extend_task(r, ablation)) is not None:
                    tasks.append(task)
        cells_ = self.cells()
        base_first = sorted([c for c in cells_ if c.headscale_target is None],
                            key=lambda c: (c.name not in {r.name for r in hs_runs}, c.name))
        tasks += [task for c in base_first if (task := self.cell_task(c)) is not None]
        self.timings["evaluate"] = run_tasks(tasks, self.plan.workers, log=self.log)
        later = [task for c in cells_ if c.headscale_target is not None
                 and (self.model_path(c) / "config.json").exists()
                 and (task := self.cell_task(c)) is not None]
        if later:
            self.timings["evaluate_headscale"] = run_tasks(later, self.plan.workers, log=self.log)

    # ------------------------------------------------------------------ all
    def run_all(self, save: Callable[[dict], None] = lambda timings: None) -> dict:
        """Every step; `save(timings)` after each (a killed attempt keeps its finished steps' times)."""
        t0 = time.perf_counter()
        for step in (self.shards, self.pretrain, self.export, self.evaluate):
            s = time.perf_counter()
            self.log(f"[study] == {step.__name__}")
            step()
            self.timings.setdefault("steps", {})[step.__name__] = round(time.perf_counter() - s, 1)
            self.timings["total_seconds"] = round(time.perf_counter() - t0, 1)
            save(self.timings)
        return self.timings
