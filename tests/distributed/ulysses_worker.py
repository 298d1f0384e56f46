"""Run by torchrun (2 or 4 ranks) from test_ulysses.py: the real training loop (`train`) on each config
named in argv, one after another in one process group (start-up paid once)."""
import sys

import torch.distributed as dist

from lenext_dist.config import load_config
from lenext_dist.train.loop import init_distributed, shutdown_distributed, train

if __name__ == "__main__":
    paths = sys.argv[1:]
    init_distributed(load_config(paths[0]))
    for path in paths:
        train(load_config(path))  # leaves the group up: this script made it
        dist.barrier()
    shutdown_distributed()
