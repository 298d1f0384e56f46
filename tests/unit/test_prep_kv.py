"""The synthetic key-value regime (prep/kv_corpus.py + the `kv` task generator): every word one
piece of its tokenizer, documents of exactly L tokens, and through megatron's real GPTDataset one
training sample is one whole document: its needle and its answer are never split by packing, and
the loss mask (data.task_loss: answers) is the answer's value tokens only."""
import os
from pathlib import Path

import numpy as np
import sentencepiece as spm
import pytest

from prep_helpers import TOKENIZER, load_docs
from lenext_dist.config import BlendItem, DataConfig, ModelConfig, RunConfig, TrainConfig
from lenext_dist.data.gpt_data import build_datasets, collate
from lenext_dist.prep.errors import PrepError
from lenext_dist.prep.kv_corpus import KVCorpus, alphabet, build, main
from lenext_dist.prep.manifest import answers_prefix
from lenext_dist.prep.runner import ShardJob, run_shard
from lenext_dist.prep.task_source import task_spec

L = 48


@pytest.fixture(scope="module")
def kv(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv")
    info = build(KVCorpus(str(root / "data"), train_files=2, train_words=6000, heldout_words=500))
    spec = task_spec("kv", [f"length={L}", "distractors=0:2"], seed=0, passes=1)
    run_shard(ShardJob(inputs=[str(root / "data/train/filler-000.jsonl"),
                               str(root / "data/train/filler-001.jsonl")], fmt="tasks",
                       tokenizer=info["tokenizer"], out=str(root / "shards"), name="kv",
                       tasks=spec, progress=False))
    return info, str(root / "shards/kv_train")


def test_every_word_is_one_piece_and_no_answer_holds_a_format_piece(kv):
    info, prefix = kv
    sp = spm.SentencePieceProcessor(model_file=info["tokenizer"])
    words = [w for group in alphabet().values() for w in group]
    assert [len(sp.encode(w)) for w in words] == [1] * len(words)
    assert sp.vocab_size() == len(words) + 3 <= 128
    values = {sp.piece_to_id("▁" + w) for w in alphabet()["values"]}
    docs, masks = load_docs(prefix), load_docs(answers_prefix(prefix))
    assert len(docs) > 100
    for d, m in zip(docs, masks):
        assert len(d) == L and d[-1] == sp.eos_id()  # exactly L tokens, EOS included
        answer = d[m.astype(bool)].tolist()
        assert 4 <= len(answer) <= 5 and set(answer) <= values  # value tokens, nothing else
        key = d[-len(answer) - 3:-len(answer) - 1].tolist()  # `key K is` ends the document
        text = sp.decode(d[:-1].tolist())
        assert text.count(sp.decode(key + d[-len(answer) - 1:-1].tolist())) == 2  # needle + question


def test_a_training_sample_is_one_whole_document(kv, gloo_1rank, tmp_path):
    info, prefix = kv
    cfg = RunConfig(model=ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2,
                                      ffn_hidden_size=64, vocab_size=102, seq_length=L),
                    train=TrainConfig(steps=40, micro_batch_size=4, global_batch_size=4,
                                      eval_interval=0),
                    data=DataConfig(blend=[BlendItem(prefix=prefix, weight=1.0)],
                                    tokenizer=info["tokenizer"], cache_dir=str(tmp_path),
                                    task_loss="answers"))
    train, _ = build_datasets(cfg, 1)
    docs = {tuple(d.tolist()): m.tolist() for d, m in zip(load_docs(prefix),
                                                          load_docs(answers_prefix(prefix)))}
    for i in range(min(len(train), 160)):
        b = collate(train, [i])
        doc = tuple(b["tokens"][0].tolist())  # the L input tokens are one document, whole
        assert doc in docs, i
        # loss_mask[j] is the label j = token j + 1: the mask shifted by one, value tokens only
        assert b["loss_mask"][0].int().tolist() == docs[doc][1:] + [0], i


def test_a_tail_of_filler_after_the_answer_moves_the_question_and_keeps_the_length(kv, tmp_path):
    """kv.tail = 3:9: the answer ends 3-9 filler tokens (no loss on them) before the EOS, every
    length of the range drawn, the document still L tokens with its needle and question whole."""
    info, _ = kv
    data = Path(info["tokenizer"]).parent
    run_shard(ShardJob(inputs=[str(data / "train/filler-000.jsonl")], fmt="tasks",
                       tokenizer=info["tokenizer"], out=str(tmp_path), name="kv", progress=False,
                       tasks=task_spec("kv", [f"length={L}", "tail=3:9", "distractors=0:1"],
                                       seed=0, passes=1)))
    sp = spm.SentencePieceProcessor(model_file=info["tokenizer"])
    filler = {sp.piece_to_id("▁" + w) for w in alphabet()["filler"]}
    tails = set()
    for d, m in zip(load_docs(str(tmp_path / "kv_train")), load_docs(answers_prefix(str(tmp_path / "kv_train")))):
        assert len(d) == L and d[-1] == sp.eos_id()
        at = np.flatnonzero(m)
        end = len(d) - 1 - (at[-1] + 1)  # tokens between the answer and the EOS
        tails.add(int(end))
        assert set(d[at[-1] + 1:-1].tolist()) <= filler
        key = d[at[0] - 3:at[0]].tolist()  # `key K is` just before the answer
        assert sp.decode(d[:at[0] - 3].tolist()).count(sp.decode(key + d[at].tolist())) == 1  # the needle
    assert tails == set(range(3, 10))


def test_a_rerun_keeps_the_tokenizer_and_a_different_one_is_never_replaced(tmp_path, monkeypatch,
                                                                           capsys):
    """The same command again (even with --out spelled another way) works; a different
    tokenizer.model in --out (shards may have been made with it) is refused and kept."""
    small = dict(train_files=1, train_words=200, heldout_words=200)
    first = build(KVCorpus(str(tmp_path / "kv"), **small))
    model = (tmp_path / "kv" / "tokenizer.model").read_bytes()
    monkeypatch.chdir(tmp_path)
    assert build(KVCorpus("kv", **small))["vocab_size"] == first["vocab_size"]
    assert (tmp_path / "kv" / "tokenizer.model").read_bytes() == model
    other = (tmp_path / "other")
    other.mkdir()
    (other / "tokenizer.model").write_bytes(open(TOKENIZER, "rb").read())
    with pytest.raises(PrepError, match="tokenizer.model: a different tokenizer is already there"):
        build(KVCorpus(str(other), **small))
    assert main(["--out", str(other), "--train-files", "1", "--train-words", "200",
                 "--heldout-words", "200"]) == 2
    err = capsys.readouterr().err
    assert "a different tokenizer is already there" in err and len(err.strip().splitlines()) == 1
    assert (other / "tokenizer.model").read_bytes() == open(TOKENIZER, "rb").read()
    assert sorted(os.listdir(other)) == ["tokenizer.model"]  # nothing written beside it
