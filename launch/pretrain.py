#!/usr/bin/env python
"""Pretrain a GPT model under DeepSpeed ZeRO, or search its per-head attention scales (HeadScale).

The model is megatron-core's GPT with any position variant of this project. Runs under deepspeed,
torchrun, mpirun or srun (the rank comes from the environment), or alone as one process. Any config
key can be set on the command line as --a.b=value (or --a.b value); every key is in
docs/configuration.md. Outputs go to runs/<name>/: the resolved config, metrics.jsonl, TensorBoard
logs and checkpoints; rerunning the same command resumes from the latest checkpoint.

examples:
  deepspeed --num_gpus 2 launch/pretrain.py --config configs/exp/tiny-cpu-nope.yaml
  deepspeed --num_gpus 2 launch/pretrain.py --config configs/exp/tiny-cpu-nope.yaml --optim.lr=3e-4 --train.steps 100
  python launch/pretrain.py --config configs/exp/tinyllama-1.1b-nope.yaml --dry-run

A user error prints one `error:` line and exits 2 (--debug or LENEXT_DEBUG=1: the traceback).
Manual: docs/pretraining.md
"""
import os
import sys

# Run from a checkout without installing: put the repo root on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lenext_dist.train.cli import rank_main  # noqa: E402


def main(argv=None) -> int:
    """The training command of the package (`python -m lenext_dist.train`), with this help."""
    return rank_main(argv, prog=None, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
