"""The small-scale study (project issue 8): `python -m lenext_dist.study [--quick]`.

Modules: `plan` (presets, runs, evaluation cells), `jobs` (commands and worker pools on a few CPU
lanes), `pipeline` (shards -> pretrain -> export -> evaluations -> `lenext extend`), `analysis`
(summary.json; inflection points), `figures` (PNGs), `writeup` (claims and STUDY.md), `cli`.
"""
from .plan import FULL, QUICK, Cell, Run, StudyPlan, preset

__all__ = ["FULL", "QUICK", "Cell", "Run", "StudyPlan", "preset"]
