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
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lenext_dist.cluster.hostlist import hostfile, hostnames  # noqa: E402
from lenext_dist.flags import Parser


def main(argv=None) -> int:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("nodelist", nargs="?", help="Slurm hostlist (default: $SLURM_JOB_NODELIST)")
    ap.add_argument("--slots", type=int, default=None,
                    help="ranks (GPUs) per host (default: $SLURM_GPUS_ON_NODE, else $SLURM_NTASKS_PER_NODE)")
    ap.add_argument("-o", "--output", help="write here instead of stdout")
    args = ap.parse_args(argv)
    slots = args.slots or int(os.environ.get("SLURM_GPUS_ON_NODE") or os.environ.get("SLURM_NTASKS_PER_NODE") or 0)
    if slots < 1:
        print("error: give --slots N (ranks per host), or run inside a Slurm job with GPUs", file=sys.stderr)
        return 2
    try:
        text = hostfile(hostnames(args.nodelist), slots)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
