#!/usr/bin/env python3
"""Thin entry point; the logic and the full option list live in lenext_dist.prep.cli
(run with --help)."""

import os
import sys

# Run from a checkout without installing: put the repo root on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lenext_dist.prep.cli import build_sample_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(build_sample_main(prog="data_prep/build_sample.py"))
