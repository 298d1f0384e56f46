"""`lenext eval KIND`: load a model directory, run one evaluation, write JSON (+ PNG) into --out.
Every JSON records the exact protocol, the model (path, config, attention layout, scales) and the
data (files, sha256, token counts).

The kinds are the registered jobs of eval/jobs.py (JOBS): each subcommand's texts come from its job
class and its flags from the job's fields (one declaration each: name, default, check, help;
argparse dests = field names); `run` parses them into that job and runs it. The job names its
result files (`result_path`; eval-time options add a suffix such as _c1.5_w64_ntk4_t-log_fit-a0.3).
`lenext extend` and experiments build the jobs directly.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from lenext_dist.errors import entry_point
from lenext_dist.flags import Parser, add_flags

from .jobs import JOBS, job_from_args


DESCRIPTION = """Measure a Hugging Face model folder at one or more lengths; write JSON and plots.

{kinds}

Every kind takes --model DIR (required), --out DIR (default results/<model name>) and the
eval-time changes --scale-c C, --window W, --rope-scaling pi|ntk|yarn with --rope-factor S,
--temperature KIND[:k=v,...]; `lenext eval KIND --help` lists all its options. Each result file records the
command, the model, the data and the protocol; a result made with other options is never overwritten."""

EPILOG = """examples:
  lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst --lengths 128,256,512
  lenext eval passkey --model hf/tiny-nope --lengths 128,256,512 --scale-c 1.5

Outputs in --out: <kind>[...].json and .png (ppl_<protocol>.json, entropy_<N>.json/.npz,
scale_sweep.json/.npz, ...); an eval-time change adds a suffix (_c1.5, _w128, _ntk4,
_t-log_fit-a0.3). Manual: docs/evaluation.md"""


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """`lenext eval KIND` for every registered kind (eval/jobs.py JOBS): its texts from the job
    class, its flags from the job's fields."""
    ap = parser or Parser(prog="lenext eval")
    ap.description = DESCRIPTION.format(kinds="\n".join(f"  {k:<12} {j.help}" for k, j in JOBS.items()))
    ap.epilog, ap.formatter_class = EPILOG, argparse.RawDescriptionHelpFormatter
    sub = ap.add_subparsers(dest="eval_cmd", required=True)
    for kind, job in JOBS.items():
        p = sub.add_parser(kind, help=job.help, description=job.description,
                           epilog=f"example:\n  {job.example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_flags(p, job)
    return ap


def run(args) -> list[str]:
    return job_from_args(args).run()


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
