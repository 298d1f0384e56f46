"""STUDY.md from summary.json: the claims of the paper (DESIGN section 4, "Paper figures to
reproduce in shape"), each checked on the measured numbers, with the JSON file of every number.

Verdicts are words from the numbers only: "agrees", "disagrees", "inconclusive" (a needed number
is missing, or the seeds disagree with each other), and a strength from the seed count. Everything
is gated by context use first (DESIGN section 9).
"""
from __future__ import annotations

import math
from typing import Optional

CTX_MIN_GAIN = 0.10
"""A model whose loss on the targets at positions [L/2, L) falls by less than this (nats) from 5-8
tokens of context to the full L/2+1..L does not use its context: extension results about it mean
nothing."""
CLOSE = 0.05
"""'Close' for PPL ratios: within 5%."""
GAIN = 0.02
"""HeadScale 'extends' when its PPL at the target is at least 2% below the base model's."""


def _f(x, nd=2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _st(st: Optional[dict], nd=2) -> str:
    if not st or st.get("mean") is None:
        return "-"
    if st["n"] > 1:
        return f"{st['mean']:.{nd}f} [{st['min']:.{nd}f}..{st['max']:.{nd}f}]"
    return f"{st['mean']:.{nd}f}"


def _runs(summary, pos):
    return [r for r in summary["runs"] if r.startswith(pos + "-s")]


def _row(summary, method):
    return next((r for r in summary["table"] if r["method"] == method), None)


def _strength(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}" + (" (weak: no spread)" if n < 2 else "")


def claims(summary: dict) -> list[dict]:
    L, out = summary["L"], []
    ctx, infl = summary["context"], summary["inflection"]
    nope_runs, rope_runs = _runs(summary, "nope"), _runs(summary, "rope")
    ng = [ctx[r]["gain"] for r in nope_runs if r in ctx and ctx[r]["gain"] is not None]
    rg = [ctx[r]["gain"] for r in rope_runs if r in ctx and ctx[r]["gain"] is not None]
    nope_uses = bool(ng) and min(ng) >= CTX_MIN_GAIN
    gate = ("" if nope_uses else " NoPE does not use its context here (gain < "
            f"{CTX_MIN_GAIN} nats), so this says nothing about the paper.")

    # 0. context use
    out.append({"claim": "Context use (precondition, DESIGN section 9)",
                "paper": "a model must use its context before extension can be judged",
                "measured": f"gain = loss of the targets at [L/2,L) with 5-8 tokens of context minus with "
                            f"their full context: NoPE {', '.join(_f(g, 3) for g in ng)}; "
                            f"RoPE {', '.join(_f(g, 3) for g in rg)} nats",
                "verdict": "NoPE uses its context" if nope_uses else "NoPE does NOT use its context",
                "strength": _strength(len(ng)),
                "sources": [ctx[r]["source"] for r in nope_runs + rope_runs if r in ctx]})

    # 1. NoPE ~ RoPE within L
    n, r = _row(summary, "nope"), _row(summary, "rope")
    if n and r:
        ratios = [n["runs"][a]["ppl"][str(L)] / r["runs"][b]["ppl"][str(L)]
                  for a, b in zip(sorted(n["runs"]), sorted(r["runs"]))]
        lo, hi = min(ratios), max(ratios)
        v = "agrees" if all(abs(x - 1) <= CLOSE for x in ratios) else \
            ("inconclusive (seeds disagree)" if lo <= 1 + CLOSE and hi >= 1 - CLOSE and len(ratios) > 1
             else "disagrees")
        out.append({"claim": "NoPE ~ RoPE within L",
                    "paper": "NoPE's in-L PPL is close to RoPE's (Table 2, 2K column)",
                    "measured": f"PPL(NoPE)/PPL(RoPE) at W=L: {', '.join(_f(x, 3) for x in ratios)} "
                                f"(NoPE {_st(n['stats'][str(L)])}, RoPE {_st(r['stats'][str(L)])}; "
                                f"close = within {int(CLOSE * 100)}%)",
                    "verdict": v, "strength": _strength(len(ratios)),
                    "sources": [x["source"] for x in list(n["runs"].values()) + list(r["runs"].values())]})

    # 2. zero-shot extension: NoPE ~1.2 L, RoPE ~1.1 L
    def s_of(pos, kind="loss"):
        return [infl[k][kind]["s"] if infl[k][kind]["s"] is not None else math.inf
                for k in infl if infl[k]["run"].startswith(pos + "-s") and infl[k]["scale_c"] is None
                and k == infl[k]["run"] and kind in infl[k]]
    sn, sr = s_of("nope"), s_of("rope")
    if sn and sr:
        ok = min(sn) > 1.05 * max(sr)
        v = ("agrees in order (NoPE fails later than RoPE)" if ok else
             "inconclusive (within 5% of each other)" if min(sn) >= max(sr) / 1.05 else
             "disagrees (NoPE fails earlier than RoPE)") + gate + \
            " Raw per-position curves carry the text's own per-position effects (the same windows for every model); the penalty table is the cleaner read."
        out.append({"claim": "NoPE extends ~20% past L zero-shot, RoPE ~10%",
                    "paper": "loss inflection at s ~ 1.2 (NoPE) vs ~ 1.1 (RoPE)",
                    "measured": f"s*_loss NoPE {', '.join(_f(x) for x in sn)}; RoPE {', '.join(_f(x) for x in sr)} "
                                "(inf = no rise within 8L)",
                    "verdict": v, "strength": _strength(min(len(sn), len(sr))),
                    "sources": [infl[k]["loss"]["source"] for k in infl if "loss" in infl[k] and k == infl[k]["run"]]})

    # 3. entropy inflection coincides with loss inflection
    pairs = [(k, v["loss"]["s"], v["entropy"]["s"]) for k, v in infl.items() if "loss" in v and "entropy" in v]
    if pairs:
        def co(a, b):
            if a is None and b is None:
                return True
            if a is None or b is None:
                return False
            return max(a, b) / min(a, b) <= 1.25
        hits = [co(a, b) for _, a, b in pairs]
        both = [(k, a, b) for k, a, b in pairs if a is not None or b is not None]
        v = ("agrees" if all(hits) else "partly" if any(hits) else "disagrees") if both else \
            "inconclusive (no inflection of either curve within 8L)"
        rs = [f"{k}: r={_f(infl[k].get('r_loss_entropy_past_L'))}" for k, _, _ in pairs]
        out.append({"claim": "The entropy inflection coincides with the PPL inflection",
                    "paper": "Figure 1: attention entropy shoots up where PPL does",
                    "measured": "; ".join(f"{k}: s*_loss {_f(a)}, s*_ent {_f(b)}" for k, a, b in pairs)
                                + f" (coincide: ratio <= 1.25). Correlation past L: {'; '.join(rs)}",
                    "verdict": v + gate, "strength": f"{len(pairs)} curves",
                    "sources": [infl[k]["entropy"]["source"] for k, _, _ in pairs]})

    # 4. uniform scale moves both
    sc = sorted([(v["scale_c"] or 1.0, v) for k, v in infl.items()
                 if v["run"] == (nope_runs[0] if nope_runs else None) and "log scale" not in v["method"]],
                key=lambda t: t[0])
    if len(sc) > 1:
        def sval(v, kind):
            x = v.get(kind, {}).get("s")
            return math.inf if x is None else x
        desc = "; ".join(f"c={c:g}: s*_loss {_f(sval(v, 'loss'))}, s*_ent {_f(sval(v, 'entropy'))}" for c, v in sc)
        ls = [sval(v, "loss") for _, v in sc]
        es = [sval(v, "entropy") for _, v in sc]
        mono = lambda xs: all(b >= a for a, b in zip(xs, xs[1:])) and xs[-1] > xs[0]
        v = ("agrees (both move later as c grows)" if mono(ls) and mono(es) else
             "partly (one curve moves)" if mono(ls) or mono(es) else "disagrees (neither moves later)")
        out.append({"claim": "A uniform scale moves both inflections",
                    "paper": "larger c delays both the PPL and the entropy inflection",
                    "measured": desc, "verdict": v + gate, "strength": "1 seed",
                    "sources": [x["loss"]["source"] for _, x in sc if "loss" in x]})

    # 5. fitted a
    fits = summary["fit"]
    if fits:
        a = [f["a"] for f in fits.values() if f.get("a") is not None]
        r2 = [f["r2"] for f in fits.values() if f.get("r2") is not None]
        v = ("agrees (a in 0.30-0.40)" if a and all(0.3 <= x <= 0.4 for x in a) else
             "disagrees" if a else "inconclusive (no fit)") + gate
        out.append({"claim": "Fitted c(s) = 1 + a ln s",
                    "paper": "a = 0.30 (R^2 0.995) at 10K steps, 0.40 (R^2 0.977) at 50K steps",
                    "measured": f"a = {', '.join(_f(x, 3) for x in a)}; R^2 = {', '.join(_f(x, 3) for x in r2)}",
                    "verdict": v, "strength": _strength(len(a)),
                    "sources": [f["source"] for f in fits.values()]})

    # 6. HeadScale
    for run, hs in summary["headscale"].items():
        base = _row(summary, "nope")
        if base is None or run not in base["runs"]:
            continue
        b = base["runs"][run]["ppl"]
        for T, h in hs.items():
            if not h.get("ppl"):
                continue
            rel = h["ppl"][str(L)] / b[str(L)] - 1
            better_uni = h["ppl"].get(T, math.inf) < (h.get("uniform_ppl") or {}).get(T, math.inf)
            gain_T = 1 - h["ppl"].get(T, math.inf) / b.get(T, math.inf)
            v = ("agrees" if abs(rel) <= CLOSE and gain_T >= GAIN else
                 "short range kept, but no gain at T (< 2%)" if abs(rel) <= CLOSE else "disagrees") + gate
            out.append({"claim": f"HeadScale keeps short-range PPL close while extending ({run}, T={T})",
                        "paper": "Table 2: HeadScale near the base at 2K and far better at the target",
                        "measured": f"PPL at L {_f(h['ppl'][str(L)])} vs base {_f(b[str(L)])} ({100 * rel:+.1f}%); "
                                    f"at T {_f(h['ppl'].get(T))} vs base {_f(b.get(T))} ({-100 * gain_T:+.1f}%) and uniform "
                                    f"c={_f(h.get('uniform_c'), 3)} {_f((h.get('uniform_ppl') or {}).get(T))} "
                                    f"({'better' if better_uni else 'not better'} than uniform)",
                        "verdict": v, "strength": "1 seed",
                        "sources": [h["source"], base["runs"][run]["source"]] +
                                   ([h["uniform_source"]] if h.get("uniform_source") else [])})
    return out


def _table_md(summary: dict) -> list[str]:
    Ws = summary["lengths"]
    md = ["| method | " + " | ".join(f"W={W}" for W in Ws) + " | JSON |",
          "|---|" + "---|" * (len(Ws) + 1)]
    for r in summary["table"]:
        srcs = ", ".join(f"`{x['source']}`" for x in r["runs"].values())
        md.append(f"| {r['method']} | " + " | ".join(_st(r["stats"].get(str(W))) for W in Ws) + f" | {srcs} |")
    md += ["", "Matched: each length T with its own extension factor s = T/L (at L the base model):", "",
           "| method | " + " | ".join(f"W={W}" for W in Ws) + " |", "|---|" + "---|" * len(Ws)]
    for m in summary["matched"]:
        md.append(f"| {m['method']} | " + " | ".join(_st(m["cols"].get(str(W))) for W in Ws) + " |")
    return md + [""]


def render(summary: dict, figures: dict, title: str) -> str:
    L = summary["L"]
    p = summary["plan"]
    md = [f"# {title}", "",
          "Generated by `python -m lenext_dist.study` from `summary.json` (every number below names the "
          "JSON file it came from, relative to this folder). Small-scale evidence: read the context-use "
          "line first.", "",
          f"Setup: config `{p['config']}`, L = {L}, evaluation lengths {summary['lengths']}, seeds {p['seeds']}; "
          f"runs {', '.join(summary['runs'])}; held-out data {p['data']}. PPL protocol: last-stride, "
          f"stride L/2, {p['budget_tokens']} scored tokens per cell.", ""]
    for n in summary["notes"]:
        md.append(f"- Note: {n}")
    md += ["", "## Claims, one by one", "", "| claim | paper | measured here | verdict | strength | JSON |",
           "|---|---|---|---|---|---|"]
    for c in summary["claims"]:
        md.append(f"| {c['claim']} | {c['paper']} | {c['measured']} | **{c['verdict']}** | {c['strength']} | "
                  + ", ".join(f"`{s}`" for s in c["sources"][:4]) + (" ..." if len(c["sources"]) > 4 else "") + " |")
    md += ["", "## Training", "", "| run | tokens | final train loss | valid loss | tokens/s (median) | JSON |",
           "|---|---|---|---|---|---|"]
    for r, t in summary["training"].items():
        md.append(f"| {r} | {t['tokens']} | {_f(t['final_loss'], 3)} | {_f(t['valid_loss'], 3)} | "
                  f"{_f(t['tokens_per_s_median'], 0)} | `{t['source']}` |")
    md += ["", "## Table 2 analogue: PPL per evaluation length", "",
           "Mean over seeds, [min..max] when more than one; figure `table2_ppl.png`.", ""]
    md += _table_md(summary)
    md += ["## Context use and extrapolation penalty (DESIGN section 4)", "",
           "Context use: the targets at positions [L/2, L) scored with 5-8 tokens of context and with "
           "their full context (same tokens); unpaired = loss at positions [4, 8) minus [L/2, L) "
           "(other tokens, kept for comparison).", "",
           "| run | loss, 5-8 tokens | loss, full context | gain | unpaired | penalty mean per W | JSON |",
           "|---|---|---|---|---|---|---|"]
    for r, c in summary["context"].items():
        pen = ", ".join(f"{W}: {_f(v, 3)}" for W, v in c["penalty_mean"].items())
        md.append(f"| {r} | {_f(c['loss_short_context'], 3)} | {_f(c['loss_full_context'], 3)} | "
                  f"{_f(c['gain'], 3)} | {_f(c['gain_unpaired'], 3)} | "
                  f"{pen} | `{c['source']}` |")
    md += ["", "## Figure 1 analogue: loss and entropy against position", "",
           "![fig1](fig1_loss_entropy.png)", "", "Inflection points (definitions below):", "",
           "| curve | s*_loss | s*_entropy | r(loss, entropy) past L | JSON |", "|---|---|---|---|---|"]
    for k, v in summary["inflection"].items():
        md.append(f"| {k} | {_f(v.get('loss', {}).get('s'))} | {_f(v.get('entropy', {}).get('s'))} | "
                  f"{_f(v.get('r_loss_entropy_past_L'))} | "
                  + ", ".join(f"`{v[x]['source']}`" for x in ("loss", "entropy") if x in v) + " |")
    md += ["", "## Uniform-scale fit c(s) = 1 + a ln s", "", "![fit](scale_fit.png)", "",
           "| run | a | R^2 | points | best c (all) | best c (> L) | JSON |", "|---|---|---|---|---|---|---|"]
    for r, f in summary["fit"].items():
        md.append(f"| {r} | {_f(f.get('a'), 4)} | {_f(f.get('r2'), 4)} | {f.get('n_points')} | "
                  f"{_f(f.get('best_c_mean'))} | {_f(f.get('best_c_beyond_L'))} | `{f['source']}` |")
    md += ["", "## Passkey retrieval", "", "![passkey](passkey.png)", "",
           "| model | mean | by length | JSON |", "|---|---|---|---|"]
    for k, v in summary["passkey"].items():
        md.append(f"| {k} | {_f(v['mean'])} | " + ", ".join(f"{n}: {_f(a)}" for n, a in zip(v["lengths"], v["by_length"]))
                  + f" | `{v['source']}` |")
    if summary["passkey"] and not any(v["mean"] for v in summary["passkey"].values()):
        md += ["", "Every accuracy is 0: no model here retrieves a passkey at any tested length "
               f"({', '.join(map(str, next(iter(summary['passkey'].values()))['lengths']))} tokens), "
               "so this section cannot separate the methods; the skill is not learned at this scale."]
    md += ["", "## HeadScale (`lenext extend`)", ""]
    for run, hs in summary["headscale"].items():
        for T, h in hs.items():
            m = h.get("m_h") or {}
            c0 = h.get("uniform_c")
            lifted = (" (below 1: the m_h >= 1 constraint starts every head at 1)"
                      if c0 is not None and c0 < 1 else "")
            md.append(f"- {run}, T = {T}: m_h min {_f(m.get('min'), 3)} mean {_f(m.get('mean'), 3)} max "
                      f"{_f(m.get('max'), 3)}; init c(T) = {_f(c0, 3)}{lifted}; scales "
                      f"`{h.get('head_scales_source', '-')}`; full report `extend/{run}/report.md`.")
    md += ["", "## Definitions", "", "```", summary["definitions"]["text"].strip(), "```", "",
           f"Context use gate: gain < {CTX_MIN_GAIN} nats means the model does not use its context. "
           f"'Close' = within {int(CLOSE * 100)}%.", "",
           "## Timings", "", "```", _timings(summary["timings"]), "```", ""]
    return "\n".join(md)


def _timings(t: dict) -> str:
    import json

    return json.dumps(t, indent=1)
