"""Run by torchrun (4 ranks) from test_data_cache_race.py: `build_datasets` on a fresh run folder
(a fresh megatron sample-index cache) `starts` times in one process group, with rank 0's cache
writes slowed down as on a slow shared file system: every file numpy.save writes exists, empty,
for `delay` seconds before its bytes arrive. Each rank then reads a few samples; rank 0 prints
one line per start. argv: CONFIG STARTS DELAY RUNS_DIR."""
import os
import sys
import time

import numpy as np
import torch.distributed as dist

from lenext_dist.config import load_config
from lenext_dist.data.gpt_data import build_datasets

_save = np.save


def slow_save(file, *args, **kwargs):
    """numpy.save whose target exists (empty) for `DELAY` seconds before its bytes are written."""
    if isinstance(file, (str, os.PathLike)):
        open(file, "wb").close()
    else:
        file.flush()
    time.sleep(DELAY)
    return _save(file, *args, **kwargs)


if __name__ == "__main__":
    path, starts, DELAY = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        np.save = slow_save
    for i in range(starts):
        cfg = load_config(path, [f"run_dir={sys.argv[4]}/start{i}"])
        train, _ = build_datasets(cfg, world, record=rank == 0)
        first = [int(train[j]["tokens"][0]) for j in range(4)]
        got = [None] * world
        dist.all_gather_object(got, first)
        assert all(g == got[0] for g in got), got  # every rank reads the same samples
        if rank == 0:
            print(f"start {i}: ok ({len(train)} samples)", flush=True)
    dist.destroy_process_group()
