"""`python -m lenext_dist.study [--quick] [--out DIR]`: the small-scale study of issue 8.

Pretrains NoPE and RoPE (and other registered variants) of one shape in the regime the regime
search chose (configs/study/full.yaml: the sample text + generated task documents), exports them,
evaluates every length-extension method at L, 2L, 4L, 8L (PPL, per-position loss, attention
entropy, context use, extrapolation penalty, the uniform-scale fit, HeadScale and its ablations via
`lenext extend`) and for retrieval at 1x..16x L (the LongLoRA passkey, task-format documents),
and writes `<out>/summary.json`, figures and `<out>/STUDY.md`, which checks the paper's claims one
by one. Resumable: rerun the same command after a kill.

  python -m lenext_dist.study --quick                # ~4 minutes on 2 cores (CI), results/study-quick/
  python -m lenext_dist.study                        # ~95 min, results/study/, published to docs/study/
  python -m lenext_dist.study --report-only          # redo analysis/figures/STUDY.md from the files
  python -m lenext_dist.study --regime               # the regime search (study/regime.py), results/regime/
  python -m lenext_dist.study --regime --publish     # ... and merge its rows into docs/regime/regime.json
  python -m lenext_dist.study --probe                # ordered-copy probe (study/probe.py), ~5 min
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from lenext_dist.errors import entry_point

from .jobs import REPO


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


DESCRIPTION = """Run the small-scale study: the paper's length-generalization claims, checked at CPU scale.

Pretrains NoPE, RoPE and other position variants of one shape, exports them, evaluates every
length-extension method at 1x..16x the training length (perplexity, retrieval, context use,
attention entropy, the uniform-scale fit, HeadScale) and writes <out>/STUDY.md, which checks the
paper's claims one by one, with summary.json and figures. Resumable: rerun the same command after
a kill. --regime runs the search for a training regime instead, --probe a synthetic copying probe."""

EPILOG = """examples:
  python -m lenext_dist.study --quick          # small, every variant, 1 seed: results/study-quick/
  python -m lenext_dist.study                  # the full study: results/study/, published to docs/study/
  python -m lenext_dist.study --report-only    # redo the analysis, figures and STUDY.md from the files
  python -m lenext_dist.study --regime         # the regime search: results/regime/REGIME.md

Manual: docs/study.md"""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lenext_dist.study", description=DESCRIPTION,
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the CI-sized study (preset 'quick')")
    ap.add_argument("--regime", action="store_true",
                    help="the regime search instead (with --quick: its CI size); "
                         "writes <out>/REGIME.md and regime.json (default results/regime[-quick])")
    ap.add_argument("--publish", action="store_true",
                    help="with --regime: merge its measured rows into the record docs/regime/ "
                         "(what the full study's STUDY.md shows)")
    ap.add_argument("--probe", action="store_true",
                    help="the ordered-copy probe instead (a synthetic copying task through the "
                         "project's model; with --quick: its CI size); writes "
                         "<out>/PROBE.md and probe.json (default results/probe[-quick]-<loss>)")
    ap.add_argument("--probe-loss", choices=("answers", "all"), default="answers",
                    help="probe: loss on the copied tokens only, or on every token (the control)")
    ap.add_argument("--out", default=None, help="results folder (results/study[-quick])")
    ap.add_argument("--seeds", type=_ints, default=None, help="NoPE/RoPE seeds, e.g. 1,2")
    ap.add_argument("--variants", default=None,
                    help="other trained position variants, e.g. alibi,kerple_log ('' for none)")
    ap.add_argument("--uniform-c", type=_floats, default=None, help="uniform scales for NoPE")
    ap.add_argument("--headscale-steps", type=int, default=None)
    ap.add_argument("--budget-tokens", type=int, default=None, help="scored tokens per PPL cell")
    ap.add_argument("--workers", type=int, default=None, help="parallel lanes (default 2)")
    ap.add_argument("--train-ranks", type=int, default=None,
                    help="ranks per pretraining run (deepspeed --num_gpus); default 1")
    ap.add_argument("--port", type=int, default=29650, help="first master port")
    ap.add_argument("--report-only", action="store_true", help="only analysis + STUDY.md")
    ap.add_argument("--no-copy", action="store_true",
                    help="full study: do not publish STUDY.md and the files it cites to docs/study/ "
                         "(the versioned copy in the repository)")
    ap.add_argument("overrides", nargs="*", metavar="--a.b=value",
                    help="pretraining overrides for every run (after --), e.g. -- --train.steps=2000")
    return ap


def make_plan(a):
    from .plan import preset

    changes = dict(seeds=a.seeds, uniform_c=a.uniform_c, headscale_steps=a.headscale_steps,
                   budget_tokens=a.budget_tokens, workers=a.workers, train_ranks=a.train_ranks)
    if a.variants is not None:
        changes["extra_variants"] = [v for v in a.variants.split(",") if v]
    if a.overrides:
        changes["overrides"] = list(a.overrides)
    return preset("quick" if a.quick else "full", **changes)


def write_outputs(study) -> Path:
    from .analysis import Analysis
    from .figures import all_figures
    from .writeup import claims, render

    summary = Analysis(study).summary()
    if study.plan.regime:  # the search's record travels with STUDY.md (publish copies what it cites)
        shutil.copytree(REPO / study.plan.regime, study.out / "regime", dirs_exist_ok=True)
        summary["regime"] = json.loads((study.out / "regime" / "regime.json").read_text())
    summary["claims"] = claims(summary)
    (study.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    figs = all_figures(summary, study.out)
    title = f"Small-scale study ({study.plan.name}): length generalization without position encoding"
    md = study.out / "STUDY.md"
    md.write_text(render(summary, figs, title) + "\n")
    return md


def run_regime(a) -> int:
    from dataclasses import replace

    from .plan import REGIME_RECORD
    from .regime import QUICK_REGIME, Regime, RegimePlan, publish, write

    plan = QUICK_REGIME if a.quick else RegimePlan()
    if a.workers:
        plan = replace(plan, workers=a.workers)
    out = Path(a.out or ("results/regime-quick" if a.quick else "results/regime"))
    regime = Regime(plan, out, REPO, port=a.port)
    if not a.report_only:
        regime.run_all()
    md = write(regime)
    print(f"[regime] wrote {md}")
    if a.publish:
        names = publish(out, REPO / REGIME_RECORD)
        print(f"[regime] merged {len(names)} rows into {REGIME_RECORD}/regime.json: {', '.join(names)}")
    return 0


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.publish and not a.regime:
        ap.error("--publish merges a regime search's rows into docs/regime/: use it with --regime")
    if a.publish and a.quick:
        ap.error("--publish merges measured rows into the record docs/regime/; a --quick search's "
                 "rows are CI-sized and do not belong there: drop --quick")
    import os

    os.chdir(REPO)
    from .pipeline import Study

    if a.regime:
        return run_regime(a)
    if a.probe:
        from .probe import main_probe

        return main_probe(a.quick, a.out, a.probe_loss)
    plan = make_plan(a)
    out = Path(a.out or ("results/study-quick" if a.quick else "results/study"))
    study = Study(plan, out, port=a.port)
    t0 = time.perf_counter()
    timings_f = out / "timings.json"
    attempts = json.loads(timings_f.read_text()).get("attempts", []) if timings_f.exists() else []
    if not a.report_only:
        (out / "plan.json").write_text(json.dumps(plan.to_dict(), indent=1))
        # every invocation is one attempt (a resumed study skips finished steps), saved step by step
        study.run_all(lambda t: timings_f.write_text(json.dumps({"attempts": [*attempts, t]}, indent=1)))
        attempts.append(study.timings)
    study.timings = {"attempts": attempts}
    md = write_outputs(study)
    print(f"[study] wrote {md} ({time.perf_counter() - t0:.0f} s)")
    if not a.quick and not a.no_copy and not a.report_only:
        from .publish import PUBLISHED, publish

        copied, missing = publish(out, REPO / PUBLISHED)
        print(f"[study] published {REPO / PUBLISHED / 'STUDY.md'} and the {len(copied) - 1} files "
              f"it cites" + (f"; missing: {', '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
