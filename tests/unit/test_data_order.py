"""Data order: optimizer step t reads exactly the global samples [tG, (t+1)G), each once, whatever
the world size and micro batch; a resumed run continues there (no replay, no skip)."""
import pytest
import torch

from lenext_dist.config import load_config
from lenext_dist.data.gpt_data import sample_indices, train_batches, valid_batches


class IndexDataset:
    """Sample i is a sequence whose every token is i (megatron's GPTDataset item layout), so a
    batch tells which global samples it was made of."""

    def __getitem__(self, i):
        t = torch.full((4,), i, dtype=torch.int64)
        return {"tokens": t, "labels": t, "loss_mask": torch.ones(4), "position_ids": torch.arange(4)}


@pytest.mark.parametrize("world,micro,G", [(1, 1, 4), (1, 4, 4), (2, 1, 8), (2, 2, 8), (4, 1, 8),
                                           (4, 2, 16), (3, 2, 12)])
def test_micro_rank_accumulation_tile_each_step(world, micro, G):
    accum = G // (micro * world)
    for t in range(4):
        got = [i for m in range(accum) for r in range(world)
               for i in sample_indices(t, m, r, world, micro, G)]
        assert sorted(got) == list(range(t * G, (t + 1) * G)), (t, got)


@pytest.mark.parametrize("world,micro", [(1, 2), (2, 1), (4, 1)])
def test_train_batches_cover_the_global_batch_and_resume_in_place(world, micro):
    cfg = load_config(None, ["train.steps=5", f"train.micro_batch_size={micro}",
                             "train.global_batch_size=4"])
    seen = {}
    for r in range(world):
        for t, step in enumerate(train_batches(IndexDataset(), cfg, r, world, 0)):
            assert len(step) == cfg.train.accum_steps(world)
            seen.setdefault(t, []).extend(mb["tokens"][:, 0].tolist() for mb in step)
    assert sorted(seen) == list(range(5))
    for t, lists in seen.items():
        assert sorted(i for li in lists for i in li) == list(range(4 * t, 4 * t + 4))
    # resuming at step 3 yields steps 3 and 4 exactly as the straight run did
    resumed = list(train_batches(IndexDataset(), cfg, 0, world, 3))
    straight = list(train_batches(IndexDataset(), cfg, 0, world, 0))[3:]
    assert len(resumed) == 2
    assert all(torch.equal(a["tokens"], b["tokens"]) for x, y in zip(resumed, straight)
               for a, b in zip(x, y))


@pytest.mark.parametrize("world,micro", [(1, 1), (1, 4), (2, 1), (2, 2), (4, 1)])
def test_valid_batches_are_fresh_per_evaluation_and_the_same_on_any_world(world, micro):
    """An evaluation reads eval_iters global batches (8 samples each here), each once, over all
    ranks together: the same samples on 1, 2 or 4 ranks, and new ones at the next evaluation."""
    cfg = load_config(None, ["train.eval_iters=2", f"train.micro_batch_size={micro}",
                             "train.global_batch_size=8"])
    per = 2 * 8
    for e in range(3):
        ids = [i for r in range(world) for b in valid_batches(IndexDataset(), cfg, r, world, e)
               for i in b["tokens"][:, 0].tolist()]
        assert sorted(ids) == list(range(e * per, (e + 1) * per))
    # every rank the same number of micro-batches: evaluate() averages their means over ranks
    assert len({len(list(valid_batches(IndexDataset(), cfg, r, world, 0))) for r in range(world)}) == 1


def test_loader_workers_build_the_same_batches_in_order_and_ignore_stop_signals():
    """data.loader_workers > 0: the same steps' batches in the same order, from the resume step;
    a stop signal to a worker (Slurm signals every process of a step) does not end it: the
    training process alone checkpoints, and its next batch still comes. The signal comes as the
    workers start, before their init could have run (they are forked with it blocked)."""
    import os
    import signal

    cfg = load_config(None, ["train.steps=7", "train.micro_batch_size=2", "train.global_batch_size=4"])
    for start in (0, 3, 0, 3):
        want = list(train_batches(IndexDataset(), cfg, 1, 2, start))
        it = train_batches(IndexDataset(), cfg, 1, 2, start, workers=2)
        for w in it._workers:
            os.kill(w.pid, signal.SIGTERM)
            os.kill(w.pid, signal.SIGUSR1)
        got = list(it)
        assert [[mb["tokens"].tolist() for mb in s] for s in got] == \
            [[mb["tokens"].tolist() for mb in s] for s in want]
        assert len(got) == 7 - start


CRASH_WITH_WORKERS = """
import sys
sys.path.insert(0, {tests!r})
from test_data_order import IndexDataset
from lenext_dist.config import load_config
from lenext_dist.data.gpt_data import train_batches
cfg = load_config(None, ["train.steps=7", "train.micro_batch_size=2", "train.global_batch_size=4"])
it = train_batches(IndexDataset(), cfg, 0, 1, 0, workers=2)
next(it)
raise FloatingPointError("loss is nan")
"""


def test_a_training_process_that_crashes_with_live_workers_exits():
    """A crash keeps the batch iterator alive in the traceback until exit, where multiprocessing
    ends the workers with SIGTERM and waits for them: workers that ignored it hung the exit (a
    crashed job held its nodes until the time limit)."""
    import subprocess
    import sys
    from pathlib import Path

    code = CRASH_WITH_WORKERS.format(tests=str(Path(__file__).parent))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "FloatingPointError: loss is nan" in p.stderr


def test_loader_workers_default_to_one_on_an_accelerator_and_none_on_the_cpu():
    from lenext_dist.data.gpt_data import loader_workers

    cfg = load_config(None, [])
    assert [loader_workers(cfg, d) for d in ("cpu", "cuda:0", "npu:1")] == [0, 1, 1]
    assert loader_workers(load_config(None, ["data.loader_workers=3"]), "cpu") == 3
    assert loader_workers(load_config(None, ["data.loader_workers=0"]), "cuda:0") == 0
