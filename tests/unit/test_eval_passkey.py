"""Passkey: the prompt builder puts the key at the asked depth; the scorer is exact."""
import pytest

from lenext_dist.eval.data import load_tokenizer
from lenext_dist.eval.passkey import (FILLER, PREFIX, answer_text, build_prompt, greedy_generate,
                                      parse_depths, passkey_match, run_passkey)
from tiny_models import SAMPLE_TOKENIZER, tiny_llama


@pytest.fixture(scope="module")
def sp():
    return load_tokenizer(SAMPLE_TOKENIZER)


@pytest.mark.parametrize("length", [200, 512, 1000])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_key_at_depth(sp, length, depth):
    p = build_prompt(sp, length, depth, 48213)
    assert len(p.ids) <= length
    assert len(p.ids) > length - len(sp.encode(FILLER))  # as many fillers as fit
    text = sp.decode(p.ids)
    assert text.count("48213") == 2 and text.endswith("What is the pass key? The pass key is")
    n = p.fillers_before + p.fillers_after
    assert p.fillers_before == round(depth * n)
    # the key sentence starts where recorded: after the prefix and fillers_before fillers
    key_text = sp.decode(p.ids[p.key_token_start:])
    assert key_text.startswith("The pass key is 48213.")
    head, fill = len(sp.encode(PREFIX)), len(sp.encode(FILLER))
    assert p.key_token_start == head + p.fillers_before * fill
    # relative token position of the key within the filler region is the depth (to one filler)
    region = n * fill
    assert abs((p.key_token_start - head) / region - depth) <= 0.5 / n + 1e-9


def test_depth_is_rounded_not_floored(sp):
    # depth 0.7 of n fillers: round(0.7 n) differs from floor(0.7 n) whenever 0.7 n has a fractional
    # part >= 0.5; among these lengths some do (checked below, so the test keeps its teeth)
    told_apart = 0
    for length in range(200, 400, 7):
        p = build_prompt(sp, length, 0.7, 48213)
        n = p.fillers_before + p.fillers_after
        assert p.fillers_before == round(0.7 * n), (length, n)
        told_apart += round(0.7 * n) != int(0.7 * n)
    assert told_apart >= 3


def test_depth_zero_and_one_are_extremes(sp):
    p0, p1 = build_prompt(sp, 600, 0.0, 11111), build_prompt(sp, 600, 1.0, 11111)
    assert p0.fillers_before == 0 and p1.fillers_after == 0
    with pytest.raises(ValueError):
        build_prompt(sp, 20, 0.5, 11111)


def test_match():
    assert passkey_match(" 12345. Remember", 12345)
    assert passkey_match("12345", 12345)
    assert not passkey_match(" 1234", 12345)
    assert not passkey_match(" 123456", 12345)
    assert not passkey_match(" the key", 12345)
    assert not passkey_match(" 54321 12345", 12345)


def test_the_answer_ends_at_eos(sp):
    """Digits after EOS are not an answer (sp.decode drops EOS: they matched)."""
    key = sp.encode("12345")
    assert answer_text(sp, [sp.eos_id(), *key]) == "" and not passkey_match(answer_text(sp, [sp.eos_id(), *key]), 12345)
    assert passkey_match(answer_text(sp, [*key, sp.eos_id(), *sp.encode("9")]), 12345)
    assert answer_text(sp, key) == sp.decode(key)


def test_parse_depths():
    assert parse_depths("3") == [0.0, 0.5, 1.0]
    assert parse_depths("0.1,0.9") == [0.1, 0.9]
    assert len(parse_depths("10")) == 10


def test_greedy_cache_equals_recompute():
    import torch

    model = tiny_llama(vocab_size=4096, train_length=64)
    ids = torch.randint(3, 4096, (2, 30))
    a = greedy_generate(model, ids, 5)

    class NoCache(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, **kw):
            out = self.m(input_ids=input_ids)
            out.past_key_values = None
            return out

    b = greedy_generate(NoCache(model), ids, 5)
    assert a.tolist() == b.tolist()


def test_run_passkey_small(sp):
    import torch

    model = tiny_llama(vocab_size=4096, train_length=64)
    r = run_passkey(model, sp, [100, 160], [0.0, 0.7], keys=2, max_new_tokens=3, progress=False)
    assert len(r["accuracy"]) == 2 and len(r["accuracy"][0]) == 2
    # every prompt (8 < 20) is in `examples`: each cell's accuracy is its own prompts' hit rate,
    # each output is the greedy continuation of that cell's prompt and each verdict the exact match
    assert len(r["examples"]) == 8
    for li, L in enumerate([100, 160]):
        for di, dep in enumerate([0.0, 0.7]):
            ex = [e for e in r["examples"] if e["length"] == L and e["depth"] == dep]
            assert [e["key"] for e in ex] == r["keys"]
            assert r["accuracy"][li][di] == pytest.approx(sum(e["correct"] for e in ex) / 2)
            for e in ex:
                p = build_prompt(sp, L, dep, e["key"])
                new = greedy_generate(model, torch.tensor([p.ids]), 3)[0].tolist()
                assert e["output"] == sp.decode(new)
                assert e["correct"] == passkey_match(e["output"], e["key"])
            cell = r["cells"][li * 2 + di]
            assert max(cell["prompt_tokens"]) <= L
            assert cell["actual_depth"] == p.actual_depth
    assert r["mean_accuracy"] == pytest.approx(sum(map(sum, r["accuracy"])) / 4)
