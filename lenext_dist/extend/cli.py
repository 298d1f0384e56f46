"""`lenext extend` flags -> `ExtendOptions` -> the workflow (lenext_dist/extend/workflow.py); the
flags are written from ExtendOptions' fields."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from lenext_dist.errors import entry_point
from lenext_dist.flags import Parser, add_flags, from_args

from .workflow import ExtendOptions


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
    p = p or Parser(prog="lenext extend")
    p.description, p.epilog = DESCRIPTION, EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_flags(p, ExtendOptions)  # every flag is a field of ExtendOptions
    return p


def run(args: argparse.Namespace) -> str:
    return from_args(ExtendOptions, args).run()


@entry_point
def main(argv=None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
