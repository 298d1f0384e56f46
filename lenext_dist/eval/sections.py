"""The report section of each built-in `lenext eval` kind: (pairs, label) -> markdown lines.

`pairs` are (run, result JSON) of that kind, `label(run, json)` names a row. Each job class of
eval/jobs.py names its section (`EvalJob.section`); `lenext report` (eval/report.py) renders the
section of every registered kind, so a new kind brings its own and edits nothing here.
"""
from __future__ import annotations


def fmt(x, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def ppl(pairs: list, label) -> list[str]:
    md: list[str] = []
    lengths = sorted({x["length"] for _, j in pairs for x in j["results"]})
    rows = []
    for r, j in pairs:
        by = {x["length"]: x for x in j["results"]}
        rows.append([label(r, j), j["protocol"], str(j["stride"]),
                     fmt(j.get("train_length"))]
                    + [fmt(by[W]["ppl"], 2) if W in by else "-" for W in lengths])
    md += ["## Perplexity", "",
           "Protocols (DESIGN section 4): `last-stride` = windows of W scoring their last S "
           "tokens; `yarn` = first window scores all, later ones their new tokens; `full` = "
           "non-overlapping windows. Scored tokens per cell are in the JSON.", ""]
    md += table(["run", "protocol", "stride", "L"] + [f"W={W}" for W in lengths], rows)
    rows = []
    for r, j in pairs:
        for d in j.get("diagnostics", []):
            cu = d.get("context_use", {})
            by_s = {(x["s_from"], x["s_to"]): x["penalty"] for x in d.get("penalty_by_s", [])}
            pen = "; ".join(f"({a:g},{b:g}]: {p:+.3f}" for (a, b), p in by_s.items())
            rows.append([label(r, j), str(d["length"]), fmt(cu.get("loss_short_context")),
                         fmt(cu.get("loss_full_context")), fmt(cu.get("gain")),
                         fmt(cu.get("gain_unpaired")),
                         fmt(d.get("penalty_mean")), pen or "-"])
    if rows:
        md += ["## Context use and extrapolation penalty", "",
               "Context use: mean loss of the targets at positions [L/2,L) with 5..8 tokens "
               "of context vs with their full context (gain ~0: the model does not use its "
               "context); unpaired: loss at positions [4,8) minus [L/2,L) (other tokens). "
               "Penalty: loss with full context minus the loss "
               "of the same token under a window of L, by s = context/L (nats).", ""]
        md += table(["run", "W", "loss, 5-8 tokens", "loss, full", "gain", "unpaired",
                      "penalty mean",
                      "penalty by s"], rows)
    return md


def passkey(pairs: list, label) -> list[str]:
    md: list[str] = []
    lengths = sorted({x for _, j in pairs for x in j["lengths"]})
    rows = []
    for r, j in pairs:
        by = dict(zip(j["lengths"], j["accuracy_by_length"]))
        rows.append([label(r, j), str(len(j["depths"])), str(len(j["keys"]))]
                    + [fmt(by.get(x), 2) for x in lengths] + [fmt(j["mean_accuracy"], 2)])
    md += ["## Passkey retrieval", "", "Exact-match accuracy averaged over depths.", ""]
    md += table(["run", "depths", "keys"] + [str(x) for x in lengths] + ["mean"], rows)
    return md


def tasks(pairs: list, label) -> list[str]:
    md: list[str] = []
    lengths = sorted({x for _, j in pairs for x in j["lengths"]})
    rows = []
    for r, j in pairs:
        cell = {(c["task"], c["length"]): c for c in j["cells"]}
        for task in j["accuracy"]:
            rows.append([label(r, j), task] + [
                f"{fmt(c['accuracy'], 2)} ({fmt(c['token_accuracy'], 2)})"
                if (c := cell.get((task, x))) else "-" for x in lengths])
            rows.append([label(r, j), f"{task}: answer NLL"] + [
                fmt(c.get("answer_nll"), 3) if (c := cell.get((task, x))) else "-"
                for x in lengths])
            rows.append([label(r, j), f"{task}: no-retrieval baseline"] + [
                f"{fmt(c['baseline']['accuracy'], 2)} ({fmt(c['baseline']['token_accuracy'], 2)})"
                if (c := cell.get((task, x))) and "baseline" in c else "-" for x in lengths])
    md += ["## Task-format retrieval", "", "Share of fresh task documents (training formats, "
           "held-out filler) with every answer token right, by document length; in brackets "
           "the share of answer tokens right (answer tokens carry content: format pieces such "
           "as a bare `▁` are never scored). Beside each model: the answers' mean NLL (nats), "
           "and a rule that never retrieves (at every answer position, the answer symbol most "
           "frequent in the document before its answer) on the same documents: a score counts "
           "as retrieval only above it.", ""]
    md += table(["run", "task"] + [str(x) for x in lengths], rows)
    return md


def ruler(pairs: list, label) -> list[str]:
    md: list[str] = []
    lengths = sorted({x for _, j in pairs for x in j["lengths"]})
    rows = []
    for r, j in pairs:
        cell = {(c["task"], c["length"]): c for c in j["cells"]}
        for task in j["tasks"]:
            rows.append([label(r, j), task] + [
                f"{fmt(c['score'], 2)} ({fmt(c['baseline'], 2)})"
                if (c := cell.get((task, x))) else "-" for x in lengths]
                + [str(cell[task, j["lengths"][0]]["samples"])])
    md += ["## RULER (lm-eval)", "", "lm-eval's RULER tasks (prompts and scoring by its task "
           "code, our greedy decoding): the share of the answers found in the output, by "
           "length; in brackets a rule that reads no question (the prompt's last tokens as the "
           "answer), scored the same way: a score counts as retrieval only above it.", ""]
    md += table(["run", "task"] + [str(x) for x in lengths] + ["samples"], rows)
    return md


def entropy(pairs: list, label) -> list[str]:
    md: list[str] = []
    rows = [[label(r, j), str(j["length"]), str(j["samples"]), fmt(j.get("mean_at_L")),
             fmt(j.get("normalized_at_L")), fmt(j["mean_at_end"]),
             fmt(j["normalized_at_end"])] for r, j in pairs]
    md += ["## Attention entropy", "", "Mean over heads and layers; normalized = H / ln i.",
           ""]
    md += table(["run", "length", "samples", "H at L", "H/ln i at L", "H at end",
                  "H/ln i at end"], rows)
    return md


def scale_sweep(pairs: list, label) -> list[str]:
    md: list[str] = []
    rows = [[label(r, j), str(j["length"]), str(j["train_length"]),
             f"{j['grid'][0]:g}..{j['grid'][-1]:g} ({len(j['grid'])})",
             fmt(j["fit"].get("a"), 4), fmt(j["fit"].get("r2"), 4),
             fmt(j["best_c_mean"], 2), fmt(j.get("best_c_beyond_L"), 2)] for r, j in pairs]
    md += ["## Uniform-scale sweep", "", "Fit c(s) = 1 + a ln s over position bins past L "
           "(paper: a = 0.3010 / 0.3973).", ""]
    md += table(["run", "N", "L", "grid", "a", "R^2", "best c (all)", "best c (>L)"], rows)
    return md
