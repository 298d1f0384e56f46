"""`lenext extend` flags -> `ExtendOptions` -> the workflow (lenext_dist/extend/workflow.py)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from lenext_dist.errors import entry_point
from lenext_dist.eval.options import depths, float_, ints, nonneg_int, pos_float, pos_int

from .workflow import ExtendOptions


def _min_value(s: str) -> Optional[float]:
    return None if s.lower() == "none" else float_(s)


def _init(s: str):
    return "fit" if s == "fit" else pos_float(s)


DESCRIPTION = """Extend a pretrained run to longer contexts, end to end, for each target length T.

  1. export the run's latest checkpoint                                 <out>/hf/base
  2. sweep the uniform attention scale c at the longest target; fit c(s) = 1 + a ln s
  3. per T: search per-head scales (HeadScale) at about 1.125 T, every other weight frozen,
     launched like pretraining                                          <out>/hs-T
  4. export each search                                                 <out>/hf/hs-T
  5. evaluate the run as pretrained, the best uniform c(T) and HeadScale: perplexity at
     1x..8x the training length, passkey, attention entropy             <out>/eval/
  6. one report with every table and plot and the paper's claims checked   <out>/report.md

Resumable: each step is skipped when its output exists, so rerun the same command after a kill."""

EPILOG = """example:
  lenext extend --base runs/tiny-cpu-nope --targets 256,512

Manual: docs/length-extension.md"""


def build_parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="lenext extend")
    p.description, p.epilog = DESCRIPTION, EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--base", required=True, help="pretraining run folder (config.yaml, checkpoints/)")
    p.add_argument("--targets", type=ints, required=True, help="target lengths, e.g. 256,512")
    p.add_argument("--out", default=None, help="output folder (default <base>/extend)")
    g = p.add_argument_group("HeadScale search (paper defaults)")
    g.add_argument("--steps", type=pos_int, default=200)
    g.add_argument("--lr", type=pos_float, default=0.1)
    g.add_argument("--warmup", type=nonneg_int, default=20)
    g.add_argument("--global-batch", type=pos_int, default=8)
    g.add_argument("--micro-batch", type=pos_int, default=None, help="default: global / nproc")
    g.add_argument("--overshoot", type=pos_float, default=1.125, help="L' = ceil(T x overshoot)")
    g.add_argument("--min-value", type=_min_value, default="1.0",
                   help="m_h lower bound, or 'none' (ablation)")
    g.add_argument("--init", type=_init, default="fit",
                   help="'fit' (the sweep's c(T)), or a number (ablation: 1)")
    g.add_argument("--zero-stage", type=nonneg_int, default=2)
    g.add_argument("--nproc", type=pos_int, default=2, help="ranks of the search (deepspeed --num_gpus)")
    g.add_argument("--port", type=pos_int, default=29531)
    g.add_argument("--activation-checkpointing", action="store_true")
    g = p.add_argument_group("evaluation")
    g.add_argument("--data", nargs="+", default=["data/sample/heldout/books.jsonl.zst"])
    g.add_argument("--eval-factors", type=ints, default=[1, 2, 4, 8], help="lengths = L x these")
    g.add_argument("--stride", type=pos_int, default=None, help="PPL stride (default L/2)")
    g.add_argument("--budget-tokens", type=pos_int, default=20000, help="scored tokens per PPL cell")
    g.add_argument("--c-min", type=pos_float, default=0.8)
    g.add_argument("--c-max", type=pos_float, default=2.0)
    g.add_argument("--c-step", type=pos_float, default=0.01)
    g.add_argument("--passkey-keys", type=nonneg_int, default=5, help="0 skips passkey")
    g.add_argument("--passkey-lengths", type=ints, default=None,
                   help="default: the evaluation lengths >= 128 (a prompt needs ~80 tokens plus filler)")
    g.add_argument("--passkey-depths", type=depths, default="5")
    g.add_argument("--entropy-samples", type=nonneg_int, default=4, help="0 skips entropy")
    g.add_argument("--threads", type=pos_int, default=None)
    return p


def run(args: argparse.Namespace) -> str:
    from dataclasses import fields

    return ExtendOptions(**{f.name: getattr(args, f.name) for f in fields(ExtendOptions)}).run()


@entry_point
def main(argv=None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
