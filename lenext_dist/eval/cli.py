"""`lenext eval {ppl,passkey,tasks,entropy,scale-sweep}`: load a model directory, run one evaluation,
write JSON (+ PNG) into --out. Every JSON records the exact protocol, the model (path, config,
attention layout, scales) and the data (files, sha256, token counts).

Output files in --out (default results/<model dir name>):
  ppl        ppl_<protocol>[_c<C>].json, ppl_<protocol>[_c<C>].png, penalty_<...>.png
  passkey    passkey[_c<C>].json, passkey[_c<C>].png
  tasks      tasks[_c<C>].json, tasks[_c<C>].png
  entropy    entropy[_c<C>]_<N>.json, .png, .npz (full [layers, heads, N] array)
  scale-sweep  scale_sweep.json, scale_sweep.png, scale_sweep_losses.npz
([_c<C>] stands for every eval-time option given: _c<C>_w<W>_<ntk|yarn|pi><s>_t-<schedule>.)

Each subcommand's flags are the fields of its typed job in eval/jobs.py (argparse dests = field
names); `run` parses them into that job and runs it. `lenext extend` and experiments build the
jobs directly.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from lenext_dist.errors import entry_point

from .jobs import EvalError, job_from_args  # noqa: F401  (EvalError: re-exported from its old home)
from .options import (DTYPES, PROTOCOLS, ROPE_SCALINGS, TASK_NAMES, depths, ints, nonneg_int,
                      pos_float, pos_int, task_names, temperature)


def _add_common(p: argparse.ArgumentParser, data: bool = True) -> None:
    p.add_argument("--model", required=True, help="HF model directory (config.json, weights, "
                   "tokenizer.model); loaded with trust_remote_code=True")
    p.add_argument("--out", default=None, help="output folder (default results/<model name>)")
    p.add_argument("--tokenizer", default=None,
                   help="SentencePiece .model (default <model>/tokenizer.model)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--device", default=None, help="cpu / cuda / cuda:1 (default: cuda if any)")
    p.add_argument("--threads", type=pos_int, default=None, help="torch CPU threads")
    p.add_argument("--batch-size", type=pos_int, default=1, help="windows (prompts) per forward")
    p.add_argument("--scale-c", type=pos_float, default=None,
                   help="set a uniform scale lambda = c/sqrt(d) on every head before evaluating")
    p.add_argument("--window", type=pos_int, default=None,
                   help="sliding-window (local) attention of W tokens at eval time, on any variant")
    p.add_argument("--rope-scaling", default=None, choices=ROPE_SCALINGS,
                   help="RoPE extension at eval time (RoPE models), with --rope-factor")
    p.add_argument("--rope-factor", type=pos_float, default=None, help="s = target / training length")
    p.add_argument("--temperature", type=temperature, default=None, metavar="KIND[:k=v,...]",
                   help="a temperature schedule on the NoPE layers (layers=all: every layer), e.g. "
                   "log_fit:a=0.3, llama4:floor_scale=64,attn_scale=0.1, qwen_logn, uniform:c=1.5")
    p.add_argument("--train-length", type=pos_int, default=None,
                   help="training context L (default: from the model config)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    p.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None,
                   help="start every document (ppl, entropy, scale-sweep) or prompt (passkey) "
                   "with BOS; default: as the model was trained (config bos_at_document_start)")
    if data:
        p.add_argument("--data", nargs="+", required=True,
                       help=".jsonl / .jsonl.zst / .txt files, globs or folders")
        p.add_argument("--text-key", default="text", help="JSON field holding the text")
        p.add_argument("--max-docs", type=pos_int, default=None, help="use the first N documents")


DESCRIPTION = """Measure a Hugging Face model folder at one or more lengths; write JSON and plots.

  ppl          sliding-window perplexity by length, with context-use and extrapolation diagnostics
  passkey      passkey retrieval, length x depth
  tasks        retrieval in the training task formats, by length (documents right)
  entropy      attention entropy per position, head and layer
  scale-sweep  the best uniform attention scale per position, and its log fit

Every kind takes --model DIR (required), --out DIR (default results/<model name>) and the
eval-time changes --scale-c C, --window W, --rope-scaling pi|ntk|yarn with --rope-factor S,
--temperature KIND[:k=v,...]; `lenext eval KIND --help` lists all its options. Each result file records the
command, the model, the data and the protocol."""

EPILOG = """examples:
  lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst --lengths 128,256,512
  lenext eval passkey --model hf/tiny-nope --lengths 128,256,512 --scale-c 1.5

Outputs in --out: ppl_<protocol>.json/.png, passkey.json/.png, tasks.json/.png,
entropy_<N>.json/.png/.npz, scale_sweep.json/.png/.npz; an eval-time change adds a suffix
(_c1.5, _w128, _ntk4, _t-log_fit-a0.3). Manual: docs/evaluation.md"""


def _kind(sub, name: str, help_: str, description: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_, description=description, epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    ap = parser or argparse.ArgumentParser(prog="lenext eval")
    ap.description, ap.epilog = DESCRIPTION, EPILOG
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = ap.add_subparsers(dest="eval_cmd", required=True)

    p = _kind(sub, "ppl", "sliding-window perplexity at several lengths",
              "Sliding-window perplexity of --data at each of --lengths.\n\nWith context use and "
              "the extrapolation penalty past the training length.",
              "lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
              "--lengths 128,256,512,1024 --stride 64")
    _add_common(p)
    p.add_argument("--lengths", type=ints, required=True, help="e.g. 2048,4096,8192")
    p.add_argument("--stride", type=pos_int, default=256, help="S (last-stride and yarn)")
    p.add_argument("--protocol", default="last-stride", choices=PROTOCOLS)
    p.add_argument("--budget-tokens", type=pos_int, default=None,
                   help="scored tokens per length (whole windows, interleaved across documents)")
    p.add_argument("--curve-all", action="store_true",
                   help="per-position curve over all window positions, not only scored ones")
    p.add_argument("--no-penalty", action="store_true",
                   help="skip the extrapolation penalty / context-use pass (lengths >= L)")
    p.add_argument("--penalty-stride", type=pos_int, default=None,
                   help="stride of the window-L baseline (default L/4; must divide W-L)")

    p = _kind(sub, "passkey", "passkey retrieval, length x depth heatmap",
              "Passkey retrieval by prompt length and depth of the key.\n\nA 5-digit key hidden in "
              "filler, asked for at the end; greedy answers scored.",
              "lenext eval passkey --model hf/tiny-nope --lengths 128,256,512 --depths 5 --keys 10")
    _add_common(p, data=False)
    p.add_argument("--lengths", type=ints, required=True)
    p.add_argument("--depths", type=depths, default="10", help="N evenly spaced depths in [0,1], or a list")
    p.add_argument("--keys", type=pos_int, default=10, help="random 5-digit keys per cell")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--max-new-tokens", type=pos_int, default=8)

    p = _kind(sub, "tasks", "task-format retrieval (documents of every task generator) by length, "
              "filler from --data",
              "Retrieval in the formats of the training task documents, by length.\n\nFresh "
              "documents of each generator at each length, filler from the held-out --data;\na "
              "document is right when every answer token is.",
              "lenext eval tasks --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
              "--lengths 128,256,512 --tasks passkey,recall,copy --docs 32")
    _add_common(p)
    p.add_argument("--lengths", type=ints, required=True, help="document lengths, e.g. 128,256,512")
    p.add_argument("--tasks", type=task_names, default=None,
                   help=f"comma-separated, from {','.join(TASK_NAMES)} (default: all)")
    p.add_argument("--docs", type=pos_int, default=32, help="documents per (task, length)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--task-set", action="append", default=[], metavar="[TASK.]FIELD=VALUE",
                   help="a generator parameter other than the training default, as in shard.py "
                        "(e.g. kv.distractors=1, kv.values=6:8); repeatable; length is set per cell")
    p.add_argument("--entropy", action="store_true",
                   help="also the attention entropy (H / ln n, per layer and head) of the queries "
                        "that predict the answers")

    p = _kind(sub, "entropy", "per-position attention entropy per head and layer",
              "Attention entropy per position, head and layer.\n\nAveraged over windows of "
              "--length tokens, with the uniform-attention upper bound.",
              "lenext eval entropy --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
              "--length 1024 --samples 8")
    _add_common(p)
    p.add_argument("--length", type=pos_int, required=True)
    p.add_argument("--samples", type=pos_int, default=8, help="windows averaged over")
    p.add_argument("--chunk-size", type=pos_int, default=None, help="query rows per chunk "
                   "(default: from --mem-mb)")
    p.add_argument("--mem-mb", type=pos_int, default=256, help="memory for one chunk of probs")

    p = _kind(sub, "scale-sweep", "uniform-scale grid, best c per position, log fit",
              "The best uniform attention scale c per position, and its log fit.\n\nThe loss per "
              "position for each c of a grid; the fit c(s) = 1 + a ln s beyond the training length.",
              "lenext eval scale-sweep --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
              "--length 1024 --c-min 0.8 --c-max 2.0 --c-step 0.05")
    _add_common(p)
    p.add_argument("--length", type=pos_int, required=True)
    p.add_argument("--c-min", type=pos_float, default=0.8)
    p.add_argument("--c-max", type=pos_float, default=2.0)
    p.add_argument("--c-step", type=pos_float, default=0.01)
    p.add_argument("--budget-tokens", type=pos_int, default=None, help="tokens per c")
    p.add_argument("--samples", type=pos_int, default=None, help="windows per c")
    return ap


def run(args) -> list[str]:
    return job_from_args(args).run()


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
