"""The study's verdicts from numbers: the context-use gate (worst seed), the NoPE ~ RoPE and
HeadScale gates, on hand-made summaries (the quick-study e2e test checks files, not verdicts)."""
import pytest

from lenext_dist.eval.claims import HOLDS, RETRIEVES
from lenext_dist.study.writeup import CLOSE, CTX_MIN_GAIN, GAIN, claims


def summary(nope_gains, *, L=64, ppl_nope=(10.0, 10.0), ppl_rope=(10.0, 10.0), headscale=None):
    runs = [f"nope-s{i}" for i in range(len(nope_gains))] + ["rope-s0", "rope-s1"]
    ctx = {f"nope-s{i}": {"gain": g, "source": f"ctx/nope-s{i}.json"} for i, g in enumerate(nope_gains)}
    ctx.update({f"rope-s{i}": {"gain": 0.3, "source": f"ctx/rope-s{i}.json"} for i in range(2)})

    def row(method, ppls):
        rs = {f"{method}-s{i}": {"ppl": {str(L): p, "256": 2 * p}, "source": f"ppl/{method}-s{i}.json"}
              for i, p in enumerate(ppls)}
        return {"method": method, "runs": rs, "stats": {str(L): {"mean": sum(ppls) / len(ppls),
                                                                 "n": len(ppls), "min": min(ppls),
                                                                 "max": max(ppls)}}}
    return {"L": L, "runs": runs, "context": ctx, "inflection": {}, "fit": {},
            "table": [row("nope", ppl_nope), row("rope", ppl_rope)], "headscale": headscale or {}}


def verdict(s, claim):
    return next(c["verdict"] for c in claims(s) if c["claim"].startswith(claim))


def test_context_gate_takes_the_worst_seed():
    assert CTX_MIN_GAIN == 0.10  # the numbers below straddle it
    assert verdict(summary([0.05, 0.2]), "Context use") == "NoPE does NOT use its context"
    assert verdict(summary([0.2, 0.05]), "Context use") == "NoPE does NOT use its context"
    assert verdict(summary([0.12, 0.2]), "Context use") == "NoPE uses its context"
    assert verdict(summary([0.10]), "Context use") == "NoPE uses its context"  # at the gate: passes
    assert verdict(summary([0.0999]), "Context use") == "NoPE does NOT use its context"
    assert verdict(summary([]), "Context use") == "NoPE does NOT use its context"  # no number
    # the gate's sentence rides on every later verdict of a model that does not use its context
    hs = {"nope-s0": {"512": {"ppl": {"64": 10.0, "512": 9.0}, "source": "hs.json"}}}
    assert "does not use its context" in verdict(summary([0.05, 0.2], headscale=hs), "HeadScale")
    assert "does not use its context" not in verdict(summary([0.2, 0.2], headscale=hs), "HeadScale")


def test_nope_rope_within_L_gate():
    assert verdict(summary([0.2, 0.2], ppl_nope=(10.4, 10.2)), "NoPE ~ RoPE") == "agrees"
    assert verdict(summary([0.2, 0.2], ppl_nope=(10.6, 10.2)), "NoPE ~ RoPE").startswith("inconclusive")
    assert verdict(summary([0.2, 0.2], ppl_nope=(12.0, 11.0)), "NoPE ~ RoPE") == "disagrees"
    assert CLOSE == 0.05


@pytest.mark.parametrize("ppl_L,ppl_T,expected", [
    (10.3, 9.7, "agrees"),                                  # +3% at L, -3% at T
    (10.3, 9.9, "short range kept, but no gain at T"),      # -1% at T < GAIN
    (11.0, 5.0, "disagrees"),                               # +10% at L
])
def test_headscale_gates(ppl_L, ppl_T, expected):
    assert GAIN == 0.02
    base = {"64": 10.0, "512": 10.0}
    hs = {"nope-s0": {"512": {"ppl": {"64": ppl_L, "512": ppl_T}, "source": "hs.json"}}}
    s = summary([0.2, 0.2], headscale=hs)
    for r in s["table"][0]["runs"].values():
        r["ppl"] = dict(base)
    assert verdict(s, "HeadScale").startswith(expected)


def with_tasks(s, acc, tok=None, lengths=(64, 128)):
    """acc / tok: per run, the task-format passkey accuracy by length."""
    tok = tok or acc
    s["tasks"] = {r: {"lengths": list(lengths), "accuracy": {"passkey": a},
                      "token_accuracy": {"passkey": tok[r]}, "source": f"tasks/{r}.json"}
                  for r, a in acc.items()}
    s["plan"] = {"uniform_c": [1.2]}
    return s


def test_retrieval_gate_and_the_claims_it_gates():
    assert RETRIEVES == 0.9 and HOLDS == 0.5
    good = {"nope-s0": [0.95, 0.9], "nope-s1": [0.9, 0.8], "rope-s0": [1.0, 0.1], "rope-s1": [1.0, 0.2]}
    s = with_tasks(summary([0.2, 0.2]), good)
    assert verdict(s, "Retrieval at L") == "NoPE retrieves at L"
    assert verdict(s, "NoPE's retrieval holds") == "agrees"
    # one seed below the gate: not learned, and every retrieval verdict says why it is unjudgeable
    s = with_tasks(summary([0.2, 0.2]), {**good, "nope-s1": [0.85, 0.8]})
    assert verdict(s, "Retrieval at L") == "NoPE does NOT retrieve at L"
    assert "Unjudgeable" in verdict(s, "NoPE's retrieval holds")
    s = with_tasks(summary([0.2, 0.2]), {**good, "rope-s0": [1.0, 0.7], "rope-s1": [1.0, 0.6]})
    assert verdict(s, "NoPE's retrieval holds") == "disagrees (RoPE holds too)"
    s = with_tasks(summary([0.2, 0.2]), {**good, "rope-s1": [1.0, 0.6]})
    assert verdict(s, "NoPE's retrieval holds") == "inconclusive (seeds disagree)"
    s = with_tasks(summary([0.2, 0.2]), {**good, "nope-s0": [1.0, 0.4], "nope-s1": [1.0, 0.3]})
    assert verdict(s, "NoPE's retrieval holds") == "disagrees (NoPE fails too)"
    s = with_tasks(summary([0.2, 0.2]), {**good, "nope-s0": [0.0, 0.0]})
    assert verdict(s, "NoPE's retrieval holds").startswith("inconclusive")


def test_uniform_scale_retrieval_reads_the_best_c_per_length():
    acc = {"nope-s0": [0.9, 0.1], "nope-s1": [0.9, 0.1], "rope-s0": [1, 0], "rope-s1": [1, 0]}
    tok = {**acc, "nope-s0-c1.2": [0.8, 0.6]}
    s = with_tasks(summary([0.2, 0.2]), {**acc, "nope-s0-c1.2": [0.8, 0.5]}, tok)
    assert verdict(s, "A uniform scale c > 1").startswith("agrees")  # c = 1 at L, 1.2 at 2L
    tok["nope-s0-c1.2"] = [0.95, 0.05]
    s = with_tasks(summary([0.2, 0.2]), {**acc, "nope-s0-c1.2": [0.95, 0.0]}, tok)
    assert verdict(s, "A uniform scale c > 1").startswith("disagrees")


@pytest.mark.parametrize("abl_tokens,expected", [(0.2, "agrees"), (0.6, "disagrees"),
                                                 (0.5, "inconclusive")])
def test_headscale_ablation_is_judged_on_retrieval(abl_tokens, expected):
    def side(tok):
        return {"ppl": {"512": 10.0}, "source": "p.json", "passkey": [0.0, 0.0],
                "passkey_tokens": [0.9, tok], "tasks_source": "t.json"}
    s = summary([0.2, 0.2])
    s["ablations"] = {"nope-s0-hs512-no_bound": {
        "run": "nope-s0", "method": "nope HeadScale w/o bound m_h >= 1", "target": 512,
        "ablated": side(abl_tokens), "headscale": side(0.5)}}
    assert verdict(s, "HeadScale w/o bound").startswith(expected)
