"""The paper's claims, checked on measured numbers: `lenext extend`'s report closes with them
(`extend_claims`), one small function per claim.

Paper: Wang, Ji et al. 2024 ("Length generalization of causal transformers without position
encoding"), Table 2: HeadScale beats the best uniform scale at the target length and stays close to
the base model within the training length. The verdicts are words from the numbers only.
"""
from __future__ import annotations

CLOSE = 0.05
"""'Close' for PPL ratios: within 5%."""


def headscale_beats_uniform(T: int, hs: float, uniform: float) -> str:
    better = hs < uniform
    return (f"- At T = {T}: HeadScale PPL {hs:.2f} vs best uniform {uniform:.2f}: "
            f"{'HeadScale better, as the paper claims' if better else 'HeadScale NOT better (paper: better)'}.")


def headscale_close_to_base(T: int, L: int, hs: float, base: float) -> str:
    rel = hs / base - 1
    close = abs(rel) <= CLOSE
    return (f"- At L = {L} (short range), HeadScale-{T} PPL {hs:.2f} vs base {base:.2f} "
            f"({100 * rel:+.1f}%): {f'close to base (within {CLOSE:.0%})' if close else 'not close to base'}.")


def extend_claims(ppl: dict[str, dict[int, float]], targets: list[int], L: int,
                  best_c: dict) -> str:
    """`lenext extend`'s claims section. ppl: per model name (`base`, `uniform-T`,
    `headscale-T`) PPL by length (last-stride protocol)."""
    base = ppl.get("base", {})
    lines = ["## The paper's claims on this run", "",
             "Paper (Wang, Ji et al. 2024, Table 2): HeadScale beats the best uniform scale at long "
             "range and stays close to the base model at short range. Measured here (PPL, lower is "
             "better; the same protocol and budget for every cell):", "",
             "| target T | model | " + " | ".join(f"{n}" for n in sorted(base)) + " |",
             "|---|---|" + "---|" * len(base)]
    verdicts = []
    for T in targets:
        uni, hs = ppl.get(f"uniform-{T}", {}), ppl.get(f"headscale-{T}", {})
        for name, row in (("base", base), (f"uniform c = {best_c[T]}", uni), ("HeadScale", hs)):
            lines.append(f"| {T} | {name} | " + " | ".join(
                f"{row.get(n, float('nan')):.2f}" for n in sorted(base)) + " |")
        if T in hs and T in uni:
            verdicts.append(headscale_beats_uniform(T, hs[T], uni[T]))
        if L in hs and L in base:
            verdicts.append(headscale_close_to_base(T, L, hs[L], base[L]))
    lines += ["", *verdicts, "",
              "These are the measured numbers of one small run; see the context-use table above before "
              "reading them as evidence either way (a model that uses little context has little to gain).", ""]
    return "\n".join(lines)
