"""data.task_loss: answers on real shards: `shard.py --format tasks` writes an answer mask beside
the shard, and the training samples' loss mask keeps exactly the answer tokens of the task
documents (checked by matching each whole document of a sample to the shard by its tokens, not by
megatron's sample walk the implementation uses), with and without BOS; text shards keep every
token, and a blend with no mask at all is refused. A mask that does not belong to its shard
(missing beside a task shard its manifest names, truncated, of other documents, not uint8, all
zero) and an empty shard are one-line errors naming the file; the run records the masks' sha256."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from prep_helpers import SLIMPAJAMA, TOKENIZER, load_docs, shard
from lenext_dist.config import BlendItem, ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig
from lenext_dist.data.gpt_data import build_datasets, collate
from lenext_dist.prep.manifest import answers_prefix
from lenext_dist.prep.task_source import task_spec

SMALL = sorted(SLIMPAJAMA)[:1]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("answers")
    spec = task_spec("passkey,copy", ["length=64:72"], seed=0, passes=1)
    shard(SMALL, out, "tasks", fmt="tasks", tasks=spec)
    shard(SMALL, out, "text")
    tasks = str(out / "tasks_train")
    return tasks, str(out / "text_train"), load_docs(tasks), load_docs(answers_prefix(tasks))


def run_cfg(blend, tmp, **data):
    """`blend`: (prefix, weight) or (prefix, weight, text) items."""
    return RunConfig(model=ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2,
                                       ffn_hidden_size=64, vocab_size=4096, seq_length=160),
                     train=TrainConfig(steps=20, micro_batch_size=2, global_batch_size=2,
                                       eval_interval=0),
                     data=DataConfig(blend=[BlendItem(*item) for item in blend],
                                     tokenizer=TOKENIZER, cache_dir=str(tmp), **data))


@pytest.mark.parametrize("bos", [False, True])
def test_loss_mask_is_the_answers_of_every_task_document(shards, gloo_1rank, tmp_path, bos):
    import sentencepiece as spm

    tasks, _, docs, masks = shards
    sp = spm.SentencePieceProcessor(model_file=TOKENIZER)
    eos, head = sp.eos_id(), [sp.bos_id()] if bos else []
    by_tokens = {tuple(head + d.tolist()): head and [0] + m.tolist() or m.tolist()
                 for d, m in zip(docs, masks)}
    train, _ = build_datasets(run_cfg([(tasks, 1.0)], tmp_path, bos=bos, task_loss="answers"), 1)
    plain, _ = build_datasets(run_cfg([(tasks, 1.0)], tmp_path / "all", bos=bos), 1)
    whole = answers = 0
    for i in range(40):
        b, p = collate(train, [i]), collate(plain, [i])
        assert b["tokens"].equal(p["tokens"]) and p["loss_mask"].all()  # same samples, all: 1s
        seq = b["tokens"][0].tolist() + [b["labels"][0, -1].item()]
        loss = [0] + b["loss_mask"][0].int().tolist()  # loss_mask[j] is label j = token j + 1
        cuts = [0] + [j + 1 for j in range(len(seq)) if seq[j] == eos]
        for a, e in zip(cuts[1:], cuts[2:]):  # documents wholly inside the sample
            assert loss[a:e] == by_tokens[tuple(seq[a:e])], (i, a)
            whole += 1
            answers += sum(loss[a:e])
        assert set(loss) <= {0, 1} and sum(loss) < len(seq) / 2
    assert whole >= 20 and answers >= 100


def test_text_shards_keep_every_token_and_a_blend_without_masks_is_refused(shards, gloo_1rank, tmp_path):
    tasks, text, _, _ = shards
    train, _ = build_datasets(run_cfg([(tasks, 0.5), (text, 0.5)], tmp_path, task_loss="answers"), 1)
    full = cut = 0
    for i in range(40):
        m = collate(train, [i])["loss_mask"][0]
        full += bool(m.all())
        cut += not m.all()
    assert full >= 10 and cut >= 10  # text samples whole, task samples cut to their answers
    with pytest.raises(ConfigError, match="data.task_loss.*no shard of data.blend has an answer mask"):
        build_datasets(run_cfg([(text, 1.0)], tmp_path / "t", task_loss="answers"), 1)


# ---- a mask that does not belong to its shard is a one-line error naming it, before training
def copy_shard(src, dst, mask=True):
    """The shard `src` (+ its manifest, and its mask with `mask`) copied into the folder `dst`."""
    dst.mkdir()
    src = Path(src)
    shutil.copy(src.parent / "tasks.manifest.json", dst)
    for p in (src, Path(answers_prefix(str(src))))[: 1 + mask]:
        for ext in (".bin", ".idx"):
            shutil.copy(f"{p}{ext}", dst / f"{p.name}{ext}")
    return str(dst / src.name)


def refused(blend, tmp, match):
    with pytest.raises(ConfigError, match=match) as e:
        build_datasets(run_cfg(blend, tmp / "cache", task_loss="answers"), 1)
    assert "\n" not in str(e.value)


def test_a_shard_copied_without_mask_and_manifest_is_refused_unless_marked_text(shards, gloo_1rank, tmp_path):
    tasks, text, _, _ = shards
    # a task shard's .bin/.idx alone: nothing in the data says it is text, so under 'answers' it
    # would train on all its filler; refused by name, even beside a shard that has a mask
    alone = tmp_path / "alone"
    alone.mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(tasks + ext, alone / f"tasks_train{ext}")
    bare = str(alone / "tasks_train")
    refused([(tasks, 0.5), (bare, 0.5)], tmp_path, rf"data.blend: {bare} has no answer mask "
            rf"\({bare}_answers.bin/.idx\) and no manifest beside it saying it is text: .*"
            "add `text: true` to its blend item")
    # the config says explicitly it is text: every one of its tokens trains, the task shard's
    # samples are cut to their answers
    train, _ = build_datasets(run_cfg([(tasks, 0.5), (bare, 0.5, True)], tmp_path / "c",
                                      task_loss="answers"), 1)
    cut = [not collate(train, [i])["loss_mask"][0].all() for i in range(40)]
    assert 10 <= sum(cut) <= 30
    # a text shard with its manifest needs no flag (the data says it); `text: true` on a task
    # shard (mask or manifest beside it) is a contradiction, refused
    build_datasets(run_cfg([(tasks, 0.5), (text, 0.5)], tmp_path / "d", task_loss="answers"), 1)
    refused([(tasks, 1.0, True)], tmp_path, rf"data.blend: {tasks} is marked `text: true` but is a "
            r"task shard \(its manifest .*tasks.manifest.json says --format tasks\)")
    # under data.task_loss 'all' nothing is asked
    build_datasets(run_cfg([(bare, 1.0)], tmp_path / "e"), 1)


def test_a_mask_missing_truncated_of_other_shards_or_of_another_dtype_is_named(shards, gloo_1rank, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tasks, text, _, masks = shards
    # the manifest beside it says it is a task shard: its mask may not be missing, even when
    # another shard of the blend has one (it would train on all its tokens)
    bare = copy_shard(tasks, tmp_path / "bare", mask=False)
    refused([(tasks, 0.5), (bare, 0.5)], tmp_path, rf"data.blend: answer mask {bare}_answers.bin of "
            rf"the task shard {bare} not found \(its manifest {tmp_path}/bare/tasks.manifest.json says")
    for ext, cut in ((".bin", 100), (".idx", 9)):  # an interrupted copy
        copy = copy_shard(tasks, tmp_path / f"cut{ext}")
        path = Path(answers_prefix(copy) + ext)
        path.write_bytes(path.read_bytes()[:-cut])
        refused([(copy, 1.0)], tmp_path, rf"data.blend: answer mask: {path}: .*truncated")
    # the mask of another --task-seed: other document lengths
    other = tmp_path / "seed1"
    shard(SMALL, other, "tasks", fmt="tasks", tasks=task_spec("passkey,copy", ["length=64:72"], seed=1,
                                                              passes=1))
    copy = copy_shard(tasks, tmp_path / "mixed")
    for ext in (".bin", ".idx"):
        shutil.copy(answers_prefix(str(other / "tasks_train")) + ext, answers_prefix(copy) + ext)
    refused([(copy, 1.0)], tmp_path, rf"data.blend: answer mask {copy}_answers.idx does not fit its "
            rf"shard {copy}.idx .*another --task-seed")
    # the right lengths in another dtype
    copy = copy_shard(tasks, tmp_path / "wide")
    b = IndexedDatasetBuilder(answers_prefix(copy) + ".bin", dtype=np.uint16)
    for m in masks:
        b.add_document(torch.from_numpy(m.astype(np.int64)), [len(m)])
    b.finalize(answers_prefix(copy) + ".idx")
    refused([(copy, 1.0)], tmp_path, rf"data.blend: answer mask {copy}_answers.idx holds uint16 values, not uint8")
    # an empty shard (megatron cannot map an empty .bin)
    empty = str(tmp_path / "empty_train")
    IndexedDatasetBuilder(empty + ".bin", dtype=np.uint16).finalize(empty + ".idx")
    refused([(text, 0.5), (empty, 0.5)], tmp_path, rf"data.blend: {empty}.bin/.idx: an empty shard")


def test_an_all_zero_mask_is_refused_and_a_start_without_answers_is_warned(shards, gloo_1rank, tmp_path, capsys):
    tasks, _, _, masks = shards
    copy = copy_shard(tasks, tmp_path / "zero")
    mask_bin = Path(answers_prefix(copy) + ".bin")
    mask_bin.write_bytes(bytes(mask_bin.stat().st_size))
    refused([(copy, 1.0)], tmp_path, rf"data.blend: answer mask {mask_bin} marks no answer token")
    # answers in one document only, which the first step's samples do not read: a warning
    cfg = run_cfg([(copy, 1.0)], tmp_path / "cache", task_loss="answers")
    cfg.train.steps = 1
    mask_bin.write_bytes(b"".join(m.astype(np.uint8).tobytes() for m in masks))
    train, _ = build_datasets(cfg, 1)
    read = {int(d) for i in range(2) for d in gpt_documents(train, i)}
    last = max(d for d in range(len(masks)) if d not in read and masks[d].any())
    mask_bin.write_bytes(b"".join((m if d == last else 0 * m).astype(np.uint8).tobytes()
                                  for d, m in enumerate(masks)))
    capsys.readouterr()
    cfg.run_dir = str(tmp_path / "run")
    build_datasets(cfg, 1, record=True)
    assert "warning: data.task_loss 'answers': the first 2 training samples hold no answer token" \
        in capsys.readouterr().out
    # the run records the masks it read by their sha256
    inputs = json.loads((tmp_path / "run" / "data_inputs.json").read_text())
    assert inputs["answer_masks"] == {answers_prefix(copy): {
        ext[1:] + "_sha256": hashlib.sha256(Path(answers_prefix(copy) + ext).read_bytes()).hexdigest()
        for ext in (".bin", ".idx")}}
    # a resume that reads other masks under the same prefix is told so (one line, the prefix)
    capsys.readouterr()
    build_datasets(cfg, 1, record=True)
    assert "answer masks changed" not in capsys.readouterr().out
    mask_bin.write_bytes(b"".join(m.astype(np.uint8).tobytes() for m in masks))
    build_datasets(cfg, 1, record=True)
    out = capsys.readouterr().out
    assert f"warning: answer masks changed since {tmp_path / 'run' / 'data_inputs.json'} was " \
           f"written: {answers_prefix(copy)}" in out


def gpt_documents(ds, i):
    """The shard documents megatron's GPTDataset reads for sample i (its own indices)."""
    j = ds.shuffle_index[i]
    return ds.document_index[ds.sample_index[j][0]: ds.sample_index[j + 1][0] + 1]
