"""The study's claims, judged from its numbers (results.json -> summary.json -> STUDY.md).

Every threshold below is fixed here, before the runs: a verdict is `holds`, `fails`, or
`not measured` / `not testable at this scale` with the reason; never stronger than its numbers.
Spread over seeds is shown as mean (min..max).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

GAP = 0.2
"""A difference in whole-answer accuracy that counts (NoPE vs RoPE, c > 1 vs c = 1, chosen vs
final checkpoint): larger than the sampling noise of 128 documents (sd <= 0.045 per cell)."""
FIT_R2 = 0.5
"""R^2 the log fit c(s) = 1 + a ln s needs for 'the best c grows like ln s'."""
ENTROPY_RISE = 0.1
"""Rise of normalized entropy (H / ln n) from L to the longest length that counts as spreading."""


def _acc(cells: list, length: int, key: str = "accuracy") -> Optional[float]:
    return next((c.get(key) for c in cells if c["length"] == length), None)


def _rows(res: dict, checkpoint: str = "chosen", method: str = "uniform") -> list:
    return [r for r in res["rows"] if r["checkpoint"] == checkpoint and r["method"] == method]


def _uniform(res: dict, c: float, checkpoint: str = "chosen") -> Optional[list]:
    return next((r["cells"] for r in _rows(res, checkpoint) if abs(r["c"] - c) < 1e-9), None)


def _spread(xs: list) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": float(np.mean(xs)), "min": float(min(xs)), "max": float(max(xs)), "n": len(xs)}


def best_c(res: dict, length: int) -> Optional[dict]:
    """The grid's c with the highest whole-answer accuracy at `length` (ties: the lower answer
    NLL), at the chosen checkpoint."""
    cand = [(_acc(r["cells"], length), -_acc(r["cells"], length, "answer_nll"), r["c"])
            for r in _rows(res)]
    cand = [x for x in cand if x[0] is not None]
    if not cand:
        return None
    acc, neg_nll, c = max(cand)
    return {"c": c, "accuracy": acc, "answer_nll": -neg_nll}


def fit_log(points: list[tuple[float, float]]) -> dict:
    """Least squares of c - 1 = a ln s through the origin (the paper's form); R^2 of c."""
    if len(points) < 2:
        return {"a": None, "r2": None, "points": len(points)}
    x = np.array([math.log(s) for s, _ in points])
    y = np.array([c - 1 for _, c in points])
    a = float((x * y).sum() / (x * x).sum())
    ss_res = float(((y - a * x) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"a": a, "r2": 1 - ss_res / ss_tot if ss_tot > 0 else None, "points": len(points)}


def summarize(plan: dict, results: list, headscale: list) -> dict:
    L, mult = plan["L"], plan["multiples"]
    by_pos: dict = {}
    for r in results:
        by_pos.setdefault(r["model"]["position"] + ("+window" if r["model"]["overrides"] else ""),
                          []).append(r)
    nope, rope = by_pos.get("nope", []), by_pos.get("rope", [])
    claims: dict = {}

    # 1. the gate: every NoPE and RoPE seed retrieves at L (test documents, c = 1)
    at_L = {r["model"]["name"]: (_acc(_uniform(r, 1.0) or [], L) if r["rule"]["chosen"] else None)
            for r in nope + rope}
    ok = bool(at_L) and all(v is not None and v >= 0.9 for v in at_L.values())
    claims["retrieval_at_L"] = {
        "claim": "every NoPE and RoPE seed retrieves whole answers at L (>= 0.9, c = 1)",
        "verdict": "holds" if ok else "fails", "numbers": at_L}

    # 2. NoPE extends further than RoPE (c = 1, chosen checkpoints)
    ext = {}
    for k in mult[1:]:
        n = _spread([_acc(_uniform(r, 1.0) or [], k * L) for r in nope])
        ro = _spread([_acc(_uniform(r, 1.0) or [], k * L) for r in rope])
        ext[f"{k}L"] = {"nope": n, "rope": ro}
    two = ext.get("2L", {})
    holds = (two.get("nope", {}).get("min") is not None and two.get("rope", {}).get("max") is not None
             and two["nope"]["min"] - two["rope"]["max"] >= GAP)
    claims["nope_extends_further"] = {
        "claim": f"NoPE extends further than RoPE: at 2L every NoPE seed beats every RoPE seed by "
                 f">= {GAP} (c = 1)", "verdict": "holds" if holds else "fails", "numbers": ext}

    # 3. a uniform c > 1 restores NoPE past L (at the longest lengths), keeping L
    restore = {}
    for k in mult[1:]:
        gains = []
        for r in nope:
            base, best = _acc(_uniform(r, 1.0) or [], k * L), best_c(r, k * L)
            if base is not None and best is not None:
                gains.append(best["accuracy"] - base)
        restore[f"{k}L"] = _spread(gains)
    far = [f"{k}L" for k in mult[-2:] if k > 1]
    holds = bool(nope) and all(restore[f]["min"] is not None and restore[f]["min"] >= GAP for f in far)
    claims["uniform_c_restores"] = {
        "claim": f"a uniform c > 1 restores NoPE's retrieval past L: at {', '.join(far)} the best c "
                 f"of the grid gains >= {GAP} over c = 1 on every seed",
        "verdict": "holds" if holds else "fails", "numbers": restore}

    # 4. the best c grows with s and fits c(s) = 1 + a ln s
    pts, table = [], {}
    for r in nope:
        row = {}
        for k in mult:
            b = best_c(r, k * L)
            if b is not None:
                row[f"{k}L"] = b
                if k > 1 and b["accuracy"] > 0:  # a c that retrieves nothing says nothing
                    pts.append((float(k), b["c"]))
        table[r["model"]["name"]] = row
    fit = fit_log(pts)
    holds = fit["a"] is not None and fit["a"] > 0 and fit["r2"] is not None and fit["r2"] >= FIT_R2
    claims["best_c_fit"] = {
        "claim": f"the best uniform c grows with s = length / L as c(s) = 1 + a ln s (a > 0, R^2 >= "
                 f"{FIT_R2}; paper: a = 0.30-0.40 on 1B models)",
        "verdict": "holds" if holds else "fails", "numbers": {**fit, "best_c": table}}

    # 5. HeadScale vs the best uniform c at T, and the paper's two ablations
    if headscale:
        hs_rows = {}
        ref = next((r for r in nope if r["model"]["name"] == "nope-s0"), None)
        for h in headscale:
            T = h["T"]
            uni = best_c(ref, T) if ref else None
            hs_rows.setdefault(f"{h['target']}L", {})[h["variant"]] = {
                "at_T": _acc(h["cells"], T), "at_L": _acc(h["cells"], L), "init": h["init"],
                "head_scales": h["head_scales"]}
            hs_rows[f"{h['target']}L"]["best uniform"] = uni and {
                "c": uni["c"], "at_T": uni["accuracy"],
                "at_L": _acc(_uniform(ref, uni["c"]) or [], L)}
        ablation = {}
        for t, row in hs_rows.items():
            full = row.get("full", {})
            for v in ("no bound", "init 1"):
                if v in row and full:
                    diff_acc = abs((row[v]["at_T"] or 0) - (full["at_T"] or 0))
                    a, b = np.array(row[v]["head_scales"] or 0), np.array(full["head_scales"] or 0)
                    diff_m = float(np.abs(a - b).max()) if a.shape == b.shape else None
                    ablation[f"{t} {v}"] = {"accuracy_difference": diff_acc,
                                            "max_head_scale_difference": diff_m}
        wins = [row["full"]["at_T"] >= row["best uniform"]["at_T"] for row in hs_rows.values()
                if row.get("full") and row.get("best uniform")]
        claims["headscale_vs_uniform"] = {
            "claim": "HeadScale (searched on the answers at T) matches or beats the best uniform c "
                     "at T at every target", "verdict": ("holds" if wins and all(wins) else "fails"),
            "numbers": {"by_target": hs_rows, "ablations": ablation}}
    else:
        claims["headscale_vs_uniform"] = {"claim": "HeadScale vs the best uniform c at T",
                                          "verdict": "not measured", "numbers": {}}

    # 6. the checkpoint dependence: chosen vs final (NoPE, c = 1 and 1.5)
    dep = {}
    for r in nope:
        if r["rule"]["chosen"] is None:
            continue
        for c in (1.0, 1.5):
            ch, fi = _uniform(r, c, "chosen"), _uniform(r, c, "final")
            if ch and fi:
                dep[f"{r['model']['name']} c={c:g}"] = {
                    f"{k}L": {"chosen": _acc(ch, k * L), "final": _acc(fi, k * L)} for k in mult}
    moved = [abs(v["chosen"] - v["final"]) for d in dep.values() for v in d.values()
             if v["chosen"] is not None and v["final"] is not None]
    claims["checkpoint_dependence"] = {
        "claim": f"the extension picture depends on the checkpoint: some cell moves by >= {GAP} "
                 "between the chosen and the final checkpoint",
        "verdict": "holds" if moved and max(moved) >= GAP else "fails" if moved else "not measured",
        "numbers": {"max_move": max(moved) if moved else None, "cells": dep},
        **({} if moved else {"reason": "one checkpoint per model"})}

    # 7. the mechanism: past L NoPE's attention at the answer queries spreads, a larger c
    # sharpens it (entropy H / ln n, mean over layers and heads, of the queries before the answers)
    ent, ok = {}, bool(nope)
    longest = mult[-1] * L
    for r in nope:
        one = _uniform(r, 1.0) or []
        row = {f"{k}L": _acc(one, k * L, "entropy") for k in mult}
        row = {k: (v or {}).get("answers_mean") for k, v in row.items()}
        best = best_c(r, longest)
        at_best = _acc(_uniform(r, best["c"]) or [], longest, "entropy") if best else None
        row["best c at the longest"] = best and best["c"]
        row["entropy at the best c, longest"] = at_best and at_best["answers_mean"]
        ent[r["model"]["name"]] = row
        first, last = row.get(f"{mult[0]}L"), row.get(f"{mult[-1]}L")
        ok = ok and None not in (first, last, row["entropy at the best c, longest"]) \
            and last - first >= ENTROPY_RISE and row["entropy at the best c, longest"] < last
    claims["entropy_mechanism"] = {
        "claim": f"past L NoPE's attention at the answer queries spreads (H / ln n at {mult[-1]}L "
                 f">= {ENTROPY_RISE} above L, c = 1) and the best c sharpens it (lower H at "
                 f"{mult[-1]}L), on every seed", "verdict": "holds" if ok else "fails",
        "numbers": ent}
    claims["text_perplexity"] = {
        "claim": "NoPE matches RoPE's in-L perplexity on text",
        "verdict": "not testable at this scale", "numbers": {},
        "reason": "at 2-12M tokens of text NoPE's in-L PPL stays 15-30% above RoPE's and its "
                  "context gain 0.6x RoPE's (DESIGN section 9); this study is synthetic"}
    return {"plan": plan, "claims": claims, "models": {
        r["model"]["name"]: {"position": r["model"]["position"], "overrides": r["model"]["overrides"],
                             "rule": r["rule"]} for r in results}, "results": results}


# ----------------------------------------------------------------------------- STUDY.md
def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _sp(s: dict) -> str:
    if not s or s.get("mean") is None:
        return "-"
    return f"{s['mean']:.2f}" + (f" ({s['min']:.2f}..{s['max']:.2f})" if s["n"] > 1 else "")


def scored_with(summary: dict) -> str:
    """The sentence a results page says of the `lenext eval tasks` protocol that scored it
    (summary.json's tasks_protocol_version; absent: version 0, recorded from version 1 on)."""
    v = summary.get("tasks_protocol_version", 0)
    if v:
        return f"Scored with `lenext eval tasks` protocol version {v}."
    return ("Scored with `lenext eval tasks` protocol version 0: a cell's documents seeded by its "
            "place in the lists of lengths and tasks, and the no-retrieval baseline choosing among the "
            "answers drawn in the cell (a little above chance); a rerun scores with the current version.")


def render(summary: dict, intro: Optional[str] = None) -> str:
    """STUDY.md; `intro`: the paragraph under the title (what was trained and scored), by
    default nope_length's own."""
    plan, claims, results = summary["plan"], summary["claims"], summary["results"]
    L, mult = plan["L"], plan["multiples"]
    head = " | ".join(f"{k}L" for k in mult)
    md = ["# NoPE length generalization in the synthetic key-value regime", "",
          (intro or "Generated by `python -m experiments.nope_length` from summary.json (do not edit). "
          f"Documents of exactly L = {L} tokens: filler words, a needle `key K is v1..vn .` at a "
          "uniform depth, the question `key K is` and the answer (4-5 value tokens) at the end; "
          f"2 layers, hidden 64, 4 heads; {plan['steps']} steps of 64 sequences, the loss on the "
          f"answers. Scores: whole answers right (teacher forced) of {plan['docs']} test documents "
          "per cell; the checkpoint is the first with >= 0.9 at L on validation documents "
          "(pre-registered rule), the final one beside it.") + " " + scored_with(summary), "", "## Claims", "",
          "| claim | verdict |", "|---|---|"]
    for c in claims.values():
        md.append(f"| {c['claim']} | **{c['verdict']}**{' (' + c['reason'] + ')' if c.get('reason') else ''} |")
    md += ["", "## Retrieval by length (chosen checkpoint)", "",
           f"| model | checkpoint | c | {head} |", "|---|---|---|" + "---|" * len(mult)]
    base: dict = {}
    for r in results:
        for row in r["rows"]:
            if row["method"] != "uniform" or row["c"] not in (1.0, 1.5):
                continue
            md.append(f"| {r['model']['name']} | {row['checkpoint']} {row['tag']} | {row['c']:g} | "
                      + " | ".join(_f(_acc(row["cells"], k * L)) for k in mult) + " |")
            for c in row["cells"]:
                base.setdefault(c["length"], []).append(c["baseline"]["accuracy"])
    md.append("| no retrieval (baseline) | - | - | " + " | ".join(
        _f(max(base.get(k * L, [None]) or [None]) if base.get(k * L) else None) for k in mult) + " |")
    ext = claims["nope_extends_further"]["numbers"]
    md += ["", "## NoPE vs RoPE at c = 1 (mean (min..max) over seeds)", "",
           "| length | NoPE | RoPE |", "|---|---|---|"]
    md += [f"| {k} | {_sp(v['nope'])} | {_sp(v['rope'])} |" for k, v in ext.items()]
    fit = claims["best_c_fit"]["numbers"]
    md += ["", "## The best uniform c by length (NoPE)", "",
           f"Fit c(s) = 1 + a ln s: a = {_f(fit.get('a'), 3)}, R^2 = {_f(fit.get('r2'), 2)} "
           f"({fit.get('points')} points with some retrieval).", "",
           f"| model | {head} |", "|---|" + "---|" * len(mult)]
    for name, row in fit.get("best_c", {}).items():
        md.append(f"| {name} | " + " | ".join(
            f"{row[f'{k}L']['c']:g} ({row[f'{k}L']['accuracy']:.2f})" if f"{k}L" in row else "-"
            for k in mult) + " |")
    fm = [(r["model"]["name"], row) for r in results for row in r["rows"] if row["method"] == "format"]
    if fm:
        md += ["", "## Other document formats (c = 1, chosen checkpoint; trained on 4-5 values, no "
               "distractor)", "", "| model | format | 1L | 2L | baseline 1L |", "|---|---|---|---|---|"]
        md += [f"| {n} | {row['variant']} | {_f(_acc(row['cells'], L))} | "
               f"{_f(_acc(row['cells'], 2 * L))} | "
               f"{_f((_acc(row['cells'], L, 'baseline') or {}).get('accuracy'))} |" for n, row in fm]
    rx = [(r["model"]["name"], row) for r in results for row in r["rows"]
          if row["method"] not in ("uniform", "format")]
    if rx:
        md += ["", "## RoPE extensions at s x L (factor s)", "", "| model | method | s | accuracy |",
               "|---|---|---|---|"]
        md += [f"| {n} | {row['method']} | {row['factor']} | {_f(row['cells'][0]['accuracy'])} |"
               for n, row in rx]
    hs = claims["headscale_vs_uniform"]["numbers"]
    if hs:
        md += ["", "## HeadScale at T vs the best uniform c (nope-s0)", "",
               "| T | method | init | at T | at L |", "|---|---|---|---|---|"]
        for t, row in hs["by_target"].items():
            for v, x in row.items():
                if x:
                    md.append(f"| {t} | {v} | {x.get('init', x.get('c'))} | {_f(x['at_T'])} | "
                              f"{_f(x['at_L'])} |")
        md += ["", "Ablations (differences from the full search): " + "; ".join(
            f"{k}: accuracy {_f(v['accuracy_difference'])}, max |m_h| "
            f"{_f(v['max_head_scale_difference'], 3)}" for k, v in hs["ablations"].items())]
    ent = claims["entropy_mechanism"]["numbers"]
    if ent:
        md += ["", "## Attention entropy at the answer queries (NoPE, H / ln n, mean of layers and "
               "heads)", "", f"| model | {head} (c = 1) | best c at {mult[-1]}L | H there |",
               "|---|" + "---|" * len(mult) + "---|---|"]
        for name, row in ent.items():
            md.append(f"| {name} | " + " | ".join(_f(row.get(f"{k}L")) for k in mult) + " | "
                      + f"{row['best c at the longest']} | {_f(row['entropy at the best c, longest'])} |")
    dep = claims["checkpoint_dependence"]["numbers"]
    if dep.get("cells"):
        md += ["", "## Chosen vs final checkpoint (NoPE)", "",
               f"Largest move of a cell: {_f(dep.get('max_move'))}.", "",
               f"| model | {head} |", "|---|" + "---|" * len(mult)]
    for name, row in dep.get("cells", {}).items():
        md.append(f"| {name} | " + " | ".join(
            f"{_f(row[f'{k}L']['chosen'])} / {_f(row[f'{k}L']['final'])}" for k in mult) + " |")
    md += ["", "## Checkpoints chosen by the rule", "", "| model | chosen | final | scanned |",
           "|---|---|---|---|"]
    for name, m in summary["models"].items():
        md.append(f"| {name} | {m['rule']['chosen'] or 'none over the gate'} | {m['rule']['final'] or '-'} | "
                  + ", ".join(f"{s['tag'][-4:].lstrip('0')}: {s['score']:.2f}"
                              for s in m["rule"]["scanned"]) + " |")
    if summary.get("timings_s"):
        md += ["", "Timings (s): " + ", ".join(f"{k} {v:g}" for k, v in summary["timings_s"].items())]
    return "\n".join(md) + "\n"
