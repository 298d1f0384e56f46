"""The fitted slope a across model sizes, and HeadScale against its two ablations with seeds
(experiments/sizes; issue 43, items 4 and 5).

The kv regime of experiments/nope_length (data, optimisation, checkpoint rule, scoring: its `Study`
steps), NoPE only, at three sizes with the head dimension fixed at 16, so that a temperature
lambda = c / sqrt(d) means the same at every size:

    2l-d64    2 layers, hidden 64, 4 heads     (nope_length's size, where a = 0.274 was fitted)
    4l-d64    4 layers, hidden 64, 4 heads
    4l-d128   4 layers, hidden 128, 8 heads

Three seeds each, each trained until the gate (`Study.train_to_gate`: segments of SEGMENT steps,
the checkpoint rule after each, the cosine schedule over BUDGET); a seed off the gate is scored
nowhere. Each chosen checkpoint is scored with the uniform-c grid at 1-16 L (the fit of a). At the
largest size every gated seed also runs the paper's HeadScale search and its two ablations
(full, no bound, init 1) at 2, 4, 8 L, initialised from that size's own fit. The rules that turn
the numbers into verdicts are in analysis.py, written before the runs.

  python -m experiments.sizes             # ~2 h on 2 cores, resumable
  python -m experiments.sizes --quick     # a smoke run (a few minutes)
  python -m experiments.sizes --publish   # records -> experiments/sizes/results
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

from experiments.nope_length.study import (TEST_SEED, Model, Plan, Study, publish, study_parser,
                                          work_folder)

from .analysis import plot, render, summarize

HERE = Path(__file__).resolve().parent


class Size(NamedTuple):
    layers: int
    hidden: int
    heads: int

    def overrides(self) -> tuple[str, ...]:
        return (f"--model.num_layers={self.layers}", f"--model.hidden_size={self.hidden}",
                f"--model.num_attention_heads={self.heads}", f"--model.num_query_groups={self.heads}",
                f"--model.ffn_hidden_size={int(2.75 * self.hidden)}")

    def params(self) -> int:
        """Non-embedding parameters: q, k, v, o (4 h^2) and SwiGLU's three h x 2.75h a layer."""
        return self.layers * (4 * self.hidden ** 2 + 3 * self.hidden * int(2.75 * self.hidden))


SIZES = {"2l-d64": Size(2, 64, 4), "4l-d64": Size(4, 64, 4), "4l-d128": Size(4, 128, 8)}
SEEDS = (0, 1, 2)
BUDGET = 7500
SEGMENT = 500
CHECKPOINT = 125
"""As experiments/nope_layouts: a budget of 7500 steps, the rule every 500, checkpoints every 125."""


def size_of(m: Model) -> str:
    return m.name.rsplit("-s", 1)[0]


def models(sizes=tuple(SIZES), seeds=SEEDS) -> tuple[Model, ...]:
    return tuple(Model(f"{size}-s{s}", "nope", s, SIZES[size].overrides()) for size in sizes for s in seeds)


def full_plan() -> Plan:
    return Plan(models=models(), steps=BUDGET, interval=CHECKPOINT)


def quick_plan() -> Plan:
    return Plan(models=models(sizes=("2l-d64", "4l-d128"), seeds=(0,)), steps=60, interval=10,
                multiples=(1, 2), scales=(1.0, 1.5), headscale_targets=(2,), headscale_steps=10,
                docs=8, valid_docs=8, kv_passes=1)


def measure(study: Study, m: Model, rule: dict) -> dict:
    """The uniform-c grid at every multiple of L on the chosen checkpoint (off the gate: none)."""
    p, tag, rows = study.plan, rule["chosen"], []
    if tag is not None:
        hf = study.export(study.out / "runs" / m.name / "checkpoints", tag, m.name)
        for c in p.scales:
            res = study.evaluate(hf, study.out / "eval" / m.name / tag, [k * p.L for k in p.multiples],
                                 seed=TEST_SEED, docs=p.docs, c=c)
            rows.append({"checkpoint": "chosen", "tag": tag, "method": "uniform", "c": c,
                         "cells": res["cells"]})
    return {"model": asdict(m), "size": size_of(m), "rule": rule, "rows": rows}


def main(argv=None) -> int:
    ap = study_parser(
        "sizes",
        "Fit the best-c slope a at three NoPE model sizes; HeadScale at the largest.\n\n"
        "Three seeds a size, each trained to its gate; the uniform-c grid at 1-16x L\n"
        "gives each seed's fit c(s) = 1 + a ln s; at the largest size HeadScale and its\n"
        "two ablations (no bound, init 1) run on every gated seed.",
        quick="a smoke run: 2 sizes, 1 seed, a few steps")
    a = ap.parse_args(argv)
    out = work_folder(a, "sizes")
    names = ("summary.json", "SIZES.md", "a_by_size.png")
    if a.publish:
        publish(out, HERE / "results", names, full=full_plan())
        return 0
    plan = replace(quick_plan() if a.quick else full_plan(), nproc=a.nproc)
    study = Study(plan, out)
    segment = 20 if a.quick else SEGMENT
    sizes = list(dict.fromkeys(size_of(m) for m in plan.models))
    params = {s: SIZES[s].params() for s in sizes}
    results = [measure(study, m, study.train_to_gate(m, segment)) for m in plan.models]
    fits = {r["size"]: r["a"] for r in summarize(asdict(plan), results, [], params)["sizes"]}
    headscale = []
    for r in results:  # the largest size's gated seeds, from that size's own fit
        if r["size"] == sizes[-1] and r["rule"]["chosen"]:
            m = next(x for x in plan.models if x.name == r["model"]["name"])
            headscale += [{**h, "model": m.name} for h in study.headscale(m, r["rule"], fits[sizes[-1]])]
    summary = {**summarize(asdict(plan), results, headscale, params), **study.record()}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "SIZES.md").write_text(render(summary))
    plot(summary, out / "a_by_size.png")
    print(f"[sizes] wrote {out / 'SIZES.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
