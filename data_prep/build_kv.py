#!/usr/bin/env python3
"""Thin entry point: the synthetic key-value regime's filler and tokenizer
(lenext_dist.prep.kv_corpus; run with --help)."""

import os
import sys

# Run from a checkout without installing: put the repo root on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lenext_dist.prep.kv_corpus import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="data_prep/build_kv.py"))
