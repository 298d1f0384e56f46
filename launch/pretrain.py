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
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lenext_dist.config import load_config, split_cli_overrides  # noqa: E402
from lenext_dist.errors import entry_point  # noqa: E402


@entry_point
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML under configs/ (default: built-in defaults)")
    ap.add_argument("--dry-run", action="store_true",
                    help="build on the meta device, print config, sizes, FLOPs, memory; no training")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None,
                    help=argparse.SUPPRESS)  # passed by the deepspeed launcher; LOCAL_RANK is used
    args, rest = ap.parse_known_args(argv)
    cfg = load_config(args.config, split_cli_overrides(rest))
    if args.dry_run:
        from lenext_dist.train.dryrun import dry_run

        dry_run(cfg)
        return 0
    from lenext_dist.train.loop import train

    train(cfg)  # a diverged run raises Diverged (a UserError: exit 2, `latest` on the last good step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
