"""The regime search's logic (lenext_dist/study/regime.py): the lever overrides load into the
config they describe, and the choice follows the gates."""
import json

import pytest

from lenext_dist.config import load_config, split_cli_overrides
from lenext_dist.study.regime import (GATE_GAIN, GATE_PASSKEY, GATE_RATIO, Levers, RegimePlan,
                                      choose, passkey_length, render)

from helpers import REPO


def _cfg(lv: Levers):
    plan = RegimePlan()
    base = load_config(REPO / plan.config)
    ov = lv.overrides(base.data.blend, plan.task_prefix)
    return load_config(REPO / plan.config, split_cli_overrides(ov)), plan


@pytest.mark.parametrize("share", [0.0, 0.1, 0.3])
def test_overrides_set_task_share_keep_text_ratio_and_levers(share):
    cfg, plan = _cfg(Levers(tasks=share, bos=False, mask=True, L=64, steps=90))
    w = {b.prefix: b.weight for b in cfg.data.blend}
    assert w.get(plan.task_prefix, 0.0) == pytest.approx(share)
    assert sum(w.values()) == pytest.approx(1.0)
    text = [v for k, v in w.items() if k != plan.task_prefix]
    assert text[0] / text[1] == pytest.approx(0.483 / 0.217, rel=1e-4)  # sample-tasks.yaml's ratio
    assert (cfg.data.bos, cfg.data.document_mask) == (False, True)
    assert (cfg.model.seq_length, cfg.train.steps) == (64, 90)
    assert cfg.checkpoint.interval == 30 and 90 % cfg.checkpoint.interval == 0
    assert cfg.data.task_loss == "all"
    answers = Levers(tasks=share, task_loss="answers")
    assert _cfg(answers)[0].data.task_loss == "answers"
    assert answers.name.endswith("-answers") and not Levers(tasks=share).name.endswith("-answers")


def test_task_share_one_leaves_no_text_in_the_blend():
    cfg, plan = _cfg(Levers(tasks=1.0))  # the config refuses weight-0 entries
    assert [(b.prefix, b.weight) for b in cfg.data.blend] == [(plan.task_prefix, 1.0)]


def test_combos_vary_one_lever_each_and_skip_repeats():
    plan = RegimePlan(base=Levers(), variations=[{"tasks": 0.0}, {"L": 64}, {"tasks": 0.3}])
    combos = plan.combos()
    assert combos[0] == plan.base and len(combos) == 3  # tasks 0.3 is the base again
    for c in combos[1:]:
        changed = [k for k in ("tasks", "bos", "mask", "L", "steps", "task_loss")
                   if getattr(c, k) != getattr(plan.base, k)]
        assert len(changed) == 1
    assert len({c.name for c in combos}) == len(combos)


def test_passkey_length_is_the_shortest_multiple_holding_a_prompt():
    assert passkey_length(128) == 128 and passkey_length(64) == 128 and passkey_length(48) == 144


def _row(name, tokens, pk, gain, rope_gain):
    # the gate reads the task-format passkey; the LongLoRA one (0 here) is only shown
    m = dict(ppl=50.0, passkey=0.0, passkey_length=128, train_seconds=1.0, sources=[])
    return {"name": name, "tokens": tokens,
            "nope": {**m, "tasks": {"passkey": pk, "recall": 0.0, "repeat": 0.0}, "gain": gain},
            "rope": {**m, "tasks": {"passkey": 1.0, "recall": 0.0, "repeat": 0.0}, "gain": rope_gain}}


def test_choose_takes_the_cheapest_passing_row_else_the_closest():
    ok = GATE_PASSKEY, GATE_GAIN * 1.5, GATE_GAIN * 1.5 / GATE_RATIO
    rows = [_row("big", 10, *ok), _row("small", 5, *ok), _row("fails", 1, 0.0, 1.0, 1.0)]
    assert choose(rows)[0]["name"] == "small"
    # nothing passes: the largest worst-gate ratio wins (passkey 0.45 -> 0.5 of the gate)
    rows = [_row("a", 1, 0.0, 1.0, 1.0), _row("b", 2, GATE_PASSKEY / 2, 1.0, 1.0)]
    best, why = choose(rows)
    assert best["name"] == "b" and "closest" in why and "passkey" in why
    # gain below 0.7x RoPE's fails even with perfect passkey
    assert choose([_row("r", 1, 1.0, 0.2, 0.2 / GATE_RATIO * 1.01)])[1].find("closest") > 0
    assert "`b`" in render(rows, RegimePlan())
    assert choose([{"name": "x", "tokens": 1}])[0] is None
    # every passkey at 0 (a tie on the worst gate): the next worst gate decides
    rows = [_row("weak", 1, 0.0, 0.05, 0.2), _row("strong", 2, 0.0, 0.12, 0.19), _row("mid", 3, 0.0, 0.09, 0.2)]
    assert choose(rows)[0]["name"] == "strong"


def test_publish_merges_measured_rows_into_the_record_and_copies_their_json(tmp_path):
    from lenext_dist.study.regime import publish

    out, dest = tmp_path / "results", tmp_path / "docs"
    m = dict(ppl=50.0, gain=0.1, passkey=0.0, passkey_length=128, train_seconds=1.0,
             tasks={"passkey": 0.0})
    rows = [{"name": "a", "tokens": 1, "levers": {"tasks": 0.3, "bos": True},
             "nope": {**m, "sources": ["eval/a-nope/ppl.json"]},
             "rope": {**m, "sources": ["eval/a-rope/ppl.json"]}},
            {"name": "b", "tokens": 1, "levers": {"tasks": 0.0}}]  # not measured yet: left out
    for rel in ("eval/a-nope/ppl.json", "eval/a-rope/ppl.json"):
        (out / rel).parent.mkdir(parents=True)
        (out / rel).write_text("{}")
    (out / "regime.json").write_text(json.dumps({"plan": {"config": "c.yaml", "seed": 1}, "rows": rows}))
    dest.mkdir()
    (dest / "regime.json").write_text(json.dumps({"about": "x", "rows": [
        {"name": "a", "provenance": "by hand"}, {"name": "old", "provenance": "by hand"}]}))
    assert publish(out, dest) == ["a"]
    rec = json.loads((dest / "regime.json").read_text())
    assert [r["name"] for r in rec["rows"]] == ["old", "a"] and rec["about"] == "x"
    a = rec["rows"][1]
    assert "--regime" in a["provenance"] and a["levers"] == "tasks 0.3, bos True"
    assert (dest / "eval/a-nope/ppl.json").is_file() and (dest / "eval/a-rope/ppl.json").is_file()


def test_study_md_names_the_row_the_study_trains_when_the_records_choice_moves():
    from lenext_dist.study.writeup import _regime_md

    rec = {"about": "x", "study_row": "weak",
           "rows": [_row("weak", 1, 0.0, 0.05, 0.2), _row("strong", 2, 0.0, 0.12, 0.19)]}
    md = "\n".join(_regime_md(rec))
    assert "config is row `weak`" in md and "choice is now `strong`" in md
    md = "\n".join(_regime_md({**rec, "study_row": "strong"}))
    assert "config is that row" in md and "choice is now" not in md


def test_table_shows_answer_tokens_read_from_the_tasks_json_at_L():
    from lenext_dist.study.regime import table_lines, task_tokens

    result = {"cells": [{"task": "passkey", "length": 128, "token_accuracy": 0.42},
                        {"task": "passkey", "length": 256, "token_accuracy": 0.07},
                        {"task": "recall", "length": 128, "token_accuracy": 0.01}]}
    assert task_tokens(result, 128) == {"passkey": 0.42, "recall": 0.01}
    row = _row("a", 1, 0.0, 0.1, 0.2)
    row["nope"]["task_tokens"] = task_tokens(result, 128)
    line = table_lines([row])[-1]
    assert "| 0.42/0.01/-/- |" in line and "| -/-/-/- |" in line  # RoPE has none


def test_every_combination_is_evaluated_at_a_length_holding_every_task_document(tmp_path):
    """The L = 64 row: a passkey document needs >= 62 tokens and a cell spans 16 below its length,
    so its task documents and LongLoRA prompt are measured at 2L (a length of 64 is refused)."""
    from lenext_dist.eval.data import load_tokenizer
    from lenext_dist.eval.options import TASK_NAMES
    from lenext_dist.eval.tasks import make_documents
    from lenext_dist.prep.tasks import Toolkit
    from lenext_dist.study.regime import Regime

    sp = load_tokenizer(str(REPO / "data/sample/tokenizer.model"))
    texts = ["The quick brown fox jumps over the lazy dog near the river bank today. " * 40]
    reg = Regime(RegimePlan(), tmp_path, REPO)
    for lv in {lv.L: lv for lv in reg.plan.combos()}.values():
        jobs = reg.jobs(lv, "nope")
        at = jobs["tasks"].lengths[0]
        assert at == jobs["passkey"].lengths[0] == passkey_length(lv.L) and at % lv.L == 0
        for kind in TASK_NAMES:
            assert len(make_documents(Toolkit(sp), texts, kind, at, 2, seed=0)) == 2
    with pytest.raises(ValueError, match="too short for a passkey"):
        make_documents(Toolkit(sp), texts, "passkey", 64, 2, seed=0)


@pytest.mark.parametrize("bad", ["../secret.json", "/tmp/x.json", "eval/../../secret.json"])
def test_publish_refuses_sources_outside_the_results_and_copies_nothing(tmp_path, bad):
    from lenext_dist.errors import UserError
    from lenext_dist.study.regime import publish

    out, dest = tmp_path / "results", tmp_path / "docs"
    (out / "eval").mkdir(parents=True)
    (out / "eval/ok.json").write_text("{}")
    (tmp_path / "secret.json").write_text("{}")
    m = {"sources": ["eval/ok.json"]}
    rows = [{"name": "a", "tokens": 1, "levers": {}, "nope": m, "rope": {"sources": [bad]}}]
    (out / "regime.json").write_text(json.dumps({"plan": {"config": "c.yaml", "seed": 1}, "rows": rows}))
    with pytest.raises(UserError, match="outside .*nothing was published"):
        publish(out, dest)
    assert not dest.exists()
    rows[0]["rope"] = {"sources": ["eval/gone.json"]}
    (out / "regime.json").write_text(json.dumps({"plan": {"config": "c.yaml", "seed": 1}, "rows": rows}))
    with pytest.raises(UserError, match="gone.json, which is not there"):
        publish(out, dest)
    assert not dest.exists()


def test_quick_publish_is_refused_in_one_line(capsys):
    from lenext_dist.study.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--regime", "--quick", "--publish"])
    assert e.value.code == 2 and "drop --quick" in capsys.readouterr().err
