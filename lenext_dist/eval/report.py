"""`lenext report --runs DIR... --out report.md`: one markdown report of result folders.

A result folder is what `lenext eval ... --out DIR` writes (ppl_*.json, passkey*.json, tasks*.json,
entropy*.json, scale_sweep.json, ruler*.json and their PNGs). The report has one table per kind (PPL
per length per run/protocol/scale; context use and extrapolation penalty; passkey accuracy per
length; task-format accuracy per task and length; RULER score per task and length;
attention entropy; scale-sweep fits) and embeds every PNG by a path relative to the report.

Public API: `collect`, `render`, `write_report`, `main`.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Optional, Sequence


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


def _fmt(x, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def _label(run: dict, j: dict) -> str:
    c = j.get("model", {}).get("scale_c")
    return run["name"] + (f" (c={c:g})" if c is not None else "")


def render(runs: list[dict], out_path: str, title: str = "lenext evaluation report") -> str:
    base = os.path.dirname(os.path.abspath(out_path))
    md = [f"# {title}", ""]
    md += ["Runs: " + ", ".join(f"`{r['name']}` ({r['dir']})" for r in runs), ""]

    ppl = [(r, j) for r in runs for f, j in r["results"] if j["kind"] == "ppl"]
    if ppl:
        lengths = sorted({x["length"] for _, j in ppl for x in j["results"]})
        rows = []
        for r, j in ppl:
            by = {x["length"]: x for x in j["results"]}
            rows.append([_label(r, j), j["protocol"], str(j["stride"]),
                         _fmt(j.get("train_length"))]
                        + [_fmt(by[W]["ppl"], 2) if W in by else "-" for W in lengths])
        md += ["## Perplexity", "",
               "Protocols (DESIGN section 4): `last-stride` = windows of W scoring their last S "
               "tokens; `yarn` = first window scores all, later ones their new tokens; `full` = "
               "non-overlapping windows. Scored tokens per cell are in the JSON.", ""]
        md += _table(["run", "protocol", "stride", "L"] + [f"W={W}" for W in lengths], rows)
        rows = []
        for r, j in ppl:
            for d in j.get("diagnostics", []):
                cu = d.get("context_use", {})
                by_s = {(x["s_from"], x["s_to"]): x["penalty"] for x in d.get("penalty_by_s", [])}
                pen = "; ".join(f"({a:g},{b:g}]: {p:+.3f}" for (a, b), p in by_s.items())
                rows.append([_label(r, j), str(d["length"]), _fmt(cu.get("loss_short_context")),
                             _fmt(cu.get("loss_full_context")), _fmt(cu.get("gain")),
                             _fmt(cu.get("gain_unpaired")),
                             _fmt(d.get("penalty_mean")), pen or "-"])
        if rows:
            md += ["## Context use and extrapolation penalty", "",
                   "Context use: mean loss of the targets at positions [L/2,L) with 5..8 tokens "
                   "of context vs with their full context (gain ~0: the model does not use its "
                   "context); unpaired: loss at positions [4,8) minus [L/2,L) (other tokens). "
                   "Penalty: loss with full context minus the loss "
                   "of the same token under a window of L, by s = context/L (nats).", ""]
            md += _table(["run", "W", "loss, 5-8 tokens", "loss, full", "gain", "unpaired",
                          "penalty mean",
                          "penalty by s"], rows)

    pk = [(r, j) for r in runs for f, j in r["results"] if j["kind"] == "passkey"]
    if pk:
        lengths = sorted({x for _, j in pk for x in j["lengths"]})
        rows = []
        for r, j in pk:
            by = dict(zip(j["lengths"], j["accuracy_by_length"]))
            rows.append([_label(r, j), str(len(j["depths"])), str(len(j["keys"]))]
                        + [_fmt(by.get(x), 2) for x in lengths] + [_fmt(j["mean_accuracy"], 2)])
        md += ["## Passkey retrieval", "", "Exact-match accuracy averaged over depths.", ""]
        md += _table(["run", "depths", "keys"] + [str(x) for x in lengths] + ["mean"], rows)

    tk = [(r, j) for r in runs for f, j in r["results"] if j["kind"] == "tasks"]
    if tk:
        lengths = sorted({x for _, j in tk for x in j["lengths"]})
        rows = []
        for r, j in tk:
            cell = {(c["task"], c["length"]): c for c in j["cells"]}
            for task in j["accuracy"]:
                rows.append([_label(r, j), task] + [
                    f"{_fmt(c['accuracy'], 2)} ({_fmt(c['token_accuracy'], 2)})"
                    if (c := cell.get((task, x))) else "-" for x in lengths])
                rows.append([_label(r, j), f"{task}: answer NLL"] + [
                    _fmt(c.get("answer_nll"), 3) if (c := cell.get((task, x))) else "-"
                    for x in lengths])
                rows.append([_label(r, j), f"{task}: no-retrieval baseline"] + [
                    f"{_fmt(c['baseline']['accuracy'], 2)} ({_fmt(c['baseline']['token_accuracy'], 2)})"
                    if (c := cell.get((task, x))) and "baseline" in c else "-" for x in lengths])
        md += ["## Task-format retrieval", "", "Share of fresh task documents (training formats, "
               "held-out filler) with every answer token right, by document length; in brackets "
               "the share of answer tokens right (answer tokens carry content: format pieces such "
               "as a bare `▁` are never scored). Beside each model: the answers' mean NLL (nats), "
               "and a rule that never retrieves (at every answer position, the answer symbol most "
               "frequent in the document before its answer) on the same documents: a score counts "
               "as retrieval only above it.", ""]
        md += _table(["run", "task"] + [str(x) for x in lengths], rows)

    ru = [(r, j) for r in runs for f, j in r["results"] if j["kind"] == "ruler"]
    if ru:
        lengths = sorted({x for _, j in ru for x in j["lengths"]})
        rows = []
        for r, j in ru:
            cell = {(c["task"], c["length"]): c for c in j["cells"]}
            for task in j["tasks"]:
                rows.append([_label(r, j), task] + [
                    f"{_fmt(c['score'], 2)} ({_fmt(c['baseline'], 2)})"
                    if (c := cell.get((task, x))) else "-" for x in lengths]
                    + [str(cell[task, j["lengths"][0]]["samples"])])
        md += ["## RULER (lm-eval)", "", "lm-eval's RULER tasks (prompts and scoring by its task "
               "code, our greedy decoding): the share of the answers found in the output, by "
               "length; in brackets a rule that reads no question (the prompt's last tokens as the "
               "answer), scored the same way: a score counts as retrieval only above it.", ""]
        md += _table(["run", "task"] + [str(x) for x in lengths] + ["samples"], rows)

    en = [(r, j) for r in runs for f, j in r["results"] if j["kind"] == "entropy"]
    if en:
        rows = [[_label(r, j), str(j["length"]), str(j["samples"]), _fmt(j.get("mean_at_L")),
                 _fmt(j.get("normalized_at_L")), _fmt(j["mean_at_end"]),
                 _fmt(j["normalized_at_end"])] for r, j in en]
        md += ["## Attention entropy", "", "Mean over heads and layers; normalized = H / ln i.",
               ""]
        md += _table(["run", "length", "samples", "H at L", "H/ln i at L", "H at end",
                      "H/ln i at end"], rows)

    sw = [(r, j) for r in runs for f, j in r["results"] if j["kind"] == "scale_sweep"]
    if sw:
        rows = [[_label(r, j), str(j["length"]), str(j["train_length"]),
                 f"{j['grid'][0]:g}..{j['grid'][-1]:g} ({len(j['grid'])})",
                 _fmt(j["fit"].get("a"), 4), _fmt(j["fit"].get("r2"), 4),
                 _fmt(j["best_c_mean"], 2), _fmt(j.get("best_c_beyond_L"), 2)] for r, j in sw]
        md += ["## Uniform-scale sweep", "", "Fit c(s) = 1 + a ln s over position bins past L "
               "(paper: a = 0.3010 / 0.3973).", ""]
        md += _table(["run", "N", "L", "grid", "a", "R^2", "best c (all)", "best c (>L)"], rows)

    md += ["## Figures", ""]
    for r in runs:
        for p in r["pngs"]:
            rel = os.path.relpath(os.path.abspath(p), base)
            md += [f"### {r['name']}: {os.path.basename(p)}", "", f"![{r['name']}]({rel})", ""]
    return "\n".join(md)


def write_report(runs: Sequence[str], out: str, title: Optional[str] = None) -> str:
    text = render(collect(runs), out, title or "lenext evaluation report")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text + "\n")
    return out


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    ap = parser or argparse.ArgumentParser(prog="lenext report")
    ap.description = ("Collect the results of `lenext eval` into one markdown report.\n\n"
                      "Tables of perplexity, context use and extrapolation penalty, passkey, "
                      "task-format retrieval and RULER,\nattention entropy and scale-sweep fits, by run and "
                      "length, with every plot linked.")
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
