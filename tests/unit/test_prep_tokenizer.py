"""Tokenizer training (train_tokenizer) and the tokenizer wrapper used by the shard step."""

import hashlib
import os
import shutil
import tempfile

import numpy as np
import pytest
import sentencepiece as spm

from prep_helpers import SLIMPAJAMA, STARCODER, TOKENIZER
from lenext_dist.prep.errors import PrepError
from lenext_dist.errors import UserError
from lenext_dist.prep.cli import train_tokenizer_main
from lenext_dist.prep.tokenizer import SpmTokenizer, in_valid_split, load_sentencepiece
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


@pytest.mark.parametrize("flag,value,says", [
    ("--max-mb", "nan", "must be finite"),
    ("--max-mb", "inf", "must be finite"),
    ("--max-mb", "0", "must be > 0"),
    ("--doc-fraction", "nan", "must be finite"),
    ("--doc-fraction", "0", "must be in (0, 1]"),
    ("--doc-fraction", "1.5", "must be in (0, 1]"),
])
def test_tokenizer_cli_refuses_numbers_out_of_range(flag, value, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train_tokenizer_main(["--input", SLIMPAJAMA[0], "--format", "slimpajama", "--model-prefix",
                              str(tmp_path / "m"), "--vocab-size", "400", flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}: {says}" in err and "Traceback" not in err
    assert not os.listdir(tmp_path)


def test_tokenizer_cli_refuses_to_replace_an_existing_model(tmp_path, capsys):
    """A model already at --model-prefix (shards may have been made with it) is never replaced."""
    (tmp_path / "m.model").write_bytes(b"the model the shards were made with")
    argv = ["--input", SLIMPAJAMA[0], "--format", "slimpajama", "--model-prefix",
            str(tmp_path / "m"), "--vocab-size", "400", "--max-mb", "0.05"]
    assert train_tokenizer_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'm.model'}: already exists; choose another "
                          "--model-prefix or remove it") and len(err.strip().splitlines()) == 1
    assert (tmp_path / "m.model").read_bytes() == b"the model the shards were made with"
    assert not (tmp_path / "m.vocab").exists()


def _load_as_nobody(path: str) -> str:
    """The messages of load_sentencepiece and SpmTokenizer for `path`, in a child that runs as
    the user nobody when this one is root (root reads a chmod 000 file)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        msgs = []
        try:
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            for load in (lambda: load_sentencepiece(path, "--tokenizer"), lambda: SpmTokenizer(path)):
                try:
                    load()
                    msgs.append("loaded")
                except UserError as e:
                    msgs.append(str(e))
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            msgs.append(f"child failed: {e!r}")
        os.write(w, "\n".join(msgs).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_an_unreadable_tokenizer_says_it_cannot_be_read():
    folder = tempfile.mkdtemp()  # not under pytest's 0700 tmp folders: nobody must reach it
    try:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "tokenizer.model")
        shutil.copy(TOKENIZER, path)
        os.chmod(path, 0)
        msgs = _load_as_nobody(path).splitlines()
    finally:
        shutil.rmtree(folder)
    assert len(msgs) == 2, msgs
    for m in msgs:
        assert f"{path}: cannot be read (Permission denied)" in m and "not a SentencePiece" not in m
    assert msgs[0].startswith("--tokenizer: ")


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
