"""experiments/nope_layouts/alignment.py: which documents have the question and answer on two
sides of a chunk boundary (pinned), and the command end to end on a random export."""
import json

import pytest

from experiments.nope_layouts import alignment


@pytest.mark.parametrize("start, n, two", [(59, 4, False),   # `key K is` at 56-58, values 59-62
                                           (51, 5, False),   # 48-55: the chunk's first tokens
                                           (50, 4, True),    # the question at 47-49: two chunks
                                           (45, 4, True),    # the values cross 48
                                           (44, 4, False)])  # 41-47
def test_two_chunks_is_the_question_and_answer_span(start, n, two):
    assert alignment.crosses(start, n) is two


def test_the_needle_split_reads_the_source_and_the_question_split_the_answer():
    class Doc:  # `key K is` at 15-17 + the needle's values 18-21 (crossing 16); the answer at 60-63
        answers = [(18, 60, 4)]
    assert alignment.SPLITS["needle"](Doc) is True and alignment.SPLITS["question"](Doc) is False
    Doc.answers = [(24, 47, 4)]  # `key K is` at 21-23 + values 24-27; the question at 44-46 + 47-50
    assert alignment.SPLITS["needle"](Doc) is False and alignment.SPLITS["question"](Doc) is True


def test_the_command_splits_every_document_and_writes_its_records(tmp_path):
    from tiny_models import save_tiny_lenext

    from lenext_dist.prep.kv_corpus import KVCorpus, build

    work = tmp_path / "work"
    info = build(KVCorpus(str(work / "data"), train_files=1, train_words=100, heldout_words=3000))
    save_tiny_lenext(str(work / "hf" / "irope-s0" / "step_0000010"), tokenizer=info["tokenizer"],
                     vocab_size=info["vocab_size"], train_length=64)
    (work / "plan.json").write_text(json.dumps({"L": 64, "models": [{"name": "irope-s0"}]}))
    out = ["--work", str(work), "--models", "irope-s0:step_0000010", "--out", str(tmp_path / "out")]
    assert alignment.main([*out, "--docs", "24"]) == 0
    rec = json.loads((tmp_path / "out" / "alignment.json").read_text())
    split = rec["models"][0]["split"]
    for k in ("question", "needle"):
        assert split[k]["one chunk"]["documents"] + split[k]["two chunks"]["documents"] == 24
    assert split["neither"]["documents"] <= min(split[k]["one chunk"]["documents"] for k in ("question", "needle"))
    assert "| irope-s0 | the regime's documents | step_0000010 |" in (tmp_path / "out" / "ALIGNMENT.md").read_text()
    # the same model retrained on other documents: a row beside the first; the same again replaces it
    (work / "plan.json").write_text(json.dumps({"L": 64, "models": [{"name": "irope-s0", "train_set": ["tail=0:16"]}]}))
    for _ in range(2):
        assert alignment.main([*out, "--docs", "24", "--append"]) == 0
    rec = json.loads((tmp_path / "out" / "alignment.json").read_text())
    assert [r["train_set"] for r in rec["models"]] == [[], ["tail=0:16"]]
    assert "| irope-s0 | kv tail=0:16 | step_0000010 |" in (tmp_path / "out" / "ALIGNMENT.md").read_text()
    with pytest.raises(SystemExit, match=r"^error: --append: .*other settings"):
        alignment.main([*out, "--docs", "12", "--append"])
    with pytest.raises(SystemExit, match=r"^error: --work .*: no readable plan.json"):
        alignment.main(["--work", str(tmp_path), "--models", "irope-s0:step_1", "--out", str(tmp_path)])
    (tmp_path / "plan.json").write_text(json.dumps({"L": 64}))
    with pytest.raises(SystemExit, match=r"^error: --work .*: no .*filler.jsonl \(the study's held-out filler"):
        alignment.main(["--work", str(tmp_path), "--models", "irope-s0:step_1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"^error: --models nope-s0:step_1: .* holds no exported model"):
        alignment.main(["--work", str(work), "--models", "nope-s0:step_1", "--out", str(tmp_path)])
