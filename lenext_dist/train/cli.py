"""The command lines of training.

- `rank_main`: one rank of a run (`python -m lenext_dist.train`, `deepspeed --module
  lenext_dist.train`, torchrun/mpirun/srun, and the launch/pretrain.py script of a checkout):
  load the config with its command-line overrides, then the dry run or `loop.train`.
- `build_parser` / `run`: `lenext train --nproc N`, which starts DeepSpeed's launcher on N local
  ranks through `launch.launch_command` (or trains in its own process when N is 1).
"""
from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from lenext_dist.errors import entry_point
from lenext_dist.flags import Parser, port_number

RANK_PROG = "python -m lenext_dist.train"
RANK_DESCRIPTION = """Train a GPT model (pretraining or the HeadScale search) as one rank of a run, or alone.

Each rank of a launcher runs this module and finds its rank in the environment (deepspeed,
torchrun, mpirun, srun); without a launcher it is a one-process run. Any config key can be set on
the command line as --a.b=value (or --a.b value); every key is in docs/configuration.md. Outputs
go to runs/<name>/: the resolved config, metrics.jsonl, TensorBoard logs and checkpoints;
rerunning the same command resumes from the latest checkpoint. `lenext train --nproc N` starts
the launcher for you.

examples:
  deepspeed --num_gpus 2 --module lenext_dist.train --config configs/exp/tiny-cpu-nope.yaml
  torchrun --nproc_per_node 2 -m lenext_dist.train --config configs/exp/tiny-cpu-nope.yaml
  python -m lenext_dist.train --config configs/exp/tinyllama-1.1b-nope.yaml --dry-run

A user error prints one `error:` line and exits 2 (--debug or LENEXT_DEBUG=1: the traceback).
Manual: docs/pretraining.md
"""

DESCRIPTION = """Pretrain a GPT model under DeepSpeed ZeRO on this machine, or search its per-head scales.

The model is megatron-core's GPT with any position variant of this project. --nproc N starts
DeepSpeed's launcher with N ranks (one GPU each, or N CPU processes); with --nproc 1 the run is
this process. Any config key can be set on the command line as --a.b=value (or --a.b value);
every key is in docs/configuration.md. Outputs go to runs/<name>/: the resolved config,
metrics.jsonl, TensorBoard logs and checkpoints; rerunning the same command resumes from the
latest checkpoint. SIGTERM or SIGUSR1 to this command or its whole process group (Slurm's
--signal=USR1): every rank saves a checkpoint at the next step and the command exits 0."""

EPILOG = """examples:
  lenext train --nproc 2 --config configs/exp/tiny-cpu-nope.yaml
  lenext train --nproc 2 --config configs/exp/tiny-cpu-nope.yaml --optim.lr=3e-4 --train.steps 100
  lenext train --config configs/exp/tinyllama-1.1b-nope.yaml --dry-run

A user error prints one `error:` line and exits 2 (--debug or LENEXT_DEBUG=1: the traceback).
Several machines: docs/cluster.md. Manual: docs/pretraining.md"""


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of every training command (the rest of the line are config overrides)."""
    p.add_argument("--config", help="YAML under configs/ (default: built-in defaults)")
    p.add_argument("--dry-run", action="store_true",
                   help="build on the meta device, print config, sizes, FLOPs, memory; no training")


def train_or_dry_run(config: Optional[str], overrides: Sequence[str], dry_run: bool = False,
                     world: Optional[int] = None) -> None:
    """What a rank does: the config (strictly validated) -> the dry run, or the training loop."""
    from lenext_dist.config import load_config, split_cli_overrides

    cfg = load_config(config, split_cli_overrides(list(overrides)))
    if dry_run:
        from lenext_dist.train.dryrun import dry_run as run_dry

        run_dry(cfg, world)
        return
    from lenext_dist.train.loop import train

    train(cfg)  # a diverged run raises Diverged (a UserError: exit 2, `latest` on the last good step)


def rank_main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = RANK_PROG,
              description: str = RANK_DESCRIPTION) -> int:
    """One rank: `[--config C] [--dry-run] [--a.b=value ...]` (user errors: one line, exit 2)."""

    def main(args_: Sequence[str]) -> int:
        ap = Parser(prog=prog, description=description,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
        add_run_options(ap)
        ap.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help=argparse.SUPPRESS)  # passed by the deepspeed launcher; LOCAL_RANK is used
        args, rest = ap.parse_known_args(args_)
        train_or_dry_run(args.config, rest, args.dry_run)
        return 0

    return entry_point(main)(argv)


def build_parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """`lenext train`'s options; config overrides are the arguments it does not know."""
    p = p or Parser(prog="lenext train")
    p.description, p.epilog = DESCRIPTION, EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_run_options(p)
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks on this machine (default 1: this process; more: the deepspeed launcher)")
    p.add_argument("--port", type=port_number, default=None,
                   help="rendezvous port of the ranks, 1-65535 (default: a free one)")
    p.set_defaults(overrides=[], takes_overrides=True)
    return p


def run(args: argparse.Namespace) -> None:
    """Train (or dry-run) args.config on args.nproc local ranks. More than one: this process
    starts DeepSpeed's launcher (lenext_dist.train.launch.run_launcher: SIGTERM and SIGUSR1 reach
    the ranks as a request to save and exit 0); its exit status is the run's."""
    from lenext_dist.errors import UserError

    if args.nproc < 1:
        raise UserError(f"--nproc: {args.nproc} is not a number of ranks (1 or more)")
    if args.dry_run or args.nproc == 1:
        if args.port is not None:
            os.environ["MASTER_PORT"] = str(args.port)
        train_or_dry_run(args.config, args.overrides, args.dry_run, world=args.nproc)
        return
    from lenext_dist.config import load_config, split_cli_overrides

    load_config(args.config, split_cli_overrides(list(args.overrides)))  # a bad key fails here, once
    from .launch import launch_command, run_launcher

    run_launcher(launch_command(args.config, args.nproc, args.port, args.overrides))
