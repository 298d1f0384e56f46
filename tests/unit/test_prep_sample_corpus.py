"""The committed sample corpus (data/sample) is what its README and sources.json say."""

import glob
import json
import os
import signal
import tempfile
import time

import pyarrow.parquet as pq
import pytest
import sentencepiece as spm

from prep_helpers import SAMPLE, SLIMPAJAMA, STARCODER, TOKENIZER
from lenext_dist.prep.readers import Doc, open_reader
from lenext_dist.prep.tokenizer import sha256_file

SOURCES = json.load(open(os.path.join(SAMPLE, "sources.json")))


def test_files_match_recorded_checksums_and_stay_small():
    for rel, digest in SOURCES["sha256"].items():
        assert sha256_file(os.path.join(SAMPLE, rel)) == digest, rel
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(SAMPLE, "**", "*.*"), recursive=True))
    assert total < 4 << 20  # committed size budget: a few MB


def test_layouts_are_slimpajama_and_starcoderdata():
    assert len(SLIMPAJAMA) == 8 and {os.path.basename(os.path.dirname(p)) for p in SLIMPAJAMA} == \
        {"chunk1", "chunk2"}
    assert [os.path.basename(os.path.dirname(p)) for p in STARCODER] == ["python", "python"]
    cols = pq.ParquetFile(STARCODER[0]).schema_arrow.names
    assert {"content", "max_stars_repo_path", "id"} <= set(cols)
    n_docs = sum(1 for p in SLIMPAJAMA for r in open_reader(p, "slimpajama") if isinstance(r, Doc))
    d = SOURCES["documents"]
    assert n_docs == d["slimpajama_book"] + d["slimpajama_github"]


def test_heldout_documents_are_long_and_unseen():
    sp = spm.SentencePieceProcessor(model_file=TOKENIZER)
    train = {r.text for p in SLIMPAJAMA for r in open_reader(p, "slimpajama")}
    train |= {r.text for p in STARCODER for r in open_reader(p, "starcoder")}
    held = [r.text for p in sorted(glob.glob(os.path.join(SAMPLE, "heldout", "*.jsonl.zst")))
            for r in open_reader(p, "jsonl")]
    assert len(held) >= 5
    for text in held:
        assert len(sp.encode(text)) >= 20_000
        assert text not in train
    # no held-out passage appears inside any training document
    probes = [t[len(t) // 2 : len(t) // 2 + 200] for t in held]
    assert not any(p in t for p in probes for t in train)


def test_tokenizer_is_the_documented_one():
    sp = spm.SentencePieceProcessor(model_file=TOKENIZER)
    assert (sp.vocab_size(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (4096, 0, 1, 2)
    assert sp.piece_to_id("<0x0A>") > 2  # byte fallback pieces exist


def _fake_sources(monkeypatch):
    """build_sample without downloads: small sources cut from the committed corpus's own text."""
    from lenext_dist.prep import sample_corpus as sc

    texts = [r.text for p in SLIMPAJAMA for r in open_reader(p, "slimpajama") if isinstance(r, Doc)]
    lines = "\n".join(texts).splitlines()[:3000]
    novel = [ln for i in range(6) for ln in [f"CHAPTER {i + 1}"] + lines[i * 80:(i + 1) * 80]]
    plays = {n: "\n".join(lines[i * 60:(i + 1) * 60]) for i, n in
             enumerate(["hamlet", "lear", "tempest"] + [f"play{i}" for i in range(8)])}
    code = {n: "\n".join(lines[i * 50:(i + 1) * 50]) for i, n in
            enumerate(["argparse.py", "typing.py"] + [f"mod{i}.py" for i in range(6)])}
    monkeypatch.setattr(sc, "fetch_austen", lambda work: (dict.fromkeys(
        sc.AUSTEN_TRAIN + sc.AUSTEN_HELDOUT, novel), "r-cran-janeaustenr_0_all.deb"))
    monkeypatch.setattr(sc, "fetch_plays", lambda work: plays)
    monkeypatch.setattr(sc, "stdlib_modules", lambda: code)
    monkeypatch.setattr(sc, "GITHUB_DOCS", 2)
    monkeypatch.setattr(sc, "VOCAB_SIZE", 400)
    return sc


def test_a_rebuild_keeps_the_same_tokenizer_and_refuses_another_changing_nothing(tmp_path, monkeypatch,
                                                                                capsys):
    """Shards and checkpoints made with data/sample/tokenizer.model would silently stop matching a
    new one: `prep sample` refuses it (as `prep kv` does), with nothing in --out changed, and
    leaves no temporary folder behind, also when it fails midway."""
    from lenext_dist.prep.cli import build_sample_main
    from lenext_dist.prep.errors import PrepError

    sc = _fake_sources(monkeypatch)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "sample"

    def files():
        return {p: open(p, "rb").read() for p in glob.glob(f"{out}/**/*.*", recursive=True)}

    sc.build_sample(str(out))
    before = files()
    assert sc.build_sample(str(out))["sha256"]["tokenizer.model"] == sha256_file(f"{out}/tokenizer.model")
    assert files() == before  # the same sources: the same model, kept
    monkeypatch.setattr(sc, "VOCAB_SIZE", 420)
    assert build_sample_main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}/tokenizer.model: a different tokenizer is already there; choose another --out" in err
    assert len(err.strip().splitlines()) == 1
    assert files() == before
    with pytest.raises(PrepError):
        sc.build_sample(str(out))
    monkeypatch.setattr(sc, "fetch_plays", lambda work: 1 / 0)
    with pytest.raises(ZeroDivisionError) as failed:
        sc.build_sample(str(tmp_path / "other"))
    assert failed.value and os.listdir(scratch) == []  # (the traceback holds the failed call's frames)
    assert sorted(os.listdir(tmp_path)) == ["sample", "tmp"]
    # `kill PID` midway: the staging folder beside --out was left behind (never swept)
    monkeypatch.setattr(sc, "fetch_plays", lambda work: os.kill(os.getpid(), signal.SIGTERM) or time.sleep(5))

    def not_unwound(*_):  # stands in for the default action (death), which would end pytest
        raise AssertionError("SIGTERM reached the default handler")

    before = signal.signal(signal.SIGTERM, not_unwound)
    try:
        with pytest.raises(SystemExit) as stopped:
            sc.build_sample(str(tmp_path / "other"))
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.code == 143 and os.listdir(scratch) == []
    assert sorted(os.listdir(tmp_path)) == ["sample", "tmp"]
