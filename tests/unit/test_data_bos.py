"""data.bos and data.document_mask on real megatron shards (issue 17 part 2): BOS is put before
every document when samples are built (the shards stay as written), megatron packs the documents
as if the shards held the BOS, and each micro-batch carries the document ids the model masks with."""
import os

import numpy as np
import pytest
import torch

from lenext_dist.attention import document_ids
from lenext_dist.config import BlendItem, ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig
from lenext_dist.data.gpt_data import BosDocuments, ShardTokenizer, build_datasets, collate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOK = os.path.join(REPO, "data", "sample", "tokenizer.model")


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """A real megatron shard of 30 documents (random ids in [3, 500) + EOS, 3-8 tokens)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=TOK)
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(3, 500, rng.integers(2, 8)), sp.eos_id()).astype(np.uint16)
            for _ in range(30)]
    prefix = str(tmp_path_factory.mktemp("bos_shard") / "docs")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in docs:
        b.add_document(torch.from_numpy(d.astype(np.int64)), [len(d)])
    b.finalize(prefix + ".idx")
    return prefix, docs, sp.bos_id(), sp.eos_id()


def run_cfg(prefix, tmp, **data):
    return RunConfig(model=ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2,
                                       ffn_hidden_size=64, vocab_size=4096, seq_length=16),
                     train=TrainConfig(steps=6, micro_batch_size=2, global_batch_size=2,
                                       eval_interval=0),
                     data=DataConfig(blend=[BlendItem(prefix=prefix)], tokenizer=TOK,
                                     cache_dir=str(tmp), **data))


def test_bos_documents_reads_bos_then_the_document(shard):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix, docs, bos, _ = shard
    ds = BosDocuments(IndexedDataset(prefix), bos)
    assert ds.sequence_lengths.dtype == np.int32
    assert ds.sequence_lengths.tolist() == [len(d) + 1 for d in docs]
    d = docs[4].tolist()
    assert ds.get(4).tolist() == [bos] + d
    assert ds.get(4, 0, 3).tolist() == [bos] + d[:2]
    assert ds.get(4, 2).tolist() == d[1:]
    assert ds.get(4, 1, 2).tolist() == d[:2]
    assert ds.get(4, 0, 1).tolist() == [bos]


def test_training_batches_have_bos_at_every_document_start(shard, gloo_1rank, tmp_path):
    prefix, docs, bos, eos = shard
    with_bos = [[bos] + d.tolist() for d in docs]
    cfg = run_cfg(prefix, tmp_path, bos=True, document_mask=True)
    train, _ = build_datasets(cfg, 1)
    whole = 0
    for i in range(12):  # 12 samples of 16 tokens: more than an epoch of 30 short documents
        b = collate(train, [i], document_mask=True)
        seq = b["tokens"][0].tolist() + [b["labels"][0, -1].item()]
        assert b["labels"][0, :-1].tolist() == seq[1:-1]
        after_eos = [seq[j + 1] for j in range(len(seq) - 1) if seq[j] == eos]
        assert after_eos and all(t == bos for t in after_eos)  # a BOS starts every next document
        cuts = [j + 1 for j in range(len(seq)) if seq[j] == eos]
        for a, e in zip(cuts, cuts[1:]):  # documents wholly inside the sample: BOS + shard doc
            assert seq[a:e] in with_bos
            whole += 1
        torch.testing.assert_close(b["document_ids"],
                                   document_ids(b["tokens"], eos_id=eos, bos_id=bos))
    assert whole >= 5
    # without data.bos: the shard's own tokens, no BOS anywhere, no document ids
    plain, _ = build_datasets(run_cfg(prefix, tmp_path), 1)
    b = collate(plain, range(4))
    assert "document_ids" not in b and not (b["tokens"] == bos).any()


def test_bos_changes_the_sample_cache_names_and_needs_a_bos_piece(tmp_path):
    assert ShardTokenizer(2, 10).unique_identifiers == {"class": "ShardTokenizer", "eod": 2,
                                                        "vocab_size": 10}
    assert ShardTokenizer(2, 10, bos=1).unique_identifiers["bos"] == 1
    import sentencepiece as spm


    sp = spm.SentencePieceProcessor(model_file=TOK)
    assert sp.bos_id() >= 0
    # a model without BOS piece: data.bos is refused with the key named
    text = tmp_path / "t.txt"
    text.write_text("\n".join(f"line {i} of some text to train on" for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "nobos"),
                                   vocab_size=40, bos_id=-1, eos_id=2, unk_id=0, pad_id=-1,
                                   minloglevel=2)
    with pytest.raises(ConfigError, match="data.bos"):
        ShardTokenizer.from_sentencepiece(str(tmp_path / "nobos.model"), bos=True)


def test_every_evaluation_defaults_to_the_training_bos(tmp_path):
    """`lenext eval` (ppl, entropy, scale-sweep, passkey) starts documents / prompts with BOS when
    the export says training did (config bos_at_document_start), --no-bos overrides it, and an
    export without the field (made before it existed) keeps the old default: no BOS."""
    import json

    from lenext_dist.cli import main
    from tiny_models import save_tiny_lenext

    model = save_tiny_lenext(str(tmp_path / "m"), train_length=32)
    data = tmp_path / "docs.jsonl"
    text = " ".join(f"word{i % 50} and more text" for i in range(60))
    data.write_text(json.dumps({"text": text}) + "\n")
    common = ["--model", model, "--data", str(data), "--max-docs", "1", "--no-progress"]

    def ppl(out, *extra):
        assert main(["eval", "ppl", *common, "--lengths", "32", "--protocol", "full",
                     "--budget-tokens", "32", "--no-penalty", "--out", str(out), *extra]) == 0
        return json.loads((out / "ppl_full.json").read_text())

    old = ppl(tmp_path / "old")
    assert old["args"]["bos"] is False and old["data"]["bos"] is False
    cfg_path = tmp_path / "m" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["bos_at_document_start"] = True
    cfg_path.write_text(json.dumps(cfg))
    new = ppl(tmp_path / "new")
    assert new["args"]["bos"] is True and new["data"]["bos"] is True
    assert new["data"]["documents"][0]["tokens"] == old["data"]["documents"][0]["tokens"] + 1
    assert ppl(tmp_path / "off", "--no-bos")["data"]["bos"] is False
    out = tmp_path / "more"
    assert main(["eval", "entropy", *common, "--length", "32", "--samples", "1",
                 "--out", str(out)]) == 0
    assert json.loads((out / "entropy_32.json").read_text())["data"]["bos"] is True
    assert main(["eval", "scale-sweep", *common, "--length", "48", "--c-min", "1", "--c-max", "1",
                 "--c-step", "0.1", "--samples", "1", "--out", str(out)]) == 0
    assert json.loads((out / "scale_sweep.json").read_text())["args"]["bos"] is True
    assert main(["eval", "passkey", "--model", model, "--lengths", "100", "--depths", "1",
                 "--keys", "1", "--max-new-tokens", "2", "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "passkey.json").read_text())["protocol"]["bos"] is True


def _write_shard(prefix, docs):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in docs:
        b.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
    b.finalize(prefix + ".idx")


def test_a_shard_remade_at_its_path_gets_new_sample_indices_and_a_warning(tmp_path, capsys):
    """Megatron names its sample-index cache by the shard's path: a shard remade there (other
    documents) read through the old indices, an IndexError or samples cut at the old bounds."""
    import json

    prefix = str(tmp_path / "docs")
    _write_shard(prefix, [[10 + i] * 9 + [2] for i in range(30)])  # 30 documents of 10 tokens
    cfg = run_cfg(prefix, tmp_path / "cache")
    cfg.run_dir = str(tmp_path / "run")
    build_datasets(cfg, 1, record=True)
    _write_shard(prefix, [[50 + i] * 2 + [2] for i in range(40)])  # remade: 40 documents of 3
    capsys.readouterr()
    train, _ = build_datasets(cfg, 1, record=True)
    # the samples a fresh cache gives (the old indices: an IndexError past the 30th document)
    fresh, _ = build_datasets(run_cfg(prefix, tmp_path / "fresh"), 1)
    for n in range(0, 12, 2):
        assert torch.equal(collate(train, range(n, n + 2))["tokens"], collate(fresh, range(n, n + 2))["tokens"])
    assert "warning: shards remade since" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "data_inputs.json").read_text())["shards"] == \
        train.config.tokenizer.shards
    # the same documents again, under a later time: a new build too (the same count and sizes)
    st = os.stat(prefix + ".idx")
    os.utime(prefix + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    capsys.readouterr()
    build_datasets(cfg, 1, record=True)
    assert "warning: shards remade since" in capsys.readouterr().out
    # an unchanged shard: the cache is read, no warning
    build_datasets(cfg, 1, record=True)
    assert "warning" not in capsys.readouterr().out
