"""The NoPE length-generalization study in the synthetic key-value regime (experiments/nope_length).

An experiment on top of the library, never the reverse: it builds the kv data with
`lenext_dist.prep`, trains every model with the ordinary launcher (deepspeed + launch/pretrain.py on
`--nproc` CPU ranks), exports checkpoints with `lenext_dist.convert.export`, scores them with the
`lenext eval tasks` job, and judges the claims in analysis.py. Every step writes its output under
`--out` and is skipped when that output exists, so a killed study resumes where it stopped.

The checkpoint of every model is chosen by the rule written down before any run
(lenext_dist/eval/checkpoint_rule.py): the first checkpoint whose whole-answer accuracy at L (c = 1,
validation documents of another seed than the test documents) is >= GATE. The final checkpoint is
evaluated beside it.

  python -m experiments.nope_length             # the full study (~75 min on 2 cores)
  python -m experiments.nope_length --quick     # a smoke run (a few minutes)
  python -m experiments.nope_length --publish   # records -> experiments/nope_length/results
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Optional

from .analysis import render, summarize
from lenext_dist.checkpoint.layout import COMPLETE
from lenext_dist.flags import Parser

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

GATE = 0.9
"""Whole-answer accuracy at L a checkpoint needs to be chosen (pre-registered)."""
VALID_SEED, TEST_SEED = 7, 0
"""Documents of the checkpoint rule and of the tables: same held-out filler, other needles."""


@dataclass(frozen=True)
class Model:
    name: str
    position: str
    seed: int = 0
    overrides: tuple[str, ...] = ()
    train_set: tuple[str, ...] = ()
    """kv parameters of its training documents besides their length (`--task-set`, e.g.
    "tail=0:16"); () the regime's."""


@dataclass(frozen=True)
class Plan:
    models: tuple[Model, ...]
    steps: int = 3000
    multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    scales: tuple[float, ...] = (1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0)
    """Uniform c on the NoPE seeds at the chosen checkpoint (the fit of the best c), with the
    attention entropy of the answer queries; the other models get final_scales."""
    final_scales: tuple[float, ...] = (1.0, 1.5)
    rope_extensions: tuple[str, ...] = ("pi", "ntk", "yarn")
    """RoPE at s x L with these scalings at factor s (RoPE seed 0's chosen checkpoint)."""
    variants: tuple[str, ...] = ("values=2:3", "values=6:8", "distractors=1", "depth=0:0.1",
                                 "depth=0.9:1")
    """Other document formats (kv parameters, `lenext eval tasks --task-set`) at 1L and 2L, c = 1,
    on NoPE and RoPE seed 0: how far the skill reaches beyond the training format."""
    headscale_targets: tuple[int, ...] = (2, 4, 8)
    """HeadScale (the paper's search) on NoPE seed 0 at T = s x L, answers-only loss."""
    headscale_steps: int = 200
    interval: int = 0
    """Steps between checkpoints (and validation losses); 0: steps // 12."""
    docs: int = 128
    valid_docs: int = 64
    L: int = 64
    kv_passes: int = 4
    nproc: int = 2

    @property
    def every(self) -> int:
        """Steps between checkpoints (and validation losses): interval, or steps // 12."""
        return self.interval or max(1, self.steps // 12)


def full_plan() -> Plan:
    seeds = [Model(f"{p}-s{s}", p, s) for p in ("nope", "rope") for s in (0, 1, 2)]
    others = [Model("alibi-s0", "alibi"), Model("kerple-s0", "kerple_log"),
              Model("window-s0", "nope", 0, ("--attention.window=64",))]  # a window of L
    return Plan(models=tuple(seeds + others))


def quick_plan() -> Plan:
    return Plan(models=(Model("nope-s0", "nope"), Model("rope-s0", "rope")), steps=60,
                multiples=(1, 2), scales=(1.0, 1.5), final_scales=(1.0,), rope_extensions=("ntk",),
                variants=("distractors=1",),
                headscale_targets=(2,), headscale_steps=10, docs=8, valid_docs=8, kv_passes=1)


# ----------------------------------------------------------------------------- steps
class Study:
    def __init__(self, plan: Plan, out: Path, log=print):
        self.plan, self.out, self.log = plan, out, log
        self.data = out / "data"
        self.timings: dict = {}
        self._timings_path = out / "timings.json"
        if self._timings_path.exists():
            self.timings = json.loads(self._timings_path.read_text())
        self._claim_folder()

    def record(self) -> dict:
        """What a summary.json records of how its numbers were made: the time of each step, and the
        `lenext eval tasks` protocol that scored every evaluation (one of another version is
        neither reused nor overwritten: eval's own check)."""
        from lenext_dist.eval.jobs import TasksJob

        return {"timings_s": self.timings, "tasks_protocol_version": TasksJob.protocol_version}

    def _claim_folder(self) -> None:
        """One plan per work folder: resuming in a folder of another plan (another budget, seeds
        or checkpoint interval) would go on from its checkpoints under the new settings. A plan
        may gain models, or change one that has no run yet (a layout added after the others
        ran): the runs there are those the new plan would make."""
        record = self.out / "plan.json"
        want = {k: v for k, v in json.loads(json.dumps(asdict(self.plan))).items() if k != "nproc"}
        if record.exists():
            old = json.loads(record.read_text())
            differ = plan_differs({**old, "models": want["models"]}, self.plan)
            mine = {m["name"]: m for m in want["models"]}
            differ += [f"model {m['name']}" for m in plan_models(old) if isinstance(m, dict)
                       and (self.out / "runs" / str(m.get("name"))).is_dir() and mine.get(m["name"], m) != m]
            why = f"the runs of another plan ({', '.join(differ)} differ)" if differ else None
        else:
            why = "runs of a plan it has no record of" if (self.out / "runs").exists() else None
        if why:
            raise SystemExit(f"error: {self.out} holds {why}: pass --out to a new folder, or move it")
        self.out.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(want, indent=1))

    def _timed(self, key: str, fn):
        """fn(), its seconds added to timings[key]: a resumed step's time is the sum of its runs
        (a rerun that finds the step's outputs adds ~0, not overwrites what it cost)."""
        t0 = time.perf_counter()
        result = fn()
        self.timings[key] = round(self.timings.get(key, 0.0) + time.perf_counter() - t0, 1)
        self._timings_path.write_text(json.dumps(self.timings, indent=1))
        return result

    # -- data
    def shards(self, length: int, train_set: tuple[str, ...] = ()) -> Path:
        """kv documents of exactly `length` tokens over the study's filler (made once), with the
        other kv parameters `train_set` (Model.train_set)."""
        from lenext_dist.prep.kv_corpus import KVCorpus, build
        from lenext_dist.prep.runner import ShardJob, run_shard
        from lenext_dist.prep.task_source import task_spec

        if not (self.data / "kv.json").exists():
            build(KVCorpus(str(self.data)))
        out = self.out / "shards" / "-".join([f"kv{length}", *(v.replace("=", "").replace(":", "-")
                                                           for v in train_set)])
        if not (out / "kv.manifest.json").exists():
            passes = self.plan.kv_passes if length == self.plan.L else 1
            run_shard(ShardJob(inputs=sorted(str(p) for p in (self.data / "train").glob("*.jsonl")),
                               fmt="tasks", tokenizer=str(self.data / "tokenizer.model"),
                               out=str(out), name="kv", valid_fraction=0.01, progress=False,
                               workers=self.plan.nproc,
                               tasks=task_spec("kv", [f"length={length}", *train_set], seed=0,
                                               passes=passes)))
        return out

    def _launch(self, config: Path, run_dir: Path, overrides: list[str]) -> None:
        from lenext_dist.train.launch import launch_command

        log = run_dir.parent / f"{run_dir.name}.log"
        cmd = launch_command(config, self.plan.nproc, overrides=[f"--run_dir={run_dir}", *overrides])
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:  # a run in segments: each launch's lines after the last's
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "DS_ACCELERATOR": "cpu"}).returncode
        if rc:
            raise SystemExit(f"error: training {run_dir.name} failed (exit {rc}); see {log}")

    def train(self, m: Model, exit_at: int = 0) -> Path:
        """Train m to plan.steps, or to exit_at (a segment: the schedule still over plan.steps)."""
        run_dir, end = self.out / "runs" / m.name, exit_at or self.plan.steps
        # its COMPLETE marker, not the folder: a run killed mid-save leaves a partial one
        last = run_dir / "checkpoints" / f"step_{end:07d}" / COMPLETE
        if not last.is_file():
            shards = self.shards(self.plan.L, m.train_set)
            self.log(f"[study] train {m.name} (to step {end} of {self.plan.steps})")
            self._timed(f"train {m.name}" + (f" to {end}" if exit_at else ""), lambda: self._launch(
                REPO / "configs" / "exp" / "kv-nope.yaml", run_dir,
                [f"--attention.position={m.position}", f"--train.seed={1234 + m.seed}",
                 f"--data.seed={1234 + m.seed}", f"--train.steps={self.plan.steps}",
                 f"--data.tokenizer={self.data / 'tokenizer.model'}",
                 f"--data.blend=[{{prefix: {shards / 'kv_train'}, weight: 1.0}}]",
                 f"--data.valid_blend=[{{prefix: {shards / 'kv_valid'}, weight: 1.0}}]",
                 f"--train.exit_at={exit_at}", f"--checkpoint.interval={self.plan.every}",
                 f"--train.eval_interval={self.plan.every}", *m.overrides]))
            if not last.is_file():  # exit 0 on a stop signal: not the step it was asked for
                raise SystemExit(f"error: training {m.name} stopped before step {end} (a signal?); "
                                 "rerun the study to resume it")
        return run_dir / "checkpoints"

    def train_to_gate(self, m: Model, segment: int) -> dict:
        """Segments of `segment` steps, the checkpoint rule after each, until a checkpoint is at
        the gate or the budget (plan.steps) is spent: the rule's record, `final` where training
        stopped (the cosine schedule runs over the budget whatever the stop)."""
        ckpt = self.out / "runs" / m.name / "checkpoints"
        if segment % self.plan.every or self.plan.steps % self.plan.every:  # the rule reads the grid
            raise SystemExit(f"error: segments of {segment} and a budget of {self.plan.steps} steps "
                             f"must be multiples of the checkpoint interval {self.plan.every}")
        for end in range(segment, self.plan.steps + segment, segment):
            self.train(m, exit_at=min(end, self.plan.steps))
            rule = self.choose(m, ckpt, upto=end)  # a resumed study reads what a straight one did
            if rule["chosen"]:
                break
        self.log(f"[study] {m.name}: {'gate at ' + rule['chosen'] if rule['chosen'] else 'no gate'} "
                 f"(stopped at {rule['final']})")
        return rule

    def export(self, ckpt: Path, tag: str, name: str) -> Path:
        from lenext_dist.convert.export import export

        out = self.out / "hf" / name / tag
        summary = out.parent / f"{tag}.export.json"  # the export's summary (its head scales)
        if not summary.exists():
            info = export(ckpt, out, tag=tag, tokenizer=str(self.data / "tokenizer.model"),
                          overwrite=True)
            summary.write_text(json.dumps(info, default=str))
        return out

    def evaluate(self, hf: Path, out: Path, lengths: list[int], *, seed: int, docs: int,
                 c: Optional[float] = 1.0, entropy: bool = False, **variant) -> dict:
        """`lenext eval tasks` on kv documents of the held-out filler; c None keeps the model's
        own (learned) head scales; entropy: also the attention entropy of the answer queries."""
        from lenext_dist.eval.jobs import TasksJob

        job = TasksJob(model=str(hf), data=[str(self.data / "heldout" / "filler.jsonl")],
                       lengths=lengths, tasks=["kv"], docs=docs, seed=seed, scale_c=c,
                       out=str(out / "entropy" if entropy else out), no_progress=True,
                       entropy=entropy, **variant)
        if not job.done():
            job.run()
        return json.loads(job.result_path.read_text())

    def choose(self, m: Model, ckpt: Path, upto: int = 0) -> dict:
        """The pre-registered rule: the first checkpoint >= GATE at L (c = 1, validation docs);
        upto: among those up to that step only (0: all)."""
        from lenext_dist.eval.checkpoint_rule import checkpoint_tags, first_over_gate

        def at_L(tag: str) -> float:
            res = self.evaluate(self.export(ckpt, tag, m.name), self.out / "rule" / m.name / tag,
                                [self.plan.L], seed=VALID_SEED, docs=self.plan.valid_docs)
            return res["cells"][0]["accuracy"]

        # a set interval: its grid only (a stop signal's save is not read); 0: every checkpoint
        tags = checkpoint_tags(ckpt, self.plan.interval, upto)
        chosen, seen = first_over_gate(tags, at_L, GATE)
        return {"chosen": chosen, "final": tags[-1], "scanned": seen, "gate": GATE}

    def measure(self, m: Model, rule: dict) -> dict:
        p = self.plan
        lengths = [k * p.L for k in p.multiples]
        ckpt = self.out / "runs" / m.name / "checkpoints"
        rows = []
        for which in ("chosen", "final"):
            tag = rule[which]
            if tag is None:
                continue
            hf = self.export(ckpt, tag, m.name)
            grid = p.scales if m.position == "nope" and not m.overrides else p.final_scales
            for c in (grid if which == "chosen" else p.final_scales):
                res = self.evaluate(hf, self.out / "eval" / m.name / tag, lengths, seed=TEST_SEED,
                                    docs=p.docs, c=c, entropy=True)
                rows.append({"checkpoint": which, "tag": tag, "method": "uniform", "c": c,
                             "cells": res["cells"]})
            if which == "chosen" and m.seed == 0 and m.position in ("nope", "rope"):
                for v in p.variants:
                    res = self.evaluate(hf, self.out / "eval" / m.name / tag, lengths[:2],
                                        seed=TEST_SEED, docs=p.docs, task_set=[f"kv.{v}"])
                    rows.append({"checkpoint": which, "tag": tag, "method": "format",
                                 "variant": v, "cells": res["cells"]})
            if which == "chosen" and m.position == "rope" and m.seed == 0:
                for kind in p.rope_extensions:
                    for k in p.multiples[1:]:
                        res = self.evaluate(hf, self.out / "eval" / m.name / tag, [k * p.L],
                                            seed=TEST_SEED, docs=p.docs, rope_scaling=kind,
                                            rope_factor=float(k))
                        rows.append({"checkpoint": which, "tag": tag, "method": kind,
                                     "factor": k, "cells": res["cells"]})
        return {"model": asdict(m), "rule": rule, "rows": rows}

    def headscale(self, m: Model, rule: dict, fit_a: Optional[float]) -> list[dict]:
        """The paper's HeadScale search at T = s x L on the answers-only loss of kv documents of
        exactly T tokens, from the chosen checkpoint: m_h initialised at the fit's c(s) and
        bounded below by 1 (full), unbounded (no bound), initialised at 1 (init 1)."""
        import math

        from lenext_dist.config import save_config
        from lenext_dist.extend.search import search_config

        p, out = self.plan, []
        ckpt = self.out / "runs" / m.name / "checkpoints" / rule["chosen"]
        for s in p.headscale_targets:
            T = s * p.L
            shards = self.shards(T)
            fit = round(1 + (fit_a or 0.0) * math.log(s), 4)
            batch = max(p.nproc, 64 * p.L // T // p.nproc * p.nproc)  # 4096 tokens a step
            for variant, init, bound in (("full", fit, 1.0), ("no bound", fit, None),
                                         ("init 1", 1.0, 1.0)):
                name = f"{m.name}-hs{s}-{variant.replace(' ', '')}"
                run_dir = self.out / "runs" / name
                last = run_dir / "checkpoints" / f"step_{p.headscale_steps:07d}" / COMPLETE
                if not last.is_file():
                    cfg = search_config(
                        ckpt, run_dir, target=T, init=init, steps=p.headscale_steps, lr=0.1,
                        warmup=max(1, p.headscale_steps // 10), global_batch=batch,
                        micro_batch=batch // p.nproc, overshoot=1.0, min_value=bound,
                        zero_stage=2, activation_checkpointing=False,
                        data={"seed": 99, "valid_blend": [],
                              "blend": [{"prefix": str(shards / "kv_train"), "weight": 1.0}]})
                    conf = self.out / "runs" / f"{name}.yaml"
                    save_config(cfg, conf)
                    self.log(f"[study] HeadScale {name} (T = {T}, init {init}, bound {bound})")
                    self._timed(f"headscale {name}", lambda: self._launch(conf, run_dir, []))
                hf = self.export(run_dir / "checkpoints", f"step_{p.headscale_steps:07d}", name)
                res = self.evaluate(hf, self.out / "eval" / name, [p.L, T], seed=TEST_SEED,
                                    docs=p.docs, c=None)
                scales = json.loads((hf.parent / f"{hf.name}.export.json").read_text())["head_scales"]
                out.append({"target": s, "T": T, "variant": variant, "init": init, "bound": bound,
                            "cells": res["cells"], "head_scales": scales})
        return out

    # -- the whole study
    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        results = []
        for m in self.plan.models:
            ckpt = self.train(m)
            rule = self._timed(f"rule {m.name}", lambda: self.choose(m, ckpt))
            self.log(f"[study] {m.name}: chosen {rule['chosen']} (final {rule['final']})")
            results.append(self._timed(f"eval {m.name}", lambda: self.measure(m, rule)))
            self._save(results, [])
        summary = summarize(asdict(self.plan), results, [])
        hs_model = next((r for r in results if r["model"]["name"] == "nope-s0"
                         and r["rule"]["chosen"]), None)
        headscale = []
        if hs_model and self.plan.headscale_targets:
            a = summarize_fit(summary)
            headscale = self.headscale(Model(**{**hs_model["model"], "overrides": tuple(
                hs_model["model"]["overrides"])}), hs_model["rule"], a)
        return self._save(results, headscale)

    def _save(self, results: list, headscale: list) -> dict:
        summary = {**summarize(asdict(self.plan), results, headscale), **self.record()}
        (self.out / "results.json").write_text(json.dumps(results, indent=1))
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        (self.out / "STUDY.md").write_text(render(summary))
        return summary


def summarize_fit(summary: dict) -> Optional[float]:
    fit = summary.get("claims", {}).get("best_c_fit", {}).get("numbers", {})
    return fit.get("a")


def plan_differs(record: dict, plan: Plan) -> list[str]:
    """The fields in which a recorded plan (summary.json's, plan.json's) differs from `plan`, the
    ranks aside; a field the record lacks ran at its default (it was written before the field)."""
    want = json.loads(json.dumps(asdict(plan)))
    default = json.loads(json.dumps({f.name: f.default for f in fields(plan) if f.default is not MISSING}))
    if isinstance(record.get("models"), list):
        record = {**record, "models": plan_models(record)}
    return sorted(k for k in {*want, *record} - {"nproc"}
                  if record.get(k, default.get(k)) != want.get(k))


def plan_models(record: dict) -> list:
    """A recorded plan's models, a field a model lacks at its default (written before the field)."""
    model = json.loads(json.dumps({f.name: f.default for f in fields(Model) if f.default is not MISSING}))
    return [{**model, **m} if isinstance(m, dict) else m for m in record.get("models") or []]


def publish(out: Path, dest: Path, names: tuple[str, ...] = ("summary.json", "STUDY.md"), *,
            full: Plan) -> None:
    """Copy a study's records to `dest`: summary.json (every number, the per-model results and
    the timings included) and the page generated from it. Refused unless its summary.json's plan
    is the full study's `full` (ranks aside): a --quick run, whatever --out or flag named it,
    would overwrite the published study."""
    missing = [n for n in names if not (out / n).is_file()]
    if missing:
        raise SystemExit(f"error: {out} has no {', '.join(missing)}: run the study first")
    try:
        plan = json.loads((out / "summary.json").read_text()).get("plan") or {}
    except (OSError, ValueError, AttributeError):
        plan = {}
    differ = plan_differs(plan, full)
    if differ:
        got = f"steps {plan.get('steps')}, {len(plan.get('models') or [])} models"
        raise SystemExit(f"error: {out}/summary.json is not the full study's ({got}; its "
                         f"{', '.join(differ)} differ: a --quick run?): --publish takes the full "
                         f"study's results only, nothing copied to {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copy(out / n, dest / n)
    print(f"[study] published {out} -> {dest}")


def study_parser(name: str, description: str,
                 quick: str = "a smoke run: 2 models, a few steps") -> argparse.ArgumentParser:
    """The studies' command line (experiments.<name>): --quick, --out, --publish, --nproc; a study
    adds its own flags to it."""
    cmd = f"python -m experiments.{name}"
    ap = Parser(prog=cmd, formatter_class=argparse.RawDescriptionHelpFormatter,
                description=description,
                epilog=f"examples:\n  {cmd} --quick\n  {cmd} && {cmd} --publish")
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--out", help=f"work folder (default results/{name}[-quick])")
    ap.add_argument("--publish", action="store_true",
                    help=f"copy the finished study's records to experiments/{name}/results")
    ap.add_argument("--nproc", type=int, default=2, help="ranks per training (default 2)")
    return ap


def work_folder(a: argparse.Namespace, name: str) -> Path:
    """--out, or results/<name>[-quick] in the checkout."""
    return Path(a.out or REPO / f"results/{name}{'-quick' if a.quick else ''}")


def main(argv=None) -> int:
    ap = study_parser(
        "nope_length",
        "Run the NoPE length-generalization study in the synthetic key-value regime.\n\n"
        "Trains NoPE and RoPE (3 seeds each), ALiBi, KERPLE and a windowed NoPE; picks\n"
        "each checkpoint by the pre-registered rule; scores retrieval at 1-16x L with\n"
        "uniform scales, RoPE PI/NTK/YaRN and HeadScale; judges the claims.")
    a = ap.parse_args(argv)
    out = work_folder(a, "nope_length")
    if a.publish:
        publish(out, HERE / "results", full=full_plan())
        return 0
    plan = replace(quick_plan() if a.quick else full_plan(), nproc=a.nproc)
    summary = Study(plan, out).run()
    print(f"[study] wrote {out / 'STUDY.md'} ({len(summary['claims'])} claims)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
