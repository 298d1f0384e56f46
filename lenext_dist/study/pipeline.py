"""The study's steps, each skipped when its output exists (rerun after a kill to continue):

  1. shards       data/sample -> shards/sample (as `make shards`), unless present
  2. pretrain     every run: deepspeed launch/pretrain.py --config <plan.config> --attention.position=X
                  --train.seed=S, side by side on `workers` lanes        -> <out>/runs/<run>/
  3. export       python API of lenext_dist.convert                     -> <out>/models/<run>/
  4. sweep        `lenext eval scale-sweep` at 8L per NoPE run           -> <out>/eval/<run>-sweep/
  5. cells        eval-time variants as model folders whose config.json is edited (RoPE+NTK/YaRN,
                  window, log-length scale; files symlinked)            -> <out>/models/<cell>/
                  `lenext eval ppl` (last-stride, L..8L, + context diagnostics), for curve cells
                  `ppl --protocol full --curve-all` at 8L and `entropy` at 8L, passkey for the bases
                                                                         -> <out>/eval/<cell>/
  6. HeadScale    `lenext extend` per NoPE run (the first `headscale_seeds`), seeded with the
                  export, the sweep and the base evaluation above so it only searches, exports and
                  evaluates uniform c(T) and HeadScale                   -> <out>/extend/<run>/
Analysis and STUDY.md: analysis.py, figures.py, writeup.py.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from .jobs import REPO, Command, Task, run_commands, run_tasks
from .plan import Cell, Run, StudyPlan, cells, runs

PY = sys.executable


def _rel(p: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


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
        prefixes = [b.prefix for b in self.cfg.data.blend]
        if all((REPO / f"{p}.bin").exists() or Path(f"{p}.bin").exists() for p in prefixes):
            return
        tok = self.cfg.data.tokenizer
        cmds = [Command("shards-slimpajama", [
            PY, "data_prep/shard.py", "--input", "data/sample/slimpajama/chunk*/*.jsonl.zst",
            "--format", "slimpajama", "--tokenizer", tok, "--out", "shards/sample", "--name",
            "slimpajama", "--valid-fraction", "0.02", "--workers", "1", "--no-progress"],
            self.out / "logs" / "shards-slimpajama.log"),
            Command("shards-starcoder", [
                PY, "data_prep/shard.py", "--input", "data/sample/starcoderdata/*/*.parquet",
                "--format", "starcoder", "--tokenizer", tok, "--out", "shards/sample", "--name",
                "starcoder", "--workers", "1", "--no-progress"],
                self.out / "logs" / "shards-starcoder.log")]
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
            if (dst / "config.json").exists() and (dst / "config.json").stat().st_mtime >= (ckpt / "latest").stat().st_mtime:
                continue
            export(ckpt, dst, overwrite=True)
        self.timings["export"] = {"seconds": round(time.perf_counter() - t0, 1)}

    # ------------------------------------------------------------------ 5. variant folders
    def variant_folder(self, cell: Cell) -> Path:
        src = self.out / cell.src if cell.src else self.model_dir(cell.run)
        if cell.config_edit is None:
            return src
        dst = self.model_dir(cell.name)
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name == "config.json":
                continue
            link = dst / f.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(os.path.relpath(f.resolve(), dst))
        conf = json.loads((src / "config.json").read_text())
        for k, v in cell.config_edit.items():
            conf[k] = {**(conf.get(k) or {}), **v} if isinstance(v, dict) else v
        conf["lenext_study_edit"] = {"from": _rel(src), "edit": cell.config_edit}
        (dst / "config.json").write_text(json.dumps(conf, indent=2))
        return dst

    # ------------------------------------------------------------------ 4-6. evaluation
    def _common(self) -> list[str]:
        return ["--data", *self.plan.data, "--no-progress", "--threads", "1"]

    def sweep_tasks(self) -> list[Task]:
        p, N = self.plan, self.L * max(self.plan.factors)
        tasks = []
        for r in self.runs:
            if r.position != "nope":
                continue
            dst = self.eval_dir(f"{r.name}-sweep")
            if (dst / "scale_sweep.json").exists():
                continue
            tasks.append(Task(f"sweep {r.name}", calls=[[
                "eval", "scale-sweep", "--model", str(self.model_dir(r.name)), "--out", str(dst),
                "--length", str(N), "--c-min", str(p.sweep_c[0]), "--c-max", str(p.sweep_c[1]),
                "--c-step", str(p.sweep_c[2]), "--samples", str(p.sweep_samples), *self._common()]],
                log=self.out / "logs" / f"sweep-{r.name}.log"))
        return tasks

    def fitted(self) -> dict[str, dict]:
        out = {}
        for r in self.runs:
            f = self.eval_dir(f"{r.name}-sweep") / "scale_sweep.json"
            if f.exists():
                out[r.name] = json.loads(f.read_text())["fit"]
        return out

    def cells(self) -> list[Cell]:
        return cells(self.plan, self.runs, self.L, self.fitted())

    def passkey_lengths(self) -> list[int]:
        return [n for n in self.lengths if n >= 128] or [max(self.lengths)]

    def cell_task(self, cell: Cell) -> Optional[Task]:
        from lenext_dist.eval.cli import result_suffix

        p, L = self.plan, self.L
        model, dst = self.variant_folder(cell), self.eval_dir(cell.name)
        scale = ["--scale-c", str(cell.scale_c)] if cell.scale_c is not None else []
        sfx = result_suffix(scale_c=cell.scale_c)
        m = ["--model", str(model), "--out", str(dst)]
        calls = []
        if not (dst / f"ppl_last-stride{sfx}.json").exists():
            calls.append(["eval", "ppl", *m, "--lengths", ",".join(map(str, self.lengths)),
                          "--stride", str(max(1, L // 2)), "--budget-tokens", str(p.budget_tokens),
                          *scale, *self._common()])
        N = L * max(p.factors)
        if cell.curve and not (dst / f"ppl_full{sfx}.json").exists():
            calls.append(["eval", "ppl", *m, "--lengths", str(N), "--protocol", "full",
                          "--curve-all", "--no-penalty", "--budget-tokens", str(p.curve_windows * N),
                          *scale, *self._common()])
        if cell.curve and p.entropy_samples and not (dst / f"entropy{sfx}_{N}.json").exists():
            calls.append(["eval", "entropy", *m, "--length", str(N), "--samples",
                          str(p.entropy_samples), *scale, *self._common()])
        if cell.passkey and p.passkey_keys and not (dst / f"passkey{sfx}.json").exists():
            calls.append(["eval", "passkey", *m, "--lengths", ",".join(map(str, self.passkey_lengths())),
                          "--depths", str(p.passkey_depths), "--keys", str(p.passkey_keys),
                          "--no-progress", "--threads", "1", *scale])
        if not calls:
            return None
        return Task(f"eval {cell.name}", calls=calls, log=self.out / "logs" / f"eval-{cell.name}.log")

    def extend_task(self, r: Run) -> Optional[Task]:
        p, L = self.plan, self.L
        out = self.extend_dir(r.name)
        targets = [L * f for f in p.headscale_targets]
        if (out / "report.md").exists():
            return None
        # seed lenext extend with what the study already has (it skips a step whose output exists)
        for link, target in ((out / "hf" / "base", self.model_dir(r.name)),
                             (out / "eval" / "sweep", self.eval_dir(f"{r.name}-sweep")),
                             (out / "eval" / "base", self.eval_dir(r.name))):
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(os.path.relpath(target.resolve(), link.parent))
        # extend only searches and exports here (evaluation at L alone, no passkey/entropy): the
        # study evaluates the exports itself (cells with `src`) with the protocol of every cell
        argv = [PY, "-m", "lenext_dist", "extend", "--base", str(self.run_dir(r.name)),
                "--targets", ",".join(map(str, targets)), "--out", str(out),
                "--steps", str(p.headscale_steps), "--nproc", "1", "--global-batch", "8",
                "--port", str(self.port + 40 + self.runs.index(r)),
                "--data", *p.data, "--eval-factors", "1",
                "--stride", str(max(1, L // 2)), "--budget-tokens", str(p.budget_tokens),
                "--passkey-keys", "0", "--entropy-samples", "0", "--threads", "1"]
        return Task(f"extend {r.name}", argv=argv, log=self.out / "logs" / f"extend-{r.name}.log",
                    after=(f"eval {r.name}",))

    def evaluate(self) -> None:
        t = self.sweep_tasks()
        if t:
            self.timings["sweep"] = run_tasks(t, self.plan.workers, log=self.log)
        tasks: list[Task] = []
        hs_runs = [r for r in self.runs if r.position == "nope"][: self.plan.headscale_seeds]
        for r in hs_runs:  # the longest job first: it runs on one lane while the other evaluates
            if (task := self.extend_task(r)) is not None:
                tasks.append(task)
        cells_ = self.cells()
        base_first = sorted([c for c in cells_ if not c.src],
                            key=lambda c: (c.name not in {r.name for r in hs_runs}, c.name))
        tasks += [task for c in base_first if (task := self.cell_task(c)) is not None]
        self.timings["evaluate"] = run_tasks(tasks, self.plan.workers, log=self.log)
        later = [task for c in cells_ if c.src and (self.out / c.src / "config.json").exists()
                 and (task := self.cell_task(c)) is not None]
        if later:
            self.timings["evaluate_headscale"] = run_tasks(later, self.plan.workers, log=self.log)

    # ------------------------------------------------------------------ all
    def run_all(self) -> dict:
        t0 = time.perf_counter()
        for step in (self.shards, self.pretrain, self.export, self.evaluate):
            s = time.perf_counter()
            self.log(f"[study] == {step.__name__}")
            step()
            self.timings.setdefault("steps", {})[step.__name__] = round(time.perf_counter() - s, 1)
        self.timings["total_seconds"] = round(time.perf_counter() - t0, 1)
        return self.timings
