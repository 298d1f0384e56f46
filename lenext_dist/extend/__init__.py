"""`lenext extend`: the paper's length-extension workflow for one pretrained run.

    lenext extend --base runs/tiny-cpu-nope --targets 256,512

For a base run (its folder holds config.yaml and checkpoints/) and target lengths T:
  1. export the base checkpoint to HF                                   out/hf/base
  2. uniform-scale sweep at the longest target; fit c(s) = 1 + a ln s  out/eval/sweep
  3. per T: HeadScale search at L' = ceil(T x overshoot) (paper: 18K for 16K), m_h initialized
     at the fitted c(T/L), everything else frozen, launched like pretraining   out/hs-T
  4. export each search                                                 out/hf/hs-T
  5. evaluate the base (as pretrained), best uniform c(T) and HeadScale: PPL at 1x..8x L, passkey, entropy
  6. one report with the tables, plots and the paper's claims checked   out/report.md
Every step is skipped when its output exists (rerun after a kill to continue; the search itself
resumes from its latest checkpoint), so the whole workflow is resumable.

Modules: `cli` (flags -> `ExtendOptions`), `workflow` (the steps above; evaluations are typed jobs of
lenext_dist.eval.jobs run in process), `search` (the search's validated RunConfig and its launch);
the claims of step 6 are checked in lenext_dist.eval.claims.
"""
from .cli import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
