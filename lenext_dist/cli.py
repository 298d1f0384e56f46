"""The `lenext` command: `lenext eval {ppl,passkey,tasks,entropy,scale-sweep} ...`, `lenext report ...`,
`lenext extend ...`.

Subcommands are registered in `SUBCOMMANDS` (name -> (help, build_parser, run)); others (e.g.
`extend`) add one entry. Also runs as `python -m lenext_dist ...`.
"""
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
    "eval": ("evaluate a model directory: ppl, passkey, entropy, scale-sweep", _eval),
    "report": ("one markdown report of result folders", _report),
    "extend": ("scale sweep -> HeadScale search -> export -> evaluation -> report, per target length",
               _extend),
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lenext", description=__doc__,
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
