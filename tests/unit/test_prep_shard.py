"""The shard step end to end, in-process, on subsets of the real sample corpus."""

import json
import os
import re

import numpy as np
import pytest
import sentencepiece as spm

from prep_helpers import SLIMPAJAMA, STARCODER, TOKENIZER, file_bytes, load_docs, shard
from lenext_dist.prep.errors import PrepError
from lenext_dist.prep.manifest import done_path, input_key, parts_dir
from lenext_dist.prep.merge import merge
from lenext_dist.prep.readers import Doc, open_reader
from lenext_dist.prep.tokenizer import in_valid_split

SUBSET = SLIMPAJAMA[:3]  # ~90K words: every test stays around a second


@pytest.fixture(scope="module")
def sp():
    return spm.SentencePieceProcessor(model_file=TOKENIZER)


def _documents(paths, fmt, exclude=()):
    return [r for p in paths for r in open_reader(p, fmt)
            if isinstance(r, Doc) and r.set_name not in exclude]


def test_tokens_equal_sentencepiece_plus_eos_document_for_document(tmp_path, sp):
    shard(SUBSET, tmp_path, "sp")
    docs = load_docs(tmp_path / "sp_train")
    texts = [d.text for d in _documents(SUBSET, "slimpajama")]
    assert len(docs) == len(texts) > 10
    for got, text in zip(docs, texts):
        assert got.dtype == np.uint16  # vocab 4096 < 65500: megatron's optimal dtype
        assert got.tolist() == sp.encode(text) + [sp.eos_id()]
    m = json.load(open(tmp_path / "sp.manifest.json"))
    assert m["tokens"]["train"] == sum(len(d) for d in docs)
    assert m["tokenizer"]["eos_id"] == 2 and m["tokenizer"]["dtype"] == "uint16"


def test_starcoder_and_exclusion_filter(tmp_path, sp):
    shard(STARCODER[:1], tmp_path, "sc", fmt="starcoder", languages=["python"])
    texts = [d.text for d in _documents(STARCODER[:1], "starcoder")]
    assert [d.tolist() for d in load_docs(tmp_path / "sc_train")] == \
        [ids + [2] for ids in sp.encode(texts)]

    shard(SLIMPAJAMA, tmp_path, "nogh", exclude_sets=["RedPajamaGithub"])
    m = json.load(open(tmp_path / "nogh.manifest.json"))
    n_github = m["documents"]["read_by_set"]["RedPajamaGithub"]
    assert n_github > 0 and m["documents"]["skipped"] == {"excluded_set": n_github}
    books = _documents(SLIMPAJAMA, "slimpajama", exclude={"RedPajamaGithub"})
    assert len(load_docs(tmp_path / "nogh_train")) == len(books)
    with pytest.raises(PrepError, match="only apply to --format slimpajama"):
        shard(STARCODER, tmp_path, "x", fmt="starcoder", exclude_sets=["RedPajamaGithub"])


def test_valid_split_by_stable_text_hash(tmp_path, sp):
    shard(SUBSET, tmp_path, "v", valid_fraction=0.2)
    texts = [d.text for d in _documents(SUBSET, "slimpajama")]
    want_valid = [t for t in texts if in_valid_split(t, 0.2)]
    want_train = [t for t in texts if not in_valid_split(t, 0.2)]
    assert 0 < len(want_valid) < len(texts)
    assert [d.tolist() for d in load_docs(tmp_path / "v_valid")] == \
        [ids + [2] for ids in sp.encode(want_valid)]
    assert len(load_docs(tmp_path / "v_train")) == len(want_train)
    m = json.load(open(tmp_path / "v.manifest.json"))
    assert m["documents"]["written"] == {"train": len(want_train), "valid": len(want_valid)}
    for split in ("train", "valid"):
        out = m["outputs"][split]
        import hashlib
        assert out["bin_sha256"] == hashlib.sha256(open(out["prefix"] + ".bin", "rb").read()).hexdigest()


def test_one_and_two_workers_and_slurm_tasks_give_identical_bytes(tmp_path):
    kw = dict(valid_fraction=0.1, exclude_sets=["RedPajamaGithub"])
    shard(SLIMPAJAMA[:4], tmp_path / "w1", "s", workers=1, **kw)
    shard(SLIMPAJAMA[:4], tmp_path / "w2", "s", workers=2, **kw)
    one = file_bytes(tmp_path / "w1", "s", ("train", "valid"))
    assert one == file_bytes(tmp_path / "w2", "s", ("train", "valid"))
    # a Slurm array of 3 tasks, then merge
    for i in range(3):
        summary = shard(SLIMPAJAMA[:4], tmp_path / "arr", "s", task_index=i, num_tasks=3, **kw)
        assert "manifest" not in summary
    assert not os.path.exists(tmp_path / "arr" / "s_train.bin")
    merge(str(tmp_path / "arr"), "s", "merge")
    assert one == file_bytes(tmp_path / "arr", "s", ("train", "valid"))


def test_the_streamed_merge_writes_megatrons_bytes_and_names_a_cut_part(tmp_path):
    """merge._concatenate streams the parts (megatron's builder held ~130 bytes a document: 75 GB
    for SlimPajama): its .bin/.idx are byte for byte what IndexedDatasetBuilder.add_index +
    finalize write, an empty part among them included; a part whose .bin is shorter than its
    index says (a node crash) is named, not merged."""
    from lenext_dist.prep.mcore_io import indexed_dataset
    from lenext_dist.prep.merge import _concatenate

    mc, rng = indexed_dataset(), np.random.default_rng(0)
    parts = []
    for i, n_docs in enumerate((3, 0, 5, 1)):
        b = mc.IndexedDatasetBuilder(str(tmp_path / f"p{i}.bin"), dtype=np.uint16)
        for _ in range(n_docs):  # a document of one or two sequences
            ids = rng.integers(0, 60000, rng.integers(2, 40)).astype(np.uint16)
            cut = int(rng.integers(1, len(ids)))
            b.add_document(ids, [len(ids)] if cut % 2 else [cut, len(ids) - cut])
        b.finalize(str(tmp_path / f"p{i}.idx"))
        parts.append(str(tmp_path / f"p{i}"))
    ref = mc.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    for p in parts:
        ref.add_index(p)
    ref.finalize(str(tmp_path / "ref.idx"))
    _concatenate(parts, str(tmp_path / "ours"), np.uint16)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes(), ext

    with open(parts[2] + ".bin", "r+b") as f:
        f.truncate(os.path.getsize(parts[2] + ".bin") - 2)
    with pytest.raises(PrepError, match=r"p2\.bin: .* bytes, its index says .* \(cut short\)"):
        _concatenate(parts, str(tmp_path / "cut"), np.uint16)
    assert not list(tmp_path.glob("cut*"))


def test_a_merge_reports_its_copy_and_clears_only_its_own_temporaries(tmp_path, monkeypatch, capsys):
    """The merge says how far its copy is (SlimPajama's is ~1 TB: it was silent) and what it is
    hashing; a killed merge's temporaries are cleared for this run only (a glob of <name>_* took
    those of a run named <name>_lm merging beside it)."""
    from lenext_dist.prep import merge as merge_module

    monkeypatch.setattr(merge_module, "LOG_EVERY", 0.0)
    shard(SUBSET[:1], tmp_path, "kv", task_index=0, num_tasks=1)
    capsys.readouterr()
    other = tmp_path / "kv_lm_train.tmp-0000-1.bin"
    other.write_bytes(b"another run's merge")
    mine = tmp_path / "kv_train.tmp-0000-1.bin"
    mine.write_bytes(b"a killed merge's")
    merge(str(tmp_path), "kv", "merge")
    err = capsys.readouterr().err
    assert re.search(r"\[merge\] kv_train\.bin: [\d.,]+ of [\d.,]+ GiB copied", err), err
    assert "[merge] kv_train: written; hashing it for the manifest" in err
    assert other.read_bytes() == b"another run's merge" and not mine.exists()


def test_merge_refuses_unfinished_inputs_and_resume_skips_done(tmp_path):
    shard(SUBSET, tmp_path, "r", task_index=0, num_tasks=2)
    with pytest.raises(PrepError, match=r"1 of 3 units of work are not finished"):
        merge(str(tmp_path), "r", "merge")
    # rerunning task 0 redoes nothing: its done-record stays untouched
    rec = done_path(str(tmp_path), "r", input_key(SUBSET[0]))
    before = os.stat(rec).st_mtime_ns
    assert shard(SUBSET, tmp_path, "r", task_index=0, num_tasks=2)["inputs_done_now"] == 0
    assert os.stat(rec).st_mtime_ns == before
    shard(SUBSET, tmp_path, "r", task_index=1, num_tasks=2)
    m = merge(str(tmp_path), "r", "merge", remove_parts=True)
    assert m["documents"]["written"]["train"] == len(_documents(SUBSET, "slimpajama"))
    assert not os.path.exists(parts_dir(str(tmp_path), "r"))
    # its parts gone, a new run of that name would replace its shards and manifest: refused
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(PrepError, match=r"already holds shards of a finished run named 'r' \(r.manifest.json\)"):
        shard(SUBSET[:1], tmp_path, "r", valid_fraction=0.5)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir() if p.name != "r.parts"} == before


def test_changed_settings_under_same_out_is_an_error(tmp_path):
    shard(SUBSET[:1], tmp_path, "p")
    with pytest.raises(PrepError, match="different settings"):
        shard(SUBSET[:1], tmp_path, "p", valid_fraction=0.5)
    with pytest.raises(PrepError, match="inputs"):
        shard(SUBSET[:2], tmp_path, "p")


def test_manifest_accounts_for_every_document(tmp_path):
    shard(SLIMPAJAMA, tmp_path, "acc", valid_fraction=0.05, exclude_sets=["RedPajamaGithub"],
          workers=2)
    m = json.load(open(tmp_path / "acc.manifest.json"))
    d = m["documents"]
    assert d["read"] == sum(d["written"].values()) + sum(d["skipped"].values())
    assert d["read"] == sum(d["read_by_set"].values())
    assert [i["path"] for i in m["inputs"]] == SLIMPAJAMA
    assert all(len(i["sha256"]) == 64 and i["size"] > 0 for i in m["inputs"])
    assert m["tokenizer"]["sha256"] and m["commands"]
    for split, out in m["outputs"].items():
        assert len(load_docs(out["prefix"])) == out["documents"] == d["written"][split]
