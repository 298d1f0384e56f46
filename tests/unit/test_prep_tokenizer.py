"""Tokenizer training (train_tokenizer) and the tokenizer wrapper used by the shard step."""

import hashlib

import numpy as np
import pytest
import sentencepiece as spm

from prep_helpers import SLIMPAJAMA, STARCODER, TOKENIZER
from lenext_dist.prep.errors import PrepError
from lenext_dist.prep.tokenizer import SpmTokenizer, in_valid_split
from lenext_dist.prep.train_tokenizer import run_train_tokenizer


def test_trained_model_is_llama_style_and_deterministic(tmp_path):
    kw = dict(vocab_size=512, max_bytes=300_000, exclude_sets=["RedPajamaGithub"])
    a = run_train_tokenizer(SLIMPAJAMA[:2], "slimpajama", str(tmp_path / "a" / "m"), **kw)
    b = run_train_tokenizer(SLIMPAJAMA[:2], "slimpajama", str(tmp_path / "b" / "m"), **kw)
    assert a["sha256"] == b["sha256"]  # same bytes wherever it is built
    assert a["bytes"] >= 300_000 and a["docs"] > 0 and a["skipped"].get("excluded_set", 0) >= 0
    sp = spm.SentencePieceProcessor(model_file=a["model"])
    assert (sp.vocab_size(), sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (512, 0, 1, 2, -1)
    text = "Ünïcödé 字 and   three spaces\tand 2024"
    assert sp.decode(sp.encode(text)) == text  # byte_fallback + identity normalization: lossless
    assert sp.encode("2024", out_type=str)[-4:] == ["2", "0", "2", "4"]  # digits split


def test_train_on_parquet_with_languages(tmp_path):
    out = run_train_tokenizer(STARCODER[:1], "starcoder", str(tmp_path / "c"), vocab_size=400,
                              languages=["python"], max_bytes=200_000)
    assert spm.SentencePieceProcessor(model_file=out["model"]).vocab_size() == 400


def test_encode_batch_appends_eos_and_uses_megatron_dtype():
    tok = SpmTokenizer(TOKENIZER)
    sp = spm.SentencePieceProcessor(model_file=TOKENIZER)
    texts = ["It is a truth universally acknowledged,", "def f(x):\n    return x\n"]
    got = tok.encode_batch(texts)
    assert [g.tolist() for g in got] == [sp.encode(t) + [2] for t in texts]
    assert all(isinstance(g, np.ndarray) for g in got)
    assert tok.dtype == np.uint16 and tok.describe()["sha256"] == \
        hashlib.sha256(open(TOKENIZER, "rb").read()).hexdigest()


def test_model_without_eos_is_refused(tmp_path):
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f"] * 50), vocab_size=10,
                                   model_prefix=str(tmp_path / "noeos"), eos_id=-1, minloglevel=2)
    with pytest.raises(PrepError, match="no EOS"):
        SpmTokenizer(str(tmp_path / "noeos.model"))


def test_valid_split_is_stable_and_roughly_the_fraction():
    texts = [f"document {i}" for i in range(20000)]
    picked = [t for t in texts if in_valid_split(t, 0.1)]
    assert 1800 < len(picked) < 2200
    assert picked == [t for t in texts if in_valid_split(t, 0.1)]
    # pinned values: the split must not change across Python versions or machines
    from lenext_dist.prep.tokenizer import stable_fraction

    got = [round(stable_fraction(f"document {i}", b"valid"), 6) for i in range(4)]
    assert got == [0.362106, 0.315507, 0.62927, 0.256238]
    assert not any(in_valid_split(t, 0.0) for t in texts[:100])


def test_token_dtype_follows_the_vocabulary_size():
    from lenext_dist.prep.tokenizer import token_dtype

    # uint16 holds ids < 65536; megatron switches to int32 from 65500 on (its own margin)
    assert np.dtype(token_dtype(32000)) == np.uint16
    assert np.dtype(token_dtype(70000)) == np.int32
    assert np.dtype(token_dtype(151_936)) == np.int32  # e.g. a Qwen-sized vocabulary
