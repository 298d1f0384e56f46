"""`lenext eval {ppl,passkey,tasks,entropy,scale-sweep,ruler}`: load a model directory, run one evaluation,
write JSON (+ PNG) into --out. Every JSON records the exact protocol, the model (path, config,
attention layout, scales) and the data (files, sha256, token counts).

Output files in --out (default results/<model dir name>):
  ppl        ppl_<protocol>[_c<C>].json, ppl_<protocol>[_c<C>].png, penalty_<...>.png
  passkey    passkey[_c<C>].json, passkey[_c<C>].png
  tasks      tasks[_c<C>].json, tasks[_c<C>].png
  entropy    entropy[_c<C>]_<N>.json, .png, .npz (full [layers, heads, N] array)
  scale-sweep  scale_sweep.json, scale_sweep.png, scale_sweep_losses.npz
  ruler      ruler[_c<C>].json
([_c<C>] stands for every eval-time option given: _c<C>_w<W>_<ntk|yarn|pi><s>_t-<schedule>.)

Each subcommand's flags are written from the fields of its typed job in eval/jobs.py (one
declaration each: name, default, check, help; argparse dests = field names); `run` parses them
into that job and runs it. `lenext extend` and experiments build the jobs directly.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from lenext_dist.errors import entry_point
from lenext_dist.flags import add_flags

from .jobs import JOBS, EvalError, job_from_args  # noqa: F401  (EvalError: re-exported from its old home)


DESCRIPTION = """Measure a Hugging Face model folder at one or more lengths; write JSON and plots.

  ppl          sliding-window perplexity by length, with context-use and extrapolation diagnostics
  passkey      passkey retrieval, length x depth
  tasks        retrieval in the training task formats, by length (documents right)
  entropy      attention entropy per position, head and layer
  scale-sweep  the best uniform attention scale per position, and its log fit
  ruler        lm-eval's offline RULER tasks by length (needs lm_eval[ruler])

Every kind takes --model DIR (required), --out DIR (default results/<model name>) and the
eval-time changes --scale-c C, --window W, --rope-scaling pi|ntk|yarn with --rope-factor S,
--temperature KIND[:k=v,...]; `lenext eval KIND --help` lists all its options. Each result file records the
command, the model, the data and the protocol."""

EPILOG = """examples:
  lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst --lengths 128,256,512
  lenext eval passkey --model hf/tiny-nope --lengths 128,256,512 --scale-c 1.5

Outputs in --out: ppl_<protocol>.json/.png, passkey.json/.png, tasks.json/.png,
entropy_<N>.json/.png/.npz, scale_sweep.json/.png/.npz, ruler.json; an eval-time change adds a suffix
(_c1.5, _w128, _ntk4, _t-log_fit-a0.3). Manual: docs/evaluation.md"""


def _kind(sub, name: str, help_: str, description: str, example: str) -> None:
    """`lenext eval <name>`: its texts here, its flags from the fields of its job."""
    p = sub.add_parser(name, help=help_, description=description, epilog=f"example:\n  {example}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, JOBS[name])


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    ap = parser or argparse.ArgumentParser(prog="lenext eval")
    ap.description, ap.epilog = DESCRIPTION, EPILOG
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = ap.add_subparsers(dest="eval_cmd", required=True)

    _kind(sub, "ppl", "sliding-window perplexity at several lengths",
          "Sliding-window perplexity of --data at each of --lengths.\n\nWith context use and "
          "the extrapolation penalty past the training length.",
          "lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
          "--lengths 128,256,512,1024 --stride 64")

    _kind(sub, "passkey", "passkey retrieval, length x depth heatmap",
          "Passkey retrieval by prompt length and depth of the key.\n\nA 5-digit key hidden in "
          "filler, asked for at the end; greedy answers scored.",
          "lenext eval passkey --model hf/tiny-nope --lengths 128,256,512 --depths 5 --keys 10")

    _kind(sub, "tasks", "task-format retrieval (documents of every task generator) by length, "
          "filler from --data",
          "Retrieval in the formats of the training task documents, by length.\n\nFresh "
          "documents of each generator at each length, filler from the held-out --data;\na "
          "document is right when every answer token is.",
          "lenext eval tasks --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
          "--lengths 128,256,512 --tasks passkey,recall,copy --docs 32")

    _kind(sub, "entropy", "per-position attention entropy per head and layer",
          "Attention entropy per position, head and layer.\n\nAveraged over windows of "
          "--length tokens, with the uniform-attention upper bound.",
          "lenext eval entropy --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
          "--length 1024 --samples 8")

    _kind(sub, "scale-sweep", "uniform-scale grid, best c per position, log fit",
          "The best uniform attention scale c per position, and its log fit.\n\nThe loss per "
          "position for each c of a grid; the fit c(s) = 1 + a ln s beyond the training length.",
          "lenext eval scale-sweep --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
          "--length 1024 --c-min 0.8 --c-max 2.0 --c-step 0.05")
    _kind(sub, "ruler", "lm-eval's offline RULER tasks by length",
          "RULER (lm-eval's ruler tasks) at each of --lengths.\n\nThe offline tasks (niah_single_1, "
          "niah_multikey_2/3, vt, cwe, fwe): prompts made and scored\nby lm-eval with the export's "
          "tokenizer, answers decoded greedily; beside each score a\nno-retrieval baseline. Tasks "
          "that download data, and lengths a task cannot fill, are refused.",
          "lenext eval ruler --model hf/tiny-nope --lengths 1024,2048 --tasks niah_single_1,vt "
          "--samples 20")
    return ap


def run(args) -> list[str]:
    return job_from_args(args).run()


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
