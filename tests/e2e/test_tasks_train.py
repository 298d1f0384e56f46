"""Task documents as a data source, as a user runs it: data_prep/shard.py --format tasks (2
workers), then launch/pretrain.py with the task shards in the blend, trained on their answer
tokens (data.task_loss: answers, the masks the shard step wrote). One rank, 6 steps: the cost
is the launcher's start-up (justified: the claim is that the source feeds a real run)."""
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import LAUNCHER, REPO, free_port, pretrain_cmd, run, write_config

pytestmark = pytest.mark.e2e


def test_task_shards_feed_pretraining_through_the_blend(sample_shards, tmp_path):
    small = sorted(glob.glob(str(REPO / "data/sample/slimpajama/chunk*/*.jsonl.zst")),
                   key=os.path.getsize)[:2]
    p = subprocess.run(
        [sys.executable, str(REPO / "data_prep/shard.py"), "--format", "tasks",
         "--tasks", "passkey,recall,repeat", "--task-set", "repeat.span=4:6", "--input", *small,
         "--tokenizer", sample_shards["tokenizer"],
         "--out", str(tmp_path / "shards"), "--name", "tasks", "--workers", "2", "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    manifest = json.load(open(tmp_path / "shards" / "tasks.manifest.json"))
    assert manifest["documents"]["written"]["train"] > 1000
    assert "[shard tasks] done." in p.stderr
    assert os.path.isfile(tmp_path / "shards" / "tasks_train_answers.idx")

    prose = sample_shards["blend"][0]["prefix"]
    tasks = str(tmp_path / "shards" / "tasks_train")
    cfg = write_config(tmp_path, sample_shards, "mix", train={"steps": 6, "eval_interval": 0},
                       checkpoint={"interval": 0},
                       data={"blend": [{"prefix": prose, "weight": 0.5},
                                       {"prefix": tasks, "weight": 0.5}],
                             "task_loss": "answers"})  # the answer masks written beside the shard
    run(pretrain_cmd(cfg, LAUNCHER, 1, free_port()))
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "mix" / "metrics.jsonl")
              if '"loss"' in line]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    # the run records the answer mask it read, by its sha256
    masks = json.load(open(tmp_path / "mix" / "data_inputs.json"))["answer_masks"]
    assert list(masks) == [tasks + "_answers"] and len(masks[tasks + "_answers"]["bin_sha256"]) == 64
    # megatron's blend drew training samples from both sources, about half from the tasks
    (index,) = glob.glob(str(tmp_path / "mix" / "data_cache" / "*BlendedDataset-train-dataset_index.npy"))
    share = float(np.mean(np.load(index) == 1))
    assert 0.4 < share < 0.6, share
