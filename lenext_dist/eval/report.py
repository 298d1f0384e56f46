"""`lenext report --runs DIR... --out report.md`: one markdown report of result folders.

A result folder is what `lenext eval ... --out DIR` writes (a JSON per evaluation, with its `kind`,
and PNGs). The report has the section of every registered kind (eval/jobs.py JOBS; each job names
its section, eval/sections.py for the built-in ones: PPL per length per run/protocol/scale, context
use and extrapolation penalty, passkey, task-format and RULER accuracy by length, attention
entropy, scale-sweep fits) and embeds every PNG by a path relative to the report.

Public API: `collect`, `render`, `write_report`, `main`.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Optional, Sequence

from .jobs import JOBS
from lenext_dist.flags import Parser

MARK = "<!-- written by lenext report; a rerun replaces this file -->"
"""The report's first line: what lets `write_report` replace a previous report, and nothing else."""


def _load(path: str) -> Optional[dict]:
    """A result JSON; None for other JSON files (no `kind`). A result file that does not parse
    (truncated by a full disk or a killed copy) is an error, never silently left out."""
    from lenext_dist.errors import UserError

    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e}); it may be truncated: rerun the evaluation "
                        "that wrote it, or move it out of the folder") from None


def collect(runs: Sequence[str]) -> list[dict]:
    """[{name, dir, results: [(file, json)], pngs: [...]}] for every run folder."""
    out = []
    for d in runs:
        if not os.path.isdir(d):
            raise FileNotFoundError(f"--runs {d!r} is not a folder")
        files = sorted(glob.glob(os.path.join(d, "*.json")))
        res = [(f, j) for f in files if isinstance(j := _load(f), dict) and "kind" in j]
        if not res:  # a parent folder, a typo'd sibling: a report without it would look complete
            from lenext_dist.errors import UserError

            raise UserError(f"--runs {d!r} holds no `lenext eval` result (a *.json with a kind): "
                            "name the folders `lenext eval --out` wrote")
        run = {"name": os.path.basename(os.path.normpath(d)), "dir": d, "results": res,
               "pngs": sorted(glob.glob(os.path.join(d, "*.png")))}
        for f, j in res:
            _check(run, f, j)
        out.append(run)
    return out


def _check(run: dict, path: str, j: dict) -> None:
    """A result JSON that lacks what its kind's table reads (a hand-edited or foreign file with
    a `kind`): a UserError naming the file, not a KeyError or TypeError out of render."""
    from lenext_dist.errors import UserError

    try:
        render([{**run, "results": [(path, j)], "pngs": []}], path)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise UserError(f"{path}: not a `lenext eval` result of kind {j.get('kind')!r} "
                        f"({type(e).__name__}: {e}); rerun the evaluation that wrote it, or move "
                        "it out of the folder") from None


def _label(run: dict, j: dict) -> str:
    c = j.get("model", {}).get("scale_c")
    return run["name"] + (f" (c={c:g})" if c is not None else "")


def render(runs: list[dict], out_path: str, title: str = "lenext evaluation report") -> str:
    base = os.path.dirname(os.path.abspath(out_path))
    md = [MARK, f"# {title}", ""]
    md += ["Runs: " + ", ".join(f"`{r['name']}` ({r['dir']})" for r in runs), ""]

    for job in JOBS.values():  # each registered kind renders its own section (eval/sections.py)
        pairs = [(r, j) for r in runs for f, j in r["results"] if j["kind"] == job.result_kind]
        if pairs and job.section is not None:
            md += job.section(pairs, _label)

    md += ["## Figures", ""]
    for r in runs:
        for p in r["pngs"]:
            rel = os.path.relpath(os.path.abspath(p), base)
            md += [f"### {r['name']}: {os.path.basename(p)}", "", f"![{r['name']}]({rel})", ""]
    return "\n".join(md)


def _is_report(path: str) -> bool:
    """A previous report: MARK first, or the layout reports had before it (29 Nov 2026), which
    `lenext extend` rewrites when it resumes: '# <title>', a blank line, 'Runs: `'."""
    with open(path, "rb") as f:
        head = f.read(4096).decode("utf-8", "replace").split("\n")
    if head[0] == MARK:
        return True
    return len(head) > 2 and head[0].startswith("# ") and head[1] == "" and head[2].startswith("Runs: `")


def write_report(runs: Sequence[str], out: str, title: Optional[str] = None) -> str:
    """Write the report of `runs` to `out`; an existing `out` is replaced only if it is a
    previous report (`_is_report`), never a result JSON or a config named by mistake."""
    from lenext_dist.atomic import atomic_write
    from lenext_dist.errors import UserError

    text = render(collect(runs), out, title or "lenext evaluation report")
    try:
        if os.path.isdir(out):
            raise UserError(f"--out {out}: a folder; name the markdown file to write")
        if os.path.lexists(out) and not _is_report(out):
            raise UserError(f"--out {out}: an existing file that is not a `lenext report` report; "
                            "choose another --out, or move the file away")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        atomic_write(out, text + "\n")
    except OSError as e:  # a name too long, a file where a folder is needed, no permission
        why = ("a file where a folder is needed" if isinstance(
            e, (FileExistsError, NotADirectoryError)) else e.strerror or str(e))
        raise UserError(f"--out {out}: cannot write the report ({why}); choose another --out") from None
    return out


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    ap = parser or Parser(prog="lenext report")
    ap.description = ("Collect the results of `lenext eval` into one markdown report.\n\n"
                      "A section per kind of evaluation found (its tables by run and length), "
                      "with every plot linked.")
    ap.epilog = ("example:\n  lenext report --runs results/nope results/rope --out results/report.md\n\n"
                 "Manual: docs/evaluation.md")
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--runs", nargs="+", required=True, help="result folders of `lenext eval`")
    ap.add_argument("--out", default="report.md", help="markdown file to write")
    ap.add_argument("--title", default=None)
    return ap


def run(args) -> str:
    path = write_report(args.runs, args.out, args.title)
    print(f"wrote {path}")
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(build_parser().parse_args(argv))
    return 0
