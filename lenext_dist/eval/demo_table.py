"""The demo's retrieval table (`python -m lenext_dist.eval.demo_table`): whole-answer accuracy of
every model and scale by length in multiples of L, beside the no-retrieval baseline on the same
documents, generated from the `lenext eval tasks` JSON of a run (never typed by hand).

`--into FILE...` replaces the part of each FILE between `<!-- demo-results:start -->` and
`<!-- demo-results:end -->` (README.md, docs/demo.md), so the pages show a fresh run's numbers and
the machine they came from (the date stays in the JSON).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
from typing import Optional, Sequence
from lenext_dist.flags import Parser

START, END = "<!-- demo-results:start -->", "<!-- demo-results:end -->"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        name = ""
    return f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _model(m: dict) -> str:
    """A row's model: its position; a stock export, which has none (no lenext attention, a
    Llama config), by its folder's name."""
    return m["config"].get("position") or m.get("position") or os.path.basename(m["path"])


def table(runs: Sequence[str]) -> str:
    results = []
    for d in runs:
        for path in sorted(glob.glob(os.path.join(d, "tasks*.json"))):
            with open(path) as f:
                results.append((path, json.load(f)))
    if not results:
        raise ValueError(f"no tasks*.json under {', '.join(runs)} (run `lenext eval tasks` first)")
    L = results[0][1]["model"]["train_length"]
    lengths = sorted({c["length"] for _, j in results for c in j["cells"]})
    head = " | ".join(f"{n // L}L" if n % L == 0 else str(n) for n in lengths)
    lines = [f"| model | task | c | {head} |", "|---|---|---|" + "---|" * len(lengths)]
    base: dict = {}
    for _, j in sorted(results, key=lambda r: (_model(r[1]["model"]), r[1]["model"]["scale_c"])):
        m = j["model"]
        for task in j["tasks"]:
            cells = {c["length"]: c for c in j["cells"] if c["task"] == task}
            lines.append(f"| {_model(m)} | {task} | "
                         f"{m['scale_c']:g} | " + " | ".join(
                             f"{cells[n]['accuracy']:.2f}" if n in cells else "-" for n in lengths)
                         + " |")
            for n, c in cells.items():
                base.setdefault((task, n), c["baseline"]["accuracy"])
    for task in results[0][1]["tasks"]:
        lines.append(f"| no retrieval (baseline) | {task} | - | " + " | ".join(
            f"{base[(task, n)]:.2f}" if (task, n) in base else "-" for n in lengths) + " |")
    docs = results[0][1]["cells"][0]["documents"]
    # the date of the run stays in its JSON (`created`): a page shows no dated line
    return "\n".join([
        f"Whole-answer accuracy (every value token right) of {docs} fresh documents per cell, "
        f"L = {L}; generated from {', '.join(sorted({os.path.dirname(p) for p, _ in results}))} "
        f"(run on {_cpu()}).", "", *lines])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = Parser(
        prog="python -m lenext_dist.eval.demo_table",
        description="Print the demo's retrieval table from `lenext eval tasks` results.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m lenext_dist.eval.demo_table --runs runs/demo/nope runs/demo/rope "
               "--into README.md docs/demo.md")
    p.add_argument("--runs", nargs="+", required=True, help="folders holding tasks*.json")
    p.add_argument("--out", help="write the table to this file")
    p.add_argument("--into", nargs="+", default=[], metavar="FILE",
                   help="replace the table between the demo-results markers of these files")
    a = p.parse_args(argv)
    try:
        text = table(a.runs)
        for path in a.into:
            with open(path) as f:
                page = f.read()
            if START not in page or END not in page:
                raise ValueError(f"{path}: no {START} ... {END} markers")
            head, rest = page.split(START, 1)
            page = head + START + "\n" + text + "\n" + END + rest.split(END, 1)[1]
            with open(path, "w") as f:
                f.write(page)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
