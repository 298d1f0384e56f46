"""Rendezvous for torch.distributed from a cluster's environment.

- `master_addr`: $MASTER_ADDR if set, else the first host of the Slurm allocation.
- `master_port`: $MASTER_PORT if set, else derived from $SLURM_JOB_ID (the same number on every
  node without any communication; 20000-29999, below Linux's ephemeral range), else 29500.
- `rank_env`: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE from an `srun` task (SLURM_PROCID ...)
  or an Open MPI process (OMPI_COMM_WORLD_*), for launching one process per GPU without
  torchrun/deepspeed and without MPI bindings.
- `node_command`: the per-node `torchrun` / `deepspeed.launcher.launch` command of a multi-node
  job, node rank from $SLURM_NODEID.
"""
from __future__ import annotations

import base64
import json
import re
import sys
from argparse import ArgumentTypeError
from typing import Mapping, Optional, Sequence

from lenext_dist.cluster import ClusterError
from lenext_dist.cluster.hostlist import hostnames
from lenext_dist.flags import PORTS, port_number

DEFAULT_PORT = 29500
PORT_BASE, PORT_SPAN = 20000, 10000


def master_port(environ: Mapping[str, str]) -> int:
    if environ.get("MASTER_PORT"):
        try:
            return port_number(environ["MASTER_PORT"])
        except ArgumentTypeError:
            raise ClusterError(f"MASTER_PORT={environ['MASTER_PORT']!r}: not a port number "
                               f"{PORTS[0]}-{PORTS[1]}; set it to a free port, or unset it") from None
    if environ.get("SLURM_JOB_ID"):
        return PORT_BASE + env_int(environ, "SLURM_JOB_ID") % PORT_SPAN
    return DEFAULT_PORT


def env_int(environ: Mapping[str, str], name: str, default: int = 0) -> int:
    """An integer environment variable (unset or empty: `default`); a ClusterError names it."""
    v = environ.get(name) or str(default)
    try:
        return int(v)
    except ValueError:
        raise ClusterError(f"{name}={v!r}: expected a whole number") from None


def _loopback(addr: str) -> bool:
    return addr.lower() in ("localhost", "::1", "ip6-localhost") or addr.startswith("127.")


def master_addr(environ: Mapping[str, str], hosts: Optional[Sequence[str]] = None) -> str:
    """A loopback MASTER_ADDR over several hosts is refused: sbatch passes the submitting shell's
    environment, and a MASTER_ADDR=localhost left there from a local run would have every other
    node dial itself until the rendezvous timed out. Hosts that are all loopback names (two "nodes"
    on one machine) keep it."""
    if hosts is None and (environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")):
        hosts = hostnames(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))
    if environ.get("MASTER_ADDR"):
        addr = environ["MASTER_ADDR"]
        remote = sorted({h for h in hosts or () if not _loopback(h)})
        if _loopback(addr) and hosts and len(set(hosts)) > 1 and remote:
            raise ClusterError(f"MASTER_ADDR={addr} is each node itself, but the job spans {len(set(hosts))} "
                               f"nodes ({hosts[0]}, ...): unset it (the first host is used) or name a host")
        return addr
    if hosts:
        return hosts[0]
    return "127.0.0.1"


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed count list, e.g. '4(x2),2' -> [4, 4, 2]."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ClusterError(f"bad tasks-per-node list {spec!r} (SLURM_TASKS_PER_NODE)")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def rank_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed env:// variables this process lacks, or {} when a launcher (torchrun,
    deepspeed) already set RANK or no known launcher environment is found."""
    if "RANK" in environ:
        return {}
    if "SLURM_PROCID" in environ and "SLURM_STEP_NUM_TASKS" in environ:  # an srun task (not the batch shell)
        node = env_int(environ, "SLURM_NODEID")
        per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or "1"
        counts = tasks_per_node(per_node)
        env = {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": environ["SLURM_STEP_NUM_TASKS"],
               "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
               "LOCAL_WORLD_SIZE": str(counts[node] if node < len(counts) else counts[-1]),
               "NODE_RANK": str(node)}
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
        env["MASTER_ADDR"] = master_addr(environ, hostnames(nodelist) if nodelist else None)
        env["MASTER_PORT"] = str(master_port(environ))
        return env
    if "OMPI_COMM_WORLD_RANK" in environ:
        size, local = environ["OMPI_COMM_WORLD_SIZE"], environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
        if not environ.get("MASTER_ADDR") and size != local:
            return {}  # several hosts and no MASTER_ADDR: leave it to DeepSpeed's MPI discovery
        return {"RANK": environ["OMPI_COMM_WORLD_RANK"], "WORLD_SIZE": size,
                "LOCAL_RANK": environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"), "LOCAL_WORLD_SIZE": local,
                "MASTER_ADDR": master_addr(environ, ["127.0.0.1"]),
                "MASTER_PORT": str(master_port(environ))}
    return {}


LAUNCHERS = ("torchrun", "deepspeed")


def node_command(launcher: str, nproc_per_node: int, script_and_args: Sequence[str],
                 environ: Mapping[str, str], hosts: Optional[Sequence[str]] = None,
                 python: str = sys.executable) -> list[str]:
    """The command one node runs in a multi-node job: a launcher that starts `nproc_per_node`
    ranks here, with node rank, node count, master address and port from the allocation."""
    if launcher not in LAUNCHERS:
        raise ClusterError(f"--launcher {launcher!r}: must be one of {LAUNCHERS}")
    if nproc_per_node < 1:
        raise ClusterError(f"--nproc-per-node {nproc_per_node}: must be >= 1 (the ranks per node)")
    if hosts is None:
        hosts = hostnames(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))
    node_rank = env_int(environ, "NODE_RANK" if environ.get("NODE_RANK") else "SLURM_NODEID")
    if not 0 <= node_rank < len(hosts):
        raise ClusterError(f"node rank {node_rank} (NODE_RANK / SLURM_NODEID) outside the {len(hosts)} "
                           f"hosts {list(hosts)}")
    addr, port = master_addr(environ, hosts), str(master_port(environ))
    if launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)), "--node_rank",
                str(node_rank), "--nproc_per_node", str(nproc_per_node), "--master_addr", addr,
                "--master_port", port, *script_and_args]
    from lenext_dist.train.device import launcher_devices

    # launch.py sets CUDA_VISIBLE_DEVICES to this node's list: the devices Slurm gave this task
    local = launcher_devices(nproc_per_node, environ, "--nproc-per-node") or list(range(nproc_per_node))
    world = {h: local for h in hosts}
    if len(world) != len(hosts):
        raise ClusterError(f"duplicate host names in {list(hosts)}")
    info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    return [python, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={info}",
            f"--node_rank={node_rank}", f"--master_addr={addr}", f"--master_port={port}",
            *script_and_args]
