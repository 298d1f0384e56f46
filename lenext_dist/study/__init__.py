"""The small-scale study (project issue 8): `python -m lenext_dist.study [--quick]`.

Modules: `plan` (presets, runs, evaluation cells), `jobs` (commands, and a worker pool running
pickled job objects, on a few CPU lanes), `pipeline` (shards -> pretrain -> export -> typed
evaluation jobs -> `lenext extend`'s workflow), `analysis` (summary.json; inflection points),
`figures` (PNGs), `writeup` (STUDY.md; the claims are lenext_dist.eval.claims), `cli`.
"""
from .plan import FULL, QUICK, Cell, Run, StudyPlan, preset

__all__ = ["FULL", "QUICK", "Cell", "Run", "StudyPlan", "preset"]
