"""The ordered-copy probe (experiments/nope_length/probe.py): its sequences hold the task it claims,
the scale hook reaches every layer of the megatron model, a CI-sized run writes every cell, and its
command line parses."""
import json
from dataclasses import replace

import pytest
import torch

from experiments.nope_length.probe import QUICK_PROBE, ProbePlan, run_probe, sequences


def test_sequences_copy_the_values_after_the_key_in_order():
    plan = ProbePlan()
    key, query = plan.filler + plan.values, plan.filler + plan.values + 1
    x = sequences(plan, 200, 64, torch.Generator().manual_seed(0))
    assert x.shape == (200, 65)
    for row in x.tolist():
        assert row.count(key) == 1 and row.count(query) == 1
        k, q = row.index(key), row.index(query)
        assert q == 64 - plan.copy  # the answers are the last `copy` tokens
        assert k + plan.copy < q  # the key's values end before the query
        assert row[q + 1:] == row[k + 1:k + 1 + plan.copy]
        assert all(plan.filler <= v < plan.filler + plan.values for v in row[q + 1:])
        rest = row[:k] + row[k + 1 + plan.copy:q]
        assert all(0 <= t < plan.filler for t in rest)


def test_plan_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="loss"):
        ProbePlan(loss="text")
    with pytest.raises(ValueError, match="cannot hold"):
        ProbePlan(length=8, copy=4)


def test_quick_run_writes_every_cell(tmp_path):
    seen = []
    plan = replace(QUICK_PROBE, positions=("nope",))
    result = run_probe(plan, tmp_path, log=seen.append)
    assert [(r["position"], r["c"]) for r in result["rows"]] == [("nope", 1.0), ("nope", 1.5)]
    assert all(set(r["accuracy"]) == {"1", "2"} for r in result["rows"])
    assert json.loads((tmp_path / "probe.json").read_text())["rows"] == result["rows"]
    assert "| nope | 1.5 |" in (tmp_path / "PROBE.md").read_text()
    assert any("step 30/30" in line for line in seen)


def test_uniform_scale_changes_the_logits_and_is_restored(megatron_1rank):
    from lenext_dist.model import build_model
    from experiments.nope_length.probe import set_uniform_scale

    plan = QUICK_PROBE
    model = build_model(plan.config("nope"), device="cpu").eval()
    x = sequences(plan, 4, plan.length, torch.Generator().manual_seed(1))[:, :-1]
    pos = torch.arange(plan.length)[None].expand(4, -1)
    with torch.no_grad():
        base = model(x, pos, None)
        set_uniform_scale(model, 3.0)
        hot = model(x, pos, None)
        set_uniform_scale(model, 1.0)
        again = model(x, pos, None)
    assert not torch.allclose(base, hot)
    assert torch.equal(base, again)


def test_command_line_passes_its_flags(monkeypatch, tmp_path):
    from experiments.nope_length import probe

    seen = []
    monkeypatch.setattr(probe, "main_probe", lambda *a: seen.append(a) or 0)
    assert probe.main(["--quick", "--loss", "all", "--out", str(tmp_path)]) == 0
    assert probe.main([]) == 0
    assert seen == [(True, str(tmp_path), "all"), (False, None, "answers")]
