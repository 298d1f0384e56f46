#!/usr/bin/env python
"""Write a DeepSpeed hostfile (`host slots=N` per line) for the `deepspeed --hostfile` launcher.

The `deepspeed` runner then starts the ranks of every host over pdsh/ssh; on Slurm without ssh use
launch/slurm/pretrain.sbatch (srun) instead.

examples:
  python launch/hostfile.py --slots 8 > hostfile                   # inside a Slurm job: its nodes
  python launch/hostfile.py --slots 8 'gpu[001-004]' -o hostfile   # any Slurm hostlist expression
  deepspeed --hostfile hostfile --master_addr gpu001 launch/pretrain.py --config configs/exp/tinyllama-1.1b-nope.yaml

Manual: docs/cluster.md
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lenext_dist.cluster.__main__ import hostfile_main  # noqa: E402


def main(argv=None) -> int:
    """`python -m lenext_dist.cluster hostfile`, with this help."""
    return hostfile_main(argv, prog=None, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
