"""Evaluation documents: the held-out sample, txt/jsonl inputs, filters and interleaving."""
import json

import pytest

from lenext_dist.eval.data import expand_inputs, load_documents, load_tokenizer, round_robin
from tiny_models import REPO, SAMPLE_TOKENIZER


def test_heldout_code():
    ds = load_documents([f"{REPO}/data/sample/heldout/code.jsonl.zst"], SAMPLE_TOKENIZER)
    assert len(ds.docs) == 2 and all(len(d) > 20000 for d in ds.docs)
    d = ds.describe()
    assert d["files"][0]["documents"] == 2 and len(d["files"][0]["sha256"]) == 64
    assert d["total_tokens"] == sum(len(x) for x in ds.docs)
    sp = load_tokenizer(SAMPLE_TOKENIZER)
    assert ds.docs[0].name == "code.jsonl.zst:Lib/argparse.py"
    assert "Command-line parsing library" in sp.decode(ds.docs[0].tokens[:100].tolist())


def test_txt_jsonl_filters(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 50)
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"text": "short", "meta": {"title": "tiny"}}) + "\n"
        + json.dumps({"body": "the quick brown fox " * 40}) + "\n")
    # b.jsonl line 1 has no "body": a bad document is an error, never silently dropped
    with pytest.raises(ValueError, match="missing_text"):
        load_documents([str(tmp_path)], SAMPLE_TOKENIZER, text_key="body")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"text": "short", "meta": {"title": "tiny"}}) + "\n"
        + json.dumps({"text": "the quick brown fox " * 40}) + "\n")
    ds = load_documents([str(tmp_path)], SAMPLE_TOKENIZER)
    assert [d.name for d in ds.docs] == ["a.txt", "b.jsonl:tiny", "b.jsonl:line2"]
    ds = load_documents([str(tmp_path)], SAMPLE_TOKENIZER, min_tokens=20)
    assert [d.name for d in ds.docs] == ["a.txt", "b.jsonl:line2"]
    with pytest.raises(FileNotFoundError):
        expand_inputs([str(tmp_path / "nope*.jsonl")])
    with pytest.raises(FileNotFoundError):
        load_tokenizer(str(tmp_path))


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.zst"])
def test_jsonl_titles_skip_blank_lines_as_the_reader_does(tmp_path, name):
    """The reader makes no record of a blank line (nor splits at a lone CR): a title per
    physical line named every document after a blank one by its predecessor's title."""
    import zstandard

    rec = [json.dumps({"text": f"doc {t} " * 5, "meta": {"title": t}}) for t in ("one", "two")]
    body = (rec[0] + "\n\n  \n" + rec[1].replace(", ", ",\r ", 1) + "\n").encode()
    (tmp_path / name).write_bytes(zstandard.ZstdCompressor().compress(body) if name.endswith(".zst")
                                  else body)
    ds = load_documents([str(tmp_path / name)], SAMPLE_TOKENIZER)
    assert [d.name for d in ds.docs] == [f"{name}:one", f"{name}:two"]


def test_round_robin():
    assert round_robin([[1, 2, 3], [4], [5, 6]]) == [1, 4, 5, 2, 6, 3]
