"""The data cache under concurrency (issue 40): megatron's rank 0 writes the sample-index cache
while the other ranks wait at its barrier and then load it. A 4-rank start on a fresh run folder,
repeated, with rank 0's writes slowed so that each cache file exists for a while before its bytes
(a slow shared file system), must never refuse a file in the making. Real megatron builder, real
gloo ranks (tests/distributed/cache_race_worker.py). LENEXT_CACHE_RACE_DELAY sets the delay (the
acceptance run of the issue used 2 s; the suite 0.25 s, which the old scan-ahead check failed)."""
import os
import subprocess
import sys

import pytest

from helpers import REPO, env, free_port, write_config

pytestmark = pytest.mark.distributed

STARTS = 20


def test_four_ranks_start_on_a_fresh_cache_with_slow_writes_every_time(sample_shards, tmp_path):
    delay = os.environ.get("LENEXT_CACHE_RACE_DELAY", "0.25")
    # two shards: megatron's blended dataset caches its own indices beside the GPT datasets'
    cfg = write_config(tmp_path, {**sample_shards, "valid_blend": []}, "race",
                       train={"steps": 4, "eval_interval": 0})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(REPO / "tests/distributed/cache_race_worker.py"), str(cfg), str(STARTS), delay,
           str(tmp_path / "runs")]
    p = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    assert p.stdout.count(": ok (") == STARTS, p.stdout[-3000:]
    assert "not a plain numpy array" not in p.stdout + p.stderr
