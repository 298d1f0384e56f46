"""Generated task documents (--format tasks): what each generator writes, through the real shard
path (megatron IndexedDataset read back), on real text of the sample corpus."""

import json
import os
import re

import numpy as np
import pytest

from prep_helpers import REPO, SLIMPAJAMA, TOKENIZER, file_bytes, load_docs, shard
from lenext_dist.eval import passkey as eval_passkey
from lenext_dist.prep.cli import shard_main
from lenext_dist.prep.manifest import answers_prefix
from lenext_dist.prep.readers import Doc, open_reader
from lenext_dist.prep.task_source import generate, task_spec
from lenext_dist.prep.tasks import TASKS, task_reference
from lenext_dist.prep.tokenizer import SpmTokenizer

SMALL = sorted(SLIMPAJAMA, key=os.path.getsize)[:2]  # ~140 KB of .zst: tests stay short


@pytest.fixture(scope="module")
def tok():
    return SpmTokenizer(TOKENIZER)


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    """The book chapters of a sample file as one .jsonl: prose filler (code has long runs
    without whitespace, where the cut nearest a depth can be far from it)."""
    path = tmp_path_factory.mktemp("prose") / "books.jsonl"
    with open(path, "w") as f:
        for p in SLIMPAJAMA[:1]:
            for r in open_reader(p, "slimpajama"):
                if isinstance(r, Doc) and r.set_name == "RedPajamaBook":
                    f.write(json.dumps({"text": r.text}) + "\n")
    return path


def _filler_depth(doc, source_start: int) -> float:
    """Filler tokens before the segment that starts at `source_start` / all filler tokens."""
    pos = before = total = 0
    for s in doc.segments:
        if pos == source_start:
            before = total
        total += len(s.ids) if s.role == "filler" else 0
        pos += len(s.ids)
    return before / total


# per task: parameters that make its structure checkable, and what to check of one document
CASES = {
    "passkey": (["depth=0.25", "distractors=2", "key_digits=5:7"],
                lambda d: (sum(s.role == "needle" for s in d.segments) == 2
                           and sum(s.role == "distractor" for s in d.segments) == 4
                           and 6 <= d.answers[0][2] <= 8)),  # '▁' + 5-7 digits
    "recall": (["depth=0.7", "pairs=4", "queries=2", "value_words=3"],
               lambda d: (sum(s.text.startswith("Entry ") for s in d.segments) == 4
                          and [n for *_, n in d.answers] == [3, 3])),
    "repeat": (["depth=0.3", "span=8:12"],
               lambda d: (d.segments[-1].role == "repeat" and 1 <= d.answers[0][2] <= 12
                          and [s.role for s in d.segments].count("span") == 1)),
    "copy": (["depth=0.3", "span=5:8"],  # pool words are one token each
             lambda d: (d.segments[-1].role == "repeat" and 5 <= d.answers[0][2] <= 8
                        and [s.role for s in d.segments].count("span") == 1
                        and d.segments[-1].text == next(s.text for s in d.segments
                                                        if s.role == "span"))),
    "kv": (["depth=0.5", "distractors=2", "values=4:5"],  # pool words are one token each
           lambda d: (sum(s.role == "needle" for s in d.segments) == 3
                      and sum(s.role == "distractor" for s in d.segments) == 6
                      and 4 <= d.answers[0][2] <= 5 and d.segments[-2].role == "question"
                      and d.segments[-2].text == next(s.text for s in d.segments
                                                      if s.role == "needle"))),
}


@pytest.mark.parametrize("task", list(TASKS))
def test_documents_hold_their_answers_at_the_stated_depth(task, prose, tok, tmp_path):
    sets, structure = CASES[task]
    spec = task_spec(task, [*sets, "length=80:112"], seed=3, passes=1)
    docs = list(generate(str(prose), None, spec, tok))
    shard([str(prose)], tmp_path, task, fmt="tasks", tasks=spec)
    written = load_docs(tmp_path / f"{task}_train")
    masks = load_docs(answers_prefix(str(tmp_path / f"{task}_train")))  # data.task_loss: answers
    assert len(written) == len(docs) == len(masks) > 300
    depth = float(sets[0].split("=")[1])
    dev = []
    for doc, ids in zip(docs, written):
        ids = ids.tolist()
        assert ids == doc.ids + [tok.eos_id]  # the shard holds exactly the planned tokens
        assert len(ids) <= 112 and structure(doc), doc.text
        for src, ans, n in doc.answers:
            assert src < ans and ids[src:src + n] == ids[ans:ans + n]  # ordered copy, n tokens
        mask = masks[doc_i := len(dev)]
        assert mask.dtype == np.uint8 and len(mask) == len(ids), doc_i
        assert np.flatnonzero(mask).tolist() == sorted(
            j for _, ans, n in doc.answers for j in range(ans, ans + n))  # the answers, nothing else
        assert doc.depth == depth
        dev.append(_filler_depth(doc, doc.answers[0][0]) - depth)
    lengths = [len(ids) for ids in written]
    assert np.mean(lengths) > 80  # the cut at whitespace and stripped ends cost a few tokens
    # the source sits at the cut point nearest the depth: close on average, never far in prose
    dev = np.abs(dev)
    assert dev.mean() < 0.03 and np.quantile(dev, 0.95) < 0.12, (dev.mean(), dev.max())


def test_depth_zero_and_one_are_exact(prose, tok):
    for depth in (0.0, 1.0):
        spec = task_spec("passkey,recall", [f"depth={depth}"], seed=0, passes=1)
        for doc in generate(str(prose), None, spec, tok):
            assert _filler_depth(doc, doc.answers[0][0]) == depth


def test_bytes_depend_on_the_seed_only_not_on_workers(tmp_path, tok):
    spec = task_spec("passkey,recall:2,repeat", ["length=64:96"], seed=0, passes=1)
    shard(SMALL, tmp_path / "w1", "t", fmt="tasks", tasks=spec, workers=1)
    shard(SMALL, tmp_path / "w2", "t", fmt="tasks", tasks=spec, workers=2)
    one = file_bytes(tmp_path / "w1", "t")
    assert one == file_bytes(tmp_path / "w2", "t")
    masks = ("train_answers",)  # the answer masks too
    assert file_bytes(tmp_path / "w1", "t", masks) == file_bytes(tmp_path / "w2", "t", masks)
    other = task_spec("passkey,recall:2,repeat", ["length=64:96"], seed=1, passes=1)
    seed0, seed1 = (generate(SMALL[0], None, s, tok) for s in (spec, other))
    assert [next(seed0).text for _ in range(20)] != [next(seed1).text for _ in range(20)]

    m = json.load(open(tmp_path / "w1" / "t.manifest.json"))
    docs = [d for p in SMALL for d in generate(p, None, spec, tok)]
    assert m["settings"]["tasks"] == spec and m["settings"]["format"] == "tasks"
    assert m["documents"]["read"] == m["documents"]["written"]["train"] == len(docs)
    assert m["documents"]["skipped"] == {}
    assert m["tokens"]["train"] == sum(len(d.ids) + 1 for d in docs)
    assert sum(i["docs_written"]["train"] for i in m["inputs"]) == len(docs)
    by_task = {t: sum(d.task == t for d in docs) for t in TASKS}
    # the weights 1:2:1 show in the mix (thousands of draws)
    assert by_task["recall"] > 1.5 * by_task["passkey"] and by_task["passkey"] > 0
    # a second pass over the text: twice the documents, all different from the first pass
    spec2 = task_spec("passkey,recall:2,repeat", ["length=64:96"], seed=0, passes=2)
    docs2 = list(generate(SMALL[0], None, spec2, tok))
    first = [d.text for d in generate(SMALL[0], None, spec, tok)]
    assert abs(len(docs2) - 2 * len(first)) < 0.05 * len(first)
    assert len({d.text for d in docs2}) == len(docs2)


def test_no_passkey_evaluation_template_in_generated_documents(tok):
    """The training passkey is another format family: a passkey score is not a memorized
    template. No sentence of the evaluation's prompt occurs in any document, and none of its
    wording in the generators' own text (real-text filler may say "remember it", as Austen does)."""
    spec = task_spec(",".join(TASKS), [], seed=0, passes=1)
    docs = [d for p in SMALL for d in generate(p, None, spec, tok)]
    text = "\n".join(d.text for d in docs).lower()
    own = "\n".join(s.text for d in docs for s in d.segments  # the templates, not real text
                     if s.role not in ("filler", "span", "repeat")).lower()
    assert len(text) > 200_000 and {d.task for d in docs} == set(TASKS)
    sentences = [eval_passkey.PREFIX, eval_passkey.QUESTION, eval_passkey.KEY.format(key="")]
    sentences += re.split(r"(?<=[.?]) ", eval_passkey.FILLER + " " + eval_passkey.PREFIX)
    for piece in sentences:
        assert piece.strip().lower() not in text, piece
    for word in ("pass key", "passkey", "remember", "important", "info", "grass", "memorize"):
        assert not re.search(rf"\b{word}\b", own), word


@pytest.mark.parametrize("args,message", [
    (["--tasks", "passkey,sudoku"], "--tasks: unknown task 'sudoku' (choose from passkey, recall, repeat, copy, kv)"),
    (["--tasks", "passkey:0"], "--tasks passkey:0: the weight after ':' must be a number > 0"),
    (["--tasks", "passkey", "--task-set", "recall.pairs=2"],
     "--task-set recall.pairs=2: 'recall' is not among --tasks"),
    (["--tasks", "passkey", "--task-set", "passkey.keys=2"], "passkey has no parameter 'keys'"),
    (["--tasks", "recall", "--task-set", "depth=0.5:2"], "--task-set recall.depth=0.5:2: must lie in [0, 1]"),
    (["--tasks", "recall", "--task-set", "length=64:x"], "--task-set recall.length: '64:x' is not a valid IntRange"),
    (["--tasks", "passkey", "--task-set", "passkey.depth=nan:0.5"],
     "--task-set passkey.depth: 'nan:0.5' is not a valid FloatRange (must be finite)"),
    (["--tasks", "passkey", "--task-set", "depth=0:inf"],
     "--task-set passkey.depth: '0:inf' is not a valid FloatRange (must be finite)"),
    (["--tasks", "passkey", "--task-set", "length=32"],
     "--task-set passkey.length=32: a passkey document with these parameters needs at least"),
    ([], "--tasks: name at least one task"),
])
def test_bad_task_options_are_one_line_errors(args, message, tmp_path, capsys):
    argv = ["--input", SLIMPAJAMA[0], "--format", "tasks", "--tokenizer", TOKENIZER,
            "--out", str(tmp_path), "--name", "x", "--no-progress", *args]
    assert shard_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "x.manifest.json").exists()


def test_tasks_flags_need_the_tasks_format(tmp_path, capsys):
    argv = ["--input", SLIMPAJAMA[0], "--format", "slimpajama", "--tokenizer", TOKENIZER,
            "--out", str(tmp_path), "--name", "x", "--tasks", "passkey"]
    assert shard_main(argv) == 2
    assert "--tasks goes with --format tasks" in capsys.readouterr().err


def test_docs_list_every_task_parameter():
    """docs/data-preparation.md's parameter table is task_reference() (from the dataclass field
    docstrings): paste its output there after changing a generator's parameters."""
    assert task_reference() in open(os.path.join(REPO, "docs", "data-preparation.md")).read(), \
        "docs/data-preparation.md: the task parameter table differs from task_reference()"


def test_filler_takes_at_most_n_tokens_and_loses_none(prose, tok):
    """FillerStream.take(n): the longest run of <= n tokens ending at a cut point (whitespace or
    a document start), consumed in order: the runs taken join back into the token stream."""
    from lenext_dist.prep.task_source import FillerStream, toolkit

    tk = toolkit(tok)
    texts = [json.loads(line)["text"] for line in open(prose)][:3]
    stream = FillerStream(iter(texts), tk)
    taken, sizes = [], [8, 13, 40, 97, 200]
    for i in range(400):
        n = sizes[i % len(sizes)]
        f = stream.take(n)
        if f is None:
            break
        assert 0 < len(f) <= n and list(f.bounds[[0, -1]]) == [0, len(f)]
        # the longest: the token after the run starts a word, none of the next ones up to n does
        rest = stream.starts[:n - len(f) + 1]
        assert len(rest) == 0 or (rest[0] and not rest[1:].any()), (n, len(f))
        taken.extend(f.ids.tolist())
    want = [i for t in texts for i in tk.encode(t)]
    assert len(taken) > 0.9 * len(want) and taken == want[:len(taken)]
