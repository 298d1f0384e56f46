"""Task-format retrieval (eval/tasks.py): documents of the training generators at a new length,
with real answer spans; the teacher-forced score is exact (off by one token fails)."""
import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lenext_dist.eval.data import load_tokenizer
from lenext_dist.eval.tasks import (SLACK, answer_positions, cell_seed, content_tokens, generator,
                                    make_documents, no_retrieval_baseline, run_tasks, score)
from lenext_dist.prep.tasks import Toolkit
from tiny_models import REPO, SAMPLE_TOKENIZER, save_tiny_lenext, tiny_lenext

BOOKS = f"{REPO}/data/sample/heldout/books.jsonl.zst"


@pytest.fixture(scope="module")
def sp():
    return load_tokenizer(SAMPLE_TOKENIZER)


@pytest.fixture(scope="module")
def texts(sp):
    from lenext_dist.eval.data import load_documents

    return [sp.decode(d.tokens.tolist()) for d in load_documents([BOOKS], SAMPLE_TOKENIZER).docs]


@pytest.mark.parametrize("kind", ["passkey", "recall", "repeat"])
@pytest.mark.parametrize("length", [128, 512])
def test_documents_have_the_length_and_real_answers(sp, texts, kind, length):
    docs = make_documents(generator(Toolkit(sp), kind, length), texts, 6, seed=3)
    assert len(docs) == 6
    for d in docs:
        ids = d.ids
        assert length - 2 * SLACK <= len(ids) <= length  # EOS excluded; filler ends at a word
        assert d.answers
        for src, ans, k in d.answers:
            assert src + k <= ans and ans + k <= len(ids)
            assert ids[src:src + k] == ids[ans:ans + k]  # the answer copies its source
    again = make_documents(generator(Toolkit(sp), kind, length), texts, 6, seed=3)
    assert [d.ids for d in again] == [d.ids for d in docs]
    assert [d.ids for d in make_documents(generator(Toolkit(sp), kind, length), texts, 6, seed=4)] != \
        [d.ids for d in docs]


class _Peek(torch.nn.Module):
    """A scorer's yardstick, not a model: its logit maximum at position i is the input token at
    i + shift (shift 1 = always right under teacher forcing, 0 = one token late)."""

    def __init__(self, shift, vocab=4096):
        super().__init__()
        self.shift, self.vocab = shift, vocab
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **kw):
        nxt = torch.roll(input_ids[0], -self.shift)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float()[None])


def test_score_is_exact_about_positions(sp, texts):
    doc = make_documents(generator(Toolkit(sp), "passkey", 128), texts, 1, seed=0)[0]
    pos = answer_positions(doc.ids, doc.answers, content_tokens(sp))
    right, nll = score(_Peek(1), doc.ids, pos)
    assert len(pos) > 0 and right.all() and len(nll) == len(pos)
    right, _ = score(_Peek(0), doc.ids, pos)  # one token late
    assert not right.all()


class _Emit(torch.nn.Module):
    """A rule, not a model: always predicts token `tok` (e.g. the format piece `▁`)."""

    def __init__(self, tok, vocab=4096):
        super().__init__()
        self.tok, self.vocab = tok, vocab
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **kw):
        out = torch.full_like(input_ids[0], self.tok)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(out, self.vocab).float()[None])


def test_a_model_that_emits_only_the_format_token_scores_zero(sp, texts):
    """Every passkey code of the sample tokenizer starts with a bare `▁` piece; the scorer must
    not count it (it made a rule that never retrieves look like a third of a skill)."""
    space = sp.piece_to_id("▁")
    doc = make_documents(generator(Toolkit(sp), "passkey", 128), texts, 1, seed=0)[0]
    assert any(doc.ids[a] == space for _, a, _ in doc.answers)  # the format piece is there
    res = run_tasks(_Emit(space), sp, texts, [128], ["passkey"], docs=4, progress=False)
    assert res["cells"][0]["accuracy"] == res["cells"][0]["token_accuracy"] == 0.0


def test_a_cell_scores_the_same_documents_whatever_the_lists_around_it(sp, texts):
    """A cell is seeded by its task's name and its length's value: `--lengths 256` and
    `--lengths 128,256` (or another task before it) score the same documents at 256 (by list
    index, the two runs of a study at one length were not paired)."""
    alone = run_tasks(_Peek(1), sp, texts, [256], ["recall"], docs=3, seed=5, progress=False)
    among = run_tasks(_Peek(1), sp, texts, [128, 256], ["passkey", "recall"], docs=3, seed=5,
                      progress=False)
    cell = next(c for c in among["cells"] if (c["task"], c["length"]) == ("recall", 256))
    assert cell == alone["cells"][0]
    assert among["cells"][0]["first_answers"] != among["cells"][1]["first_answers"]
    assert len({cell_seed(5, t, n) for t in ("kv", "recall") for n in (128, 256)}) == 4


def test_answer_alphabets_are_what_the_generators_draw_answers_from(sp, texts):
    tk = Toolkit(sp)
    content = content_tokens(sp)
    for kind in ("passkey", "recall", "copy", "kv"):
        gen = generator(tk, kind, 256)
        alphabet = gen.answer_alphabet()
        for d in make_documents(generator(tk, kind, 256), texts, 8, seed=2):
            assert set(answer_positions(d.ids, d.answers, content)) and all(
                d.ids[i] in alphabet for i in answer_positions(d.ids, d.answers, content))
    assert {sp.id_to_piece(i).strip("▁") for i in generator(tk, "passkey", 256).answer_alphabet()} \
        <= set("0123456789") | {str(n) for n in range(10, 10 ** 4)}
    assert len(generator(tk, "kv", 256, {"symbols": "8"}).answer_alphabet()) == 8
    assert generator(tk, "repeat", 256).answer_alphabet() is None  # real text: any token


def test_alphabets_hold_the_mid_text_pieces_of_a_tokenizer_without_dummy_prefix(texts, tmp_path):
    """Without SentencePiece's dummy prefix a word alone encodes without `▁` and after a space
    with it: an alphabet of words encoded alone missed most value tokens (kv 174 of 321)."""
    import sentencepiece as spm

    (tmp_path / "t.txt").write_text("\n".join(t.replace("\n", " ").replace(". ", ".\n") for t in texts))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "t.txt"), model_prefix=str(tmp_path / "nd"),
                                   vocab_size=2048, model_type="bpe", add_dummy_prefix=False,
                                   split_digits=True, byte_fallback=True, minloglevel=2, num_threads=1)
    nd = load_tokenizer(str(tmp_path / "nd.model"))
    tk, content = Toolkit(nd), content_tokens(nd)
    for kind in ("recall", "copy", "kv"):
        alphabet = generator(tk, kind, 256).answer_alphabet()
        for d in make_documents(generator(tk, kind, 256), texts, 8, seed=2):
            assert all(d.ids[i] in alphabet for i in answer_positions(d.ids, d.answers, content)), kind


@pytest.mark.parametrize("task_set", [[], ["kv.values=1", "kv.distractors=2"]])
def test_the_kv_baseline_is_at_chance_not_the_needle(sp, texts, task_set):
    """kv's only value symbols in the context are the needles': the alphabet token most frequent
    there was the needle's first value (token accuracy 0.28, 1 value among 2 distractors 1/3,
    where chance is 1/32). The guess comes from the alphabet, not the answers drawn in the cell
    (one document a cell: its own answer)."""
    cell = run_tasks(_Peek(1), sp, texts, [128], ["kv"], docs=96, seed=0, progress=False,
                     task_set=task_set)["cells"][0]
    assert cell["baseline"]["token_accuracy"] < 3 / 32, cell["baseline"]  # 0.02, 0.05 here
    one = [run_tasks(_Peek(1), sp, texts, [128], ["kv"], docs=1, seed=s, progress=False,
                     task_set=task_set)["cells"][0]["baseline"]["token_accuracy"] for s in range(8)]
    assert sum(one) / 8 < 3 / 32, one


def test_the_baseline_is_one_fixed_alphabet_token():
    ids = [9, 5, 7, 5, 8, 1, 5, 7]  # answer at 6, 7
    assert no_retrieval_baseline(ids, [6, 7], {5, 7}).tolist() == [True, False]
    assert no_retrieval_baseline(ids, [6, 7], {7, 8}).tolist() == [False, True]  # not 5: not one
    assert no_retrieval_baseline([7, 7, 7, 5], [3], {5, 7}).tolist() == [True]  # context unread


@pytest.mark.parametrize("bos", [False, True])
def test_run_tasks_finds_the_answers_with_and_without_bos(sp, texts, bos):
    kinds = ["passkey", "recall", "repeat"]
    res = run_tasks(_Peek(1), sp, texts, [128], kinds, docs=4, bos=bos, progress=False)
    assert [c["accuracy"] for c in res["cells"]] == [1.0, 1.0, 1.0]
    assert all(c["baseline"]["accuracy"] < 1.0 for c in res["cells"])
    # the scored span is the code itself, less its format piece (BOS shifts every index by one)
    assert re.fullmatch(r"\d{4,7}", res["cells"][0]["first_answers"][0].strip()), res["cells"][0]
    first = make_documents(generator(Toolkit(sp), "passkey", 128 - bos), texts, 4,
                           seed=cell_seed(0, "passkey", 128))[0]  # run_tasks' seed
    assert res["cells"][0]["first_answers"][0].strip() == first.segments[-1].text.rstrip(".")
    res = run_tasks(_Peek(0), sp, texts, [128], kinds, docs=4, bos=bos, progress=False)
    assert all(c["token_accuracy"] < 0.5 for c in res["cells"]), res["cells"]


def test_a_document_without_a_content_answer_is_counted_not_scored(sp):
    """A repeat span of format pieces only (`* * ,`) has no answer token to score: an empty
    answer was "all right" for the model and the baseline; now it is counted apart. Filler
    with a content word every 12 pieces: 3 of 12 documents (seed 0) repeat no word."""
    punct = " ".join(["* * * , . ; -- !"] * 80).split()
    filler = [" ".join(w if i % 12 else "word" for i, w in enumerate(punct))]
    cell = run_tasks(_Peek(0), sp, filler, [128], ["repeat"], docs=12, seed=0, progress=False)["cells"][0]
    assert (cell["documents"], cell["unscored_documents"]) == (9, 3)
    assert cell["accuracy"] == 0.0  # one token late on every scored document


def test_run_tasks_cells(sp, texts):
    model = tiny_lenext("nope", vocab_size=4096, train_length=64)
    kw = dict(docs=3, seed=1, progress=False)
    res = run_tasks(model, sp, texts, [128, 256], ["passkey", "repeat"], bos=True, **kw)
    assert [(c["task"], c["length"]) for c in res["cells"]] == [
        ("passkey", 128), ("passkey", 256), ("repeat", 128), ("repeat", 256)]
    for c in res["cells"]:
        assert c["documents"] == 3 and 0 <= c["accuracy"] <= c["token_accuracy"] + 1e-9 <= 1 + 1e-9
        assert c["tokens"][1] <= c["length"]  # BOS included
    assert res["accuracy"]["repeat"] == [c["accuracy"] for c in res["cells"][2:]]
    assert run_tasks(model, sp, texts, [128, 256], ["passkey", "repeat"], bos=True, **kw) == res


def test_cli_writes_json_and_refuses_unknown_tasks(tmp_path):
    model = save_tiny_lenext(str(tmp_path / "m"), SAMPLE_TOKENIZER, position="nope", train_length=64)
    base = [sys.executable, "-m", "lenext_dist.cli", "eval", "tasks", "--model", model, "--data",
            BOOKS, "--lengths", "128", "--docs", "2", "--out", str(tmp_path / "r"),
            "--no-progress"]
    p = subprocess.run(base + ["--tasks", "repeat", "--scale-c", "1.2"], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "r" / "tasks_c1.2.json").is_file() and (tmp_path / "r" / "tasks_c1.2.png").is_file()
    from lenext_dist.eval.report import main as report

    assert report(["--runs", str(tmp_path / "r"), "--out", str(tmp_path / "report.md")]) in (0, None)
    md = (tmp_path / "report.md").read_text()
    cell = json.loads((tmp_path / "r" / "tasks_c1.2.json").read_text())["cells"][0]
    assert "## Task-format retrieval" in md
    assert f"| repeat | {cell['accuracy']:.2f} ({cell['token_accuracy']:.2f}) |" in md
    p = subprocess.run(base + ["--tasks", "passkey,vaults"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "argument --tasks: expected tasks from passkey" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("position,options", [("nope", {}), ("rope", {}), ("alibi", {}),
                                              ("nope", {"window": 16}),
                                              ("nope", {"temperature": {"kind": "log_fit", "a": 0.3}})])
def test_right_padding_changes_no_scored_logit(position, options):
    """score() pads every document of a length to one shape (one compile of a flex kernel per
    length, not per document); a causal model's logits before the padding must not move."""
    from lenext_dist.eval.adapter import set_variant

    model = tiny_lenext(position, train_length=32)
    if options:
        set_variant(model, **options)
    ids = torch.randint(3, 4096, (1, 40), generator=torch.Generator().manual_seed(0))
    padded = torch.cat([ids, torch.full((1, 24), 2)], 1)
    with torch.inference_mode():
        a, b = model(input_ids=ids).logits, model(input_ids=padded).logits[:, :40]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # and the scorer with padding counts the same answers as without
    pos = list(range(30, 36))
    (r1, n1), (r2, n2) = score(model, ids[0].tolist(), pos), score(model, ids[0].tolist(), pos,
                                                                     pad_to=64, pad_id=2)
    assert (r1 == r2).all() and abs(n1 - n2).max() < 1e-5
    # the LM head on the scored rows only (logits_to_keep): the rows of the whole forward
    at = torch.tensor(pos)
    whole = torch.nn.functional.cross_entropy(a[0, at - 1], ids[0, at], reduction="none")
    assert abs(n1 - whole.numpy()).max() < 1e-5


def test_task_set_reaches_the_generator_and_bad_ones_are_refused(sp, texts):
    """`lenext eval tasks --task-set` parses as shard.py's (one parser) and changes the documents."""
    docs = make_documents(generator(Toolkit(sp), "kv", 256, {"distractors": "2"}), texts, 3, seed=0)
    assert all(sum(s.role == "distractor" for s in d.segments) == 6 for d in docs)  # 2 x 3 segments
    res = run_tasks(_Peek(1), sp, texts, [256], ["kv"], docs=2, progress=False,
                    task_set=["kv.distractors=2", "values=6"])
    assert res["protocol"]["params"]["kv"]["distractors"] == "2"
    assert res["cells"][0]["answer_tokens"] == 2 * 6 and res["cells"][0]["accuracy"] == 1.0
    with pytest.raises(ValueError, match="kv has no parameter 'colour'"):
        run_tasks(_Peek(1), sp, texts, [256], ["kv"], docs=2, progress=False, task_set=["kv.colour=1"])


def test_answer_entropy_is_normalized_and_falls_with_a_larger_scale(sp, texts):
    """H / ln n of the queries before the answers: in [0, 1]; a uniform scale c > 1 sharpens every
    head (its logits grow), so the entropy falls; run_tasks(entropy=True) records it per cell."""
    from lenext_dist.eval.adapter import set_uniform_scale
    from lenext_dist.eval.tasks import answer_entropy

    model = tiny_lenext("nope", vocab_size=4096, train_length=64)
    doc = make_documents(generator(Toolkit(sp), "kv", 128), texts, 1, seed=0)[0]
    pos = answer_positions(doc.ids, doc.answers, content_tokens(sp))
    base = answer_entropy(model, doc.ids, pos)
    assert base.shape == (2, 4, 2) and (base >= 0).all() and (base <= 1 + 1e-6).all()
    set_uniform_scale(model, 3.0)
    assert (answer_entropy(model, doc.ids, pos) < base - 1e-4).all()
    res = run_tasks(model, sp, texts, [128], ["kv"], docs=2, progress=False, entropy=True)
    e = res["cells"][0]["entropy"]
    assert len(e["query"]) == 2 and len(e["query"][0]) == 4 and 0 <= e["query_mean"] <= 1


@pytest.mark.parametrize("position, options", [
    ("nope", None), ("rope", None), ("alibi", None), ("kerple_log", None),
    ("nope", {"temperature": {"kind": "log_fit", "a": 0.5}}),  # a per-position query scale
    ("nope", {"window": 48}),  # a window: masks at absolute positions
    ("rope", {"chunked": 32, "layout": {"kind": "irope"}})])  # chunked RoPE layers, NoPE ones
def test_answer_entropy_scores_the_answer_rows_as_the_full_matrix_does(sp, texts, position, options):
    """answer_entropy computes only the rows of the queries before the answers (the document's
    last rows); each equals its row of the full s x s entropy (ALiBi/KERPLE's bias, a window,
    the query scale: all at absolute positions), over ln of the keys that layer's query sees
    (a window's or chunk's, not i + 1: that put a windowed head's uniform attention at ~0.7)."""
    from lenext_dist.eval.adapter import attention_layers, capture_qk, set_uniform_scale
    from lenext_dist.eval.entropy import _position_hooks, entropy_by_position
    from lenext_dist.eval.tasks import answer_entropy

    model = tiny_lenext(position, vocab_size=4096, train_length=64, attention_options=options)
    set_uniform_scale(model, 1.3)
    doc = make_documents(generator(Toolkit(sp), "kv", 256), texts, 1, seed=1)[0]
    pos = answer_positions(doc.ids, doc.answers, content_tokens(sp))
    at = torch.tensor([p - 1 for p in pos])
    layers, full = attention_layers(model), []

    def on_layer(i, q, k, m):
        qs, mod = _position_hooks(layers[i], q.shape[2], q.device)
        h = entropy_by_position(q, k, m, q_scale=qs, score_mod=mod)[0][:, at].double()
        seen = layers[i].position.mask.visible_counts(len(doc.ids))[at]
        full.append(h / torch.log(seen.double()))

    capture_qk(model, torch.tensor([doc.ids]), on_layer)
    got = answer_entropy(model, doc.ids, pos)
    want = torch.stack([torch.stack([h[:, 0], h[:, 1:].mean(1)], -1) for h in full]).numpy()
    assert got.shape == want.shape and abs(got - want).max() < 1e-6
    # right-padded to the cell's length (one shape a length, as score's), the same rows
    padded = answer_entropy(model, doc.ids, pos, pad_to=len(doc.ids) + 37, pad_id=sp.eos_id())
    assert abs(padded - want).max() < 1e-6
