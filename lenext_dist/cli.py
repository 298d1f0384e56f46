"""Prepare data, train, export, evaluate and length-extend language models with lenext_dist.

Run `lenext COMMAND --help` for a command's options. Also runs as `python -m lenext_dist`.
"""
# Developers: a subcommand is one entry of SUBCOMMANDS below (name -> (help, loader)), the one
# list of verbs (`lenext --help` prints it from there). The loader is called only when its command
# runs, so the help of the others costs no import. It returns (build_parser, run): build_parser(p)
# sets the command's own description, example and options on the subparser p, run(args) does the
# work (an int it returns is the exit status). A command whose run takes the arguments it does not
# know (training's config overrides) sets the default takes_overrides=True: they arrive as
# args.overrides. A loader may instead return a whole `main(argv, prog)`, for a command with its
# own grammar (prep: `[shard] ...` or `merge ...`); it gets the rest of the command line.
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .errors import entry_point
from .flags import Parser


def _prep():
    from .prep import cli

    return cli.prep_main


def _train():
    from .train import cli

    return cli.build_parser, cli.run


def _convert():
    from .convert import cli

    return cli.build_parser, cli.run


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
    "prep": ("prepare data: shard corpora (default), merge, tokenizer, sample, kv", _prep),
    "train": ("pretrain a GPT model, or search its per-head scales, on N ranks under DeepSpeed",
              _train),
    "convert": ("export a training checkpoint to a Hugging Face model folder (--from-hf: import one)",
                _convert),
    "eval": ("measure a model folder at several lengths (perplexity, retrieval, entropy, ...: "
             "`lenext eval --help` lists the kinds)", _eval),
    "report": ("one markdown report of the results of lenext eval", _report),
    "extend": ("length extension of a pretrained run: scale sweep, HeadScale search, export, "
               "evaluation, report", _extend),
}


EPILOG = """examples:
  lenext prep --input 'data/sample/slimpajama/chunk*/*.jsonl.zst' --format slimpajama \\
      --tokenizer data/sample/tokenizer.model --out shards/sample --name slimpajama --valid-fraction 0.02
  lenext train --nproc 2 --config configs/exp/tiny-cpu-nope.yaml
  lenext convert --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope --verify
  lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst --lengths 128,256,512
  lenext report --runs results/tiny-nope --out results/report.md
  lenext extend --base runs/tiny-cpu-nope --targets 256,512

Manual: docs/pretraining.md, docs/evaluation.md, docs/length-extension.md"""


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The `lenext` parser; only `command`'s module is imported and its options built (the others
    are listed by name and help), so `lenext --help` answers without importing torch."""
    ap = Parser(prog="lenext", description=__doc__, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND",
                            title="commands")
    for name, (help_, loader) in SUBCOMMANDS.items():
        loaded = loader() if name == command else None
        if not isinstance(loaded, tuple):  # not asked for, or its own main (run by `main` below)
            sub.add_parser(name, help=help_, add_help=False)
            continue
        build, run = loaded
        p = sub.add_parser(name, help=help_, description=help_)
        build(p)
        p.set_defaults(_run=run)
    return ap


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        loaded = SUBCOMMANDS[argv[0]][1]()
        if not isinstance(loaded, tuple):
            return loaded(argv[1:], prog=f"lenext {argv[0]}")
    ap = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    args, rest = ap.parse_known_args(argv)
    if rest and not getattr(args, "takes_overrides", False):
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "takes_overrides", False):
        args.overrides = rest
    rc = args._run(args)
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0


if __name__ == "__main__":
    sys.exit(main())
