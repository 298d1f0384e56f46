"""The length study redone in the kv regime (issue 43, item 2): the claims of experiments/nope_length
(analysis.py there: the same thresholds, written before its runs) judged on the models of a kv
regime grid, beside that grid's held-out-format table (`sweep.py score`: REGIME.md).

Each model is the grid run's last checkpoint, exported on the device (the regime's rule: no
checkpoint scan, so the checkpoint-dependence claim is not measured); its folder says what it is
(config.json: position, window, the checkpoint's tag). The measurement is nope_length's
(`Study.measure`): whole-answer accuracy at 1-16 L on test documents of the runs' own training
mixture (the grid's `Run.mix`: the skill at longer lengths, not another format) over the held-out
filler; the uniform-c grid with the attention entropy on the NoPE seeds (the fit of the best c),
c = 1 and 1.5 on every other model, RoPE PI / NTK / YaRN on rope-s0. HeadScale needs the training
checkpoint (the device brings back exports only): it is item 4's (experiments/sizes).

  python -m experiments.kv_regime.study --models MODELS --out WORK [--grids GRID,ITS_OTHERS_GRID]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from experiments.nope_length.analysis import render, summarize
from experiments.nope_length.study import Model, Plan, Study

from .data import kv_data
from .grids import GRIDS, L, Run
from .sweep import exported, first_blend, trained_on
from lenext_dist.flags import Parser

MULTIPLES = (1, 2, 4, 8, 16)
GRIDS_STUDIED = ("distract_vary", "others_vary")
"""The grids the study reads by default: the last regime whose NoPE probe passed its rule
(grids.DISTRACT_VARY; distract_lm_all's passed too, then failed the gate on one cell), and ALiBi,
KERPLE and the windowed NoPE trained alike. --grids names another."""


def model_of(folder: Path) -> tuple[Model, str]:
    """The study's Model of an exported grid run (<position>-s<seed>) and its checkpoint's tag."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {folder}/config.json: {e}") from None
    window = (cfg.get("attention_options") or {}).get("window")
    seed = folder.name.rsplit("-s", 1)[-1]
    if "position" not in cfg or not seed.isdigit():
        raise SystemExit(f"error: {folder} is not an export of a kv regime run "
                         "(a lenext model named <position>-s<seed>)")
    tag = (cfg.get("lenext_source") or {}).get("tag")
    if not tag:
        raise SystemExit(f"error: {folder}/config.json names no checkpoint (lenext_source.tag)")
    return Model(folder.name, cfg["position"], int(seed),
                 (f"--attention.window={window}",) if window else ()), tag


def trained_blend(folder: Path) -> str:
    """The shards a model was trained on, with their weights (its export's run config: its first
    stage's data.blend), in sweep.trained_on's words."""
    import yaml

    try:
        cfg = yaml.safe_load((folder / "lenext_run_config.yaml").read_text())
        found = [(Path(b["prefix"]).name, float(b.get("weight", 1.0))) for b in cfg["data"]["blend"]]
        if not found:
            raise IndexError("an empty blend")
        return trained_on(found)
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise SystemExit(f"error: {folder}/lenext_run_config.yaml names no training data ({e}): "
                         "not an export of a kv regime run") from None


def plan(models: tuple[Model, ...], steps: int, docs: int = 128) -> Plan:
    """nope_length's plan at the regime's L, without the formats (REGIME.md holds them) and
    without HeadScale (experiments/sizes)."""
    return Plan(models=models, steps=steps, multiples=MULTIPLES, variants=(), headscale_targets=(),
                docs=docs, L=L)


class GridStudy(Study):
    """nope_length's measurement of exported models: their folders stand for the export step and
    the repository's kv data for the study's own (the held-out filler score() also reads)."""

    def __init__(self, plan: Plan, out: Path, models: Path, mix: tuple[str, ...]):
        self.models, self.task_set = models, [f"kv.{p}" for p in mix]
        super().__init__(plan, out)
        self.data = kv_data()

    def _claim_folder(self) -> None:
        # the evaluations are the only outputs, each refused over results of other options
        # (eval's own check): a folder may gain models of a later grid
        self.out.mkdir(parents=True, exist_ok=True)

    def export(self, ckpt: Path, tag: str, name: str) -> Path:
        return self.models / name

    def evaluate(self, hf: Path, out: Path, lengths: list[int], **kw) -> dict:
        return super().evaluate(hf, out, lengths, **{"task_set": self.task_set, **kw})

    def measure_last(self, m: Model, tag: str) -> dict:
        """Study.measure on the run's last checkpoint (`tag`), the regime's rule."""
        self.log(f"[regime] {m.name} ({m.position}{' ' + m.overrides[0] if m.overrides else ''}, {tag})")
        rule = {"chosen": tag, "final": None, "scanned": [], "gate": "the run's last checkpoint"}
        return self._timed(f"eval {m.name}", lambda: self.measure(m, rule))


INTRO = ("Generated by `python -m experiments.kv_regime.study` from summary.json (do not edit). "
         "The claims of experiments/nope_length (its analysis.py) on the kv regime's models: "
         "4 layers, hidden 128, 4 heads, {steps} steps of 256 documents of exactly L = {L} tokens "
         "(kv {mix}; shards {blend}), each run's last checkpoint. Scores: whole answers right (teacher forced) of "
         "{docs} test documents of the same mixture over the held-out filler per cell. The held-out "
         "formats and the regime's gate: REGIME.md beside this page.")


def is_run(m: Model, trained: str, tag: str, r: Optional[Run]) -> bool:
    """Is the exported model `m`, trained on the shards `trained` (its first stage's blend, in
    sweep.trained_on's words) to the checkpoint `tag`, the finished grid run `r`: its position, its
    window, its training data (the kv shards and any text beside them) and its last step (a run cut
    short is not the regime; grids may share everything but steps)?"""
    return (r is not None and r.position == m.position and trained == trained_on(first_blend(r))
            and tag == f"step_{r.steps:07d}"
            and m.overrides == ((f"--attention.window={r.window}",) if r.window else ()))


def run(models: Path, out: Path, grids: tuple[str, ...] = GRIDS_STUDIED, docs: int = 128,
        partial: bool = False) -> dict:
    """Every exported model under `models`, each a finished run of `grids` (its training mixture:
    the documents it is scored on; all the same, or NoPE and RoPE would be compared on different
    ones), and every run of `grids` among them: the claims are over each position's seeds, so a
    study of some seeds is refused (partial: run, its missing runs named in STUDY.md)."""
    found = exported(models)
    runs = {n: r for g in reversed(grids) for n, r in GRIDS[g].items()}  # the first grid wins
    specs = [model_of(f) for f in found]
    for m, tag in specs:
        trained = trained_blend(models / m.name)  # grids share run names: the export's data tells
        if not is_run(m, trained, tag, runs.get(m.name)):
            window = f", window {m.overrides[0].split('=')[1]}" if m.overrides else ""
            raise SystemExit(f"error: {models / m.name} ({m.position}{window}, trained on {trained}, "
                             f"checkpoint {tag}) is no finished run of the grids {', '.join(grids)}: "
                             "pass --grids, or finish the run")
    missing = sorted(set(runs) - {m.name for m, _ in specs})
    if missing and not partial:
        raise SystemExit(f"error: {models} lacks runs of the grids {', '.join(grids)}: {', '.join(missing)}; "
                         "the claims are over every seed of each position: finish them (or pass "
                         "--partial for a study labelled partial)")
    mixes = {(runs[m.name].mix, runs[m.name].bos) for m, _ in specs}
    named = sorted(", ".join(x) + (", BOS first" if b else "") for x, b in mixes)
    if len(mixes) > 1:
        raise SystemExit(f"error: the models under {models} were trained on different mixtures "
                         f"({'; '.join(named)}): one study each")
    mix = mixes.pop()[0]  # BOS: the evaluations put it first as the export records (data.bos)
    steps = sorted({runs[m.name].steps for m, _ in specs})  # a grid may give NoPE a longer schedule
    p = plan(tuple(m for m, _ in specs), steps[-1], docs)
    study = GridStudy(p, out, models, mix)
    results = [study.measure_last(m, tag) for m, tag in specs]
    summary = {**summarize(asdict(p), results, []), "documents": study.task_set,
               "timings_s": study.timings, "missing_runs": missing}
    summary["claims"]["headscale_vs_uniform"]["reason"] = (
        "the search trains from the training checkpoint, which the device does not bring back: "
        "experiments/sizes")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    blends = sorted({trained_on(first_blend(runs[m.name])) for m, _ in specs})  # one mix, maybe other texts
    intro = INTRO.format(L=L, steps=" or ".join(map(str, steps)), docs=docs, mix=named[0], blend="; ".join(blends))
    if missing:
        intro = (f"**Partial (--partial): runs {', '.join(missing)} of the grids are missing; these are not "
                 f"the study's verdicts.** " + intro)
    (out / "STUDY.md").write_text(render(summary, intro))
    return summary


def main(argv=None) -> int:
    ap = Parser(prog="python -m experiments.kv_regime.study", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="folder of a grid's exported models (one folder each)")
    ap.add_argument("--out", required=True, help="work folder: evaluations, summary.json, STUDY.md")
    ap.add_argument("--grids", default=",".join(GRIDS_STUDIED),
                    help="the grids the models are runs of (their training mixture; default %(default)s)")
    ap.add_argument("--docs", type=int, default=128, help="test documents per cell (default 128)")
    ap.add_argument("--partial", action="store_true",
                    help="run with runs of the grids missing (STUDY.md says so; not the study's verdicts)")
    a = ap.parse_args(argv)
    grids = tuple(g for g in a.grids.split(",") if g)
    bad = [g for g in grids if g not in GRIDS]
    if bad or not grids:
        ap.error(f"--grids: {', '.join(bad) or 'none'} (known: {', '.join(GRIDS)})")
    summary = run(Path(a.models), Path(a.out), grids, a.docs, a.partial)
    for c in summary["claims"].values():
        print(f"{c['verdict']:>26}  {c['claim']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
