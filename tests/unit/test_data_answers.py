"""data.task_loss: answers on real shards: `shard.py --format tasks` writes an answer mask beside
the shard, and the training samples' loss mask keeps exactly the answer tokens of the task
documents (checked by matching each whole document of a sample to the shard by its tokens, not by
megatron's sample walk the implementation uses), with and without BOS; text shards keep every
token, and a blend with no mask at all is refused."""
import pytest

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
    return RunConfig(model=ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2,
                                       ffn_hidden_size=64, vocab_size=4096, seq_length=160),
                     train=TrainConfig(steps=20, micro_batch_size=2, global_batch_size=2,
                                       eval_interval=0),
                     data=DataConfig(blend=[BlendItem(prefix=p, weight=w) for p, w in blend],
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
