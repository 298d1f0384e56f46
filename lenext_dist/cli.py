"""Evaluate, compare and length-extend language models trained with lenext_dist.

  lenext eval KIND     measure a Hugging Face model folder at several lengths
                       (ppl, passkey, tasks, entropy, scale-sweep) and write JSON + plots
  lenext report        collect the results of `lenext eval` into one markdown report
  lenext extend        the whole length-extension workflow for a pretrained run: scale sweep,
                       per-head scale search per target length, export, evaluation, report

Run `lenext COMMAND --help` for a command's options. Also runs as `python -m lenext_dist`.
"""
# Developers: a subcommand is one entry of SUBCOMMANDS below (name -> (help, loader)); its module's
# build_parser sets its own description, example and options.
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .errors import entry_point


def _eval():
    from .eval import cli

    return cli.build_parser, cli.run


def _report():
    from .eval import report

    return report.build_parser, report.run


def _extend():
    from . import extend

    return extend.build_parser, extend.run


SUBCOMMANDS = {
    "eval": ("measure a model folder at several lengths: ppl, passkey, tasks, entropy, scale-sweep",
             _eval),
    "report": ("one markdown report of the results of lenext eval", _report),
    "extend": ("length extension of a pretrained run: scale sweep, HeadScale search, export, "
               "evaluation, report", _extend),
}


EPILOG = """examples:
  lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst --lengths 128,256,512
  lenext report --runs results/tiny-nope --out results/report.md
  lenext extend --base runs/tiny-cpu-nope --targets 256,512

Manual: docs/evaluation.md, docs/length-extension.md"""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lenext", description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (help_, loader) in SUBCOMMANDS.items():
        build, run = loader()
        p = sub.add_parser(name, help=help_, description=help_)
        build(p)
        p.set_defaults(_run=run)
    return ap


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    args._run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
