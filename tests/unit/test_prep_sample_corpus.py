"""The committed sample corpus (data/sample) is what its README and sources.json say."""

import glob
import json
import os

import pyarrow.parquet as pq
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
