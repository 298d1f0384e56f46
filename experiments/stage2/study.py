"""What stage 2 buys (experiments/stage2): train at L, continue a few hundred steps at 4L, and
compare with the zero-shot methods (temperature schedules, YaRN) on the base at 4L-16L.

The kv regime and 4-layer layouts of experiments/nope_layouts (its LAYOUTS and SCHEDULES; the
`Study` steps of experiments/nope_length: data, launcher, export, `lenext eval tasks`, the
checkpoint rule). Fixed here before any run:

  layouts       nope, rope, interleave (RoPE x3 + NoPE), irope (chunked RoPE x3 + global NoPE)
  seeds         0 and 1
  stage 1       at L = 64, the nope_layouts regime: 2500 steps; irope 5000 (it reached the gate
                on neither seed in 2500 in the layout study: a hybrid gets its own budget)
  base          the first stage-1 checkpoint >= 0.9 at L on validation documents, else the
                last, reported "not gated" and left out of the verdicts
  stage 2       `checkpoint.init_from` the base (weights; AdamW restarts), 300 steps at 4L on kv
                documents of exactly 4L tokens, 16 sequences a step (stage 1's 4096 tokens per
                step kept), AdamW lr 1e-3 (stage 1: 3e-3 cosine to 3e-4) with 30 warmup steps,
                cosine to 1e-4; model.train_length stays L (as train.stages keeps it). RoPE layers
                (rope, interleave, irope) get theta x16: 1e4 -> 1.6e5. Why 16: NTK's rule for s =
                4 at head dim 16 is 4^(16/14) = 4.9, but production stages raise theta by more
                than NTK (Xiong et al. 2023's ABF 1e4 -> 5e5 for 8x; SmolLM3 5e4 -> 1.5e6 for 8x),
                about s^2: 16 for s = 4. The stage-2 model is its last checkpoint.
  scores        the same held-out test documents (TEST_SEED) at 1, 4, 8, 16 L: the base with each
                schedule of SCHEDULES on its NoPE layers (rope has none: `none` only) and, where
                RoPE layers see whole-document positions (rope, interleave), YaRN at s = n / L;
                the stage-2 model with no schedule. Verdicts: analysis.py.

  python -m experiments.stage2             # the study, resumable (~100 min on 2 cores)
  python -m experiments.stage2 --quick     # a smoke run (a few minutes)
  python -m experiments.stage2 --publish   # records -> experiments/stage2/results
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from experiments.nope_layouts.study import DEPTH, LAYOUTS, SCHEDULES
from experiments.nope_length.study import REPO, TEST_SEED, Model, Plan, Study, publish, study_parser, work_folder
from lenext_dist.checkpoint.layout import COMPLETE

from .analysis import STAGE2, render, summarize

HERE = Path(__file__).resolve().parent
ROPE_BASE = 10000.0
"""attention.rope.base of stage 1 (the config default the kv configs keep)."""
YARN_LAYOUTS = ("rope", "interleave")
"""Layouts whose RoPE layers see whole-document positions: YaRN is a zero-shot method for them
(irope's RoPE layers see positions inside chunks of L/4 only)."""


@dataclass(frozen=True)
class Stage2Plan(Plan):
    stage1_steps: tuple[tuple[str, int], ...] = (("irope", 5000),)
    """Stage-1 steps of a layout where not `steps`."""
    stage2_steps: int = 300
    stage2_factor: int = 4
    """Stage 2 trains at this multiple of L."""
    theta_factor: float = 16.0
    """RoPE theta of stage 2 = ROPE_BASE x this (layouts with RoPE layers)."""
    stage2_lr: float = 1e-3
    stage2_warmup: int = 30
    verdict_multiples: tuple[int, ...] = (4, 8, 16)


def models(seeds=(0, 1), layouts=("nope", "rope", "interleave", "irope")) -> tuple[Model, ...]:
    return tuple(Model(f"{name}-s{s}", LAYOUTS[name][0], s, DEPTH + LAYOUTS[name][1])
                 for name in layouts for s in seeds)


def full_plan() -> Stage2Plan:
    return Stage2Plan(models=models(), steps=2500, multiples=(1, 4, 8, 16))


def quick_plan() -> Stage2Plan:
    return Stage2Plan(models=models(seeds=(0,), layouts=("nope", "interleave")), steps=40,
                      stage1_steps=(), multiples=(1, 4), verdict_multiples=(4,), docs=8,
                      valid_docs=8, kv_passes=1, stage2_steps=6, stage2_warmup=2)


def layout_of(m: Model) -> str:
    return m.name.rsplit("-s", 1)[0]


def has_rope(layout: str) -> bool:
    return LAYOUTS[layout][0] == "rope"


def stage1_steps(plan: Stage2Plan, m: Model) -> int:
    return dict(plan.stage1_steps).get(layout_of(m), plan.steps)


def stage2_overrides(plan: Stage2Plan, m: Model, base: Path, shards: Path, tokenizer: Path) -> list[str]:
    """The stage-2 run's settings over configs/exp/kv-nope.yaml (the base's own layout after)."""
    S = plan.stage2_factor * plan.L
    gbs = 64 * plan.L // S  # stage 1's tokens per step (64 sequences of L) kept
    out = [f"--attention.position={m.position}", f"--train.seed={1234 + m.seed}",
           f"--data.seed={1234 + m.seed}", f"--model.seq_length={S}",
           f"--model.train_length={plan.L}", f"--train.steps={plan.stage2_steps}",
           f"--train.global_batch_size={gbs}", f"--train.micro_batch_size={gbs // plan.nproc}",
           f"--optim.lr={plan.stage2_lr}", f"--optim.warmup_steps={plan.stage2_warmup}",
           f"--checkpoint.init_from={base}", f"--checkpoint.interval={plan.stage2_steps}",
           f"--train.eval_interval={max(1, plan.stage2_steps // 3)}",
           f"--data.tokenizer={tokenizer}",
           f"--data.blend=[{{prefix: {shards / 'kv_train'}, weight: 1.0}}]",
           f"--data.valid_blend=[{{prefix: {shards / 'kv_valid'}, weight: 1.0}}]", *m.overrides]
    if has_rope(layout_of(m)):
        out.append(f"--attention.rope.base={ROPE_BASE * plan.theta_factor:g}")
    return out


class Stage2:
    """The steps of one model: stage 1, the rule, stage 2, the scores; each skipped when done."""

    def __init__(self, plan: Stage2Plan, out: Path, log=print):
        self.plan, self.out, self.log = plan, out, log
        self.study = Study(plan, out, log)

    def stage1(self, m: Model) -> Path:
        """The base's run at L: Study.train with this layout's step budget."""
        plan = self.study.plan
        self.study.plan = replace(plan, steps=stage1_steps(self.plan, m))
        try:
            return self.study.train(m)
        finally:
            self.study.plan = plan

    def stage2(self, m: Model, base_tag: str) -> tuple[str, Path]:
        p = self.plan
        name = f"{m.name}-stage2-{base_tag}"  # the base in the name: a new base, a new run
        run_dir = self.out / "runs" / name
        tag = f"step_{p.stage2_steps:07d}"
        if not (run_dir / "checkpoints" / tag / COMPLETE).is_file():  # not a partial save
            shards = self.study.shards(p.stage2_factor * p.L)
            base = self.out / "runs" / m.name / "checkpoints" / base_tag
            self.log(f"[stage2] stage 2 of {m.name} from {base_tag} ({p.stage2_steps} steps at "
                     f"{p.stage2_factor}L)")
            self.study._timed(f"stage2 {m.name}", lambda: self.study._launch(
                REPO / "configs" / "exp" / "kv-nope.yaml", run_dir,
                stage2_overrides(p, m, base, shards, self.study.data / "tokenizer.model")))
        return name, self.study.export(run_dir / "checkpoints", tag, name)

    def _eval(self, hf: Path, name: str, lengths: list[int], **kw) -> list:
        return self.study.evaluate(hf, self.out / "eval" / name, lengths, seed=TEST_SEED,
                                   docs=self.plan.docs, **kw)["cells"]

    def run(self, m: Model) -> dict:
        p, layout = self.plan, layout_of(m)
        lengths = [k * p.L for k in p.multiples]
        ckpt = self.stage1(m)
        rule = self.study.choose(m, ckpt)
        base_tag = rule["chosen"] or rule["final"]
        self.log(f"[stage2] {m.name}: base {base_tag} ({'gated' if rule['chosen'] else 'not gated'})")
        hf = self.study.export(ckpt, base_tag, m.name)
        rows = []
        for label, spec in SCHEDULES.items():
            if spec is not None and layout == "rope":  # no NoPE layer to scale
                continue
            rows.append({"stage": "base", "method": label, "spec": spec, "cells": self._eval(
                hf, f"{m.name}/{base_tag}", lengths, **({"temperature": spec} if spec else {}))})
        if layout in YARN_LAYOUTS:
            cells = [c for k in p.multiples[1:] for c in self._eval(
                hf, f"{m.name}/{base_tag}", [k * p.L], rope_scaling="yarn", rope_factor=float(k))]
            rows.append({"stage": "base", "method": "yarn", "spec": "yarn, s = n / L", "cells": cells})
        name, hf2 = self.stage2(m, base_tag)
        rows.append({"stage": STAGE2, "method": STAGE2, "spec": None,
                     "cells": self._eval(hf2, name, lengths)})
        theta = (ROPE_BASE, json.loads((hf2 / "config.json").read_text())["rope"]["base"]) \
            if has_rope(layout) else None
        return {"model": asdict(m), "layout": layout, "seed": m.seed, "rule": rule,
                "gated": rule["chosen"] is not None, "base_tag": base_tag,
                "stage1_steps": stage1_steps(p, m),
                "stage2": {"name": name, "tag": f"step_{p.stage2_steps:07d}", "rope_base": theta},
                "rows": rows}


def main(argv=None) -> int:
    ap = study_parser(
        "stage2",
        "What a short training stage at 4x the length buys over zero-shot methods.\n\n"
        "Trains NoPE, RoPE, RoPE x3 + NoPE and iRoPE (4 layers, two seeds) on kv\n"
        "documents of L tokens, continues each chosen checkpoint a few hundred steps\n"
        "at 4L (RoPE theta raised), and scores both at 1-16x L beside the temperature\n"
        "schedules and YaRN applied to the first model; judges which wins.")
    a = ap.parse_args(argv)
    out = work_folder(a, "stage2")
    if a.publish:
        try:
            partial = json.loads((out / "summary.json").read_text()).get("partial")
        except (OSError, ValueError, AttributeError):
            partial = None  # publish() names what is missing or wrong
        if partial:
            raise SystemExit(f"error: {out}/summary.json is partial (the study has not finished): "
                             "rerun `python -m experiments.stage2` with the same --out first")
        publish(out, HERE / "results", ("summary.json", "STAGE2.md"), full=full_plan())
        return 0
    plan = replace(quick_plan() if a.quick else full_plan(), nproc=a.nproc)
    runner, results = Stage2(plan, out), []
    (out / "results").mkdir(parents=True, exist_ok=True)
    for m in plan.models:
        r = runner.run(m)
        (out / "results" / f"{m.name}.json").write_text(json.dumps(r, indent=1))
        results.append(r)
        summary = {**summarize(asdict(plan), results, expected=len(plan.models)),
                   **runner.study.record()}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        (out / "STAGE2.md").write_text(render(summary))
    print(f"[stage2] wrote {out / 'STAGE2.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
