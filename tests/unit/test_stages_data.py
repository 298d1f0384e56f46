"""Which samples a length stage reads (config/stages.py, the data-order rule): a megatron dataset
sized for the stage's own steps, read from its first sample. So a stage whose blend holds its
samples reads none twice; a dataset sized for the whole run and read from the stage's start (the
rule before) drew them from megatron's shuffle of several epochs. The training behaviour across a
boundary: tests/distributed/test_stages_train.py."""
import os

import torch

from helpers import tiny_shard
from lenext_dist.config import load_config, stages
from lenext_dist.data.gpt_data import build_datasets, collate, train_batches

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOK = os.path.join(REPO, "data", "sample", "tokenizer.model")
DOC, DOCS, S = 40, 60, 16  # the long stage's shard: 60 documents of 40 tokens; samples of 16


def _tokens(ds, indices) -> list[int]:
    return [t for i in indices for t in collate(ds, [i])["tokens"][0].tolist()]


def test_a_stage_reads_its_own_blend_from_its_start_and_no_sample_twice(tmp_path, gloo_1rank):
    first = tiny_shard(str(tmp_path / "first"))
    # every token names its document (ids 5 .. 2404, none of them the tokenizer's EOS 2): ~150
    # samples of 16, more than the stage's 100
    long = tiny_shard(str(tmp_path / "long"), [torch.arange(5 + DOC * i, 5 + DOC * (i + 1)) for i in range(DOCS)])
    cfg = load_config(None, [f"data.tokenizer={TOK}", f"data.cache_dir={tmp_path / 'cache'}",
                             f"data.blend=[{{prefix: {first}}}]", "model.vocab_size=4096",
                             f"model.seq_length={S}", "train.steps=200", "train.micro_batch_size=1",
                             "train.global_batch_size=1", "train.eval_interval=0",
                             f"train.stages=[{{start_step: 100, blend: [{{prefix: {long}}}]}}]"])
    (a, end), stage = stages.bounds(cfg)[1], stages.stage_config(cfg, 1)
    assert (a, end) == (100, 200)

    own, _ = build_datasets(stage, 1, steps=end - a)
    read = [t for step in train_batches(own, stage, 0, 1, a, span=(a, end)) for mb in step
            for t in mb["tokens"][0].tolist()]
    assert len(read) == (end - a) * S
    assert read[:S] == _tokens(own, [0])  # the stage's first step reads its dataset's first sample
    assert len(set(read)) == len(read)  # one epoch of the blend: no token read twice
    assert all(5 <= t < 5 + DOC * DOCS for t in read)  # the stage's blend, not stage 0's

    # the whole run's size, read from the stage's start: two epochs, the stage's samples drawn
    # from both, and tokens read twice though the blend holds more than the stage needs
    whole, _ = build_datasets(stage, 1)
    tail = _tokens(whole, range(a, end))
    assert len(set(tail)) < len(tail)
