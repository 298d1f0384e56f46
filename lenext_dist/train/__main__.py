"""`python -m lenext_dist.train` / `deepspeed --module lenext_dist.train`: one rank of a training
run (or a one-process run); `--help` for the options."""
import sys

from .cli import rank_main

sys.exit(rank_main())
