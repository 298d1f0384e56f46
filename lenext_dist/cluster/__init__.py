"""Cluster launch helpers: Slurm nodelists and hostfiles, rendezvous (master address/port, rank
environment from Slurm or Open MPI), per-node launcher commands, and the run state that the
sbatch scripts use to decide whether to requeue. Imports nothing heavy (no torch)."""
from lenext_dist.errors import UserError


class ClusterError(UserError, ValueError):
    """A bad hostlist, slot count or launcher environment variable (the message names it);
    `python -m lenext_dist.cluster` prints it on one line and exits 2."""
