"""python -m lenext_dist.cluster COMMAND: the small decisions of the job scripts in launch/slurm/.

    hostnames [NODELIST]                  one host per line (default: the job's nodelist)
    hostfile [--slots N] [-o F] [NODELIST]  DeepSpeed hostfile (`host slots=N`)
    rendezvous                            shell `export` lines: MASTER_ADDR, MASTER_PORT, NNODES
    task -- CMD ...                       exec CMD with RANK/WORLD_SIZE/LOCAL_RANK/... from srun or mpirun
    node --launcher torchrun|deepspeed --nproc-per-node N -- SCRIPT ARGS ...
                                          exec this node's launcher (node rank from SLURM_NODEID)
    preflight --config C [overrides]      exit 2 with messages if tokenizer/shards/init_from are missing
    status --config C [overrides]         print `done|stopped|fresh STEP TOTAL CHECKPOINT_DIR`
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from typing import Optional

from lenext_dist.atomic import atomic_write
from lenext_dist.cluster import ClusterError, hostlist, rendezvous
from lenext_dist.errors import entry_point
from lenext_dist.flags import Parser


def _load(config: str, overrides: list[str]):
    from lenext_dist.config import load_config, split_cli_overrides

    return load_config(config, split_cli_overrides(overrides))  # a ConfigError: one line (main)


def add_hostfile_args(p: argparse.ArgumentParser) -> None:
    """The options of `hostfile` (also launch/hostfile.py, through hostfile_main)."""
    p.add_argument("nodelist", nargs="?", help="Slurm hostlist (default: $SLURM_JOB_NODELIST)")
    p.add_argument("--slots", type=int, default=None, help="ranks (GPUs) per host (default: "
                   "$SLURM_GPUS_ON_NODE, else $SLURM_NTASKS_PER_NODE)")
    p.add_argument("-o", "--output", help="write here instead of stdout")


def write_hostfile(args: argparse.Namespace) -> None:
    slots = args.slots
    if slots is None:
        slots = (rendezvous.env_int(os.environ, "SLURM_GPUS_ON_NODE")
                 or rendezvous.env_int(os.environ, "SLURM_NTASKS_PER_NODE"))
        if not slots:
            raise ClusterError("give --slots N (ranks per host), or run inside a Slurm job with GPUs")
    text = hostlist.hostfile(hostlist.hostnames(args.nodelist), slots)
    if args.output:
        atomic_write(args.output, text)
    else:
        sys.stdout.write(text)


def hostfile_main(argv=None, prog: Optional[str] = "python -m lenext_dist.cluster hostfile",
                  description: Optional[str] = None) -> int:
    """The `hostfile` command alone (launch/hostfile.py: its own prog and help)."""
    def main(args_) -> int:
        p = Parser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
        add_hostfile_args(p)
        write_hostfile(p.parse_args(args_))
        return 0

    return entry_point(main)(list(sys.argv[1:] if argv is None else argv))


def _exec(cmd: list[str], env: dict) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env)


def main(argv=None) -> int:
    """Under entry_point: a user's mistake (a bad hostlist, --slots, MASTER_PORT, config...) is one
    `error:` line and exit 2. The command after `--` (task, node) is passed on as given:
    entry_point takes `--debug` out of what it wraps."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    return entry_point(lambda head: _main(head + argv[cut:]))(argv[:cut])


def _main(argv: list[str]) -> int:
    ap = Parser(prog="python -m lenext_dist.cluster", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("hostnames")
    p.add_argument("nodelist", nargs="?")
    add_hostfile_args(sub.add_parser("hostfile"))
    sub.add_parser("rendezvous")
    p = sub.add_parser("task")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("node")
    p.add_argument("--launcher", choices=rendezvous.LAUNCHERS, default="torchrun")
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    for name in ("preflight", "status"):
        p = sub.add_parser(name)
        p.add_argument("--config", required=True)
        p.add_argument("overrides", nargs=argparse.REMAINDER)
    args, unknown = ap.parse_known_args(argv)
    if args.cmd in ("preflight", "status"):
        args.overrides = unknown + args.overrides  # `--a.b=1` config overrides, as pretrain.py takes them
    elif unknown:
        ap.error(f"unrecognized arguments: {' '.join(unknown)}")

    if args.cmd == "hostnames":
        print("\n".join(hostlist.hostnames(args.nodelist)))
    elif args.cmd == "hostfile":
        write_hostfile(args)
    elif args.cmd == "rendezvous":
        hosts = hostlist.hostnames() if os.environ.get("SLURM_JOB_NODELIST") else ["127.0.0.1"]
        for k, v in (("MASTER_ADDR", rendezvous.master_addr(os.environ, hosts)),
                     ("MASTER_PORT", rendezvous.master_port(os.environ)), ("NNODES", len(hosts))):
            print(f"export {k}={shlex.quote(str(v))}")
    elif args.cmd in ("task", "node"):
        cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not cmd:
            ap.error(f"{args.cmd}: give the command after --")
        env = dict(os.environ)
        if args.cmd == "task":
            env.update(rendezvous.rank_env(env))
        else:
            cmd = rendezvous.node_command(args.launcher, args.nproc_per_node, cmd, env)
            # Slurm delivers --signal=USR1 (and srun forwards it) to every process of the step. The
            # launcher must survive it (its default action is to die) while the ranks, which install
            # their own handler (lenext_dist.train.signals), checkpoint and exit 0. An ignored
            # signal stays ignored across exec.
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            print(f"[lenext.launch] node {env.get('SLURM_NODEID', env.get('NODE_RANK', '0'))}: "
                  f"{shlex.join(cmd)}", flush=True)
        _exec(cmd, env)
    else:
        cfg = _load(args.config, [a for a in args.overrides if a != "--"])
        from lenext_dist.cluster import run_state

        if args.cmd == "preflight":
            problems = run_state.preflight(cfg)
            for msg in problems:
                print(f"error: {msg}", file=sys.stderr)
            if problems:
                return 2
            print(f"run_dir {cfg.run_dir}\ncheckpoint_dir {cfg.checkpoint.dir}")
        else:
            print(run_state.run_state(cfg).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
