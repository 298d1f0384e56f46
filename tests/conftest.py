"""Shared test fixtures: repo paths, the sample tokenizer, tiny shards, free ports."""
import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The suite is the CPU/gloo tier: pin DeepSpeed to its CPU accelerator even on a GPU box.
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
