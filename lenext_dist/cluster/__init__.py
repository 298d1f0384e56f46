"""Cluster launch helpers: Slurm nodelists and hostfiles, rendezvous (master address/port, rank
environment from Slurm or Open MPI), per-node launcher commands, and the run state that the
sbatch scripts use to decide whether to requeue. Imports nothing heavy (no torch)."""
