"""Shared test fixtures: repo paths, the sample tokenizer, tiny shards, free ports."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # tests/helpers.py
# The suite is the CPU/gloo tier: pin DeepSpeed to its CPU accelerator even on a GPU box.
os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def sample_shards(tmp_path_factory) -> dict:
    """Shards of the embedded sample corpus, made once per session by the real data_prep/shard.py
    (prose with a validation split, code without), and the blend of them the configs expect."""
    out = tmp_path_factory.mktemp("shards")
    tok = str(REPO / "data/sample/tokenizer.model")
    py = sys.executable
    common = ["--tokenizer", tok, "--out", str(out), "--workers", "1"]
    for args in (
        ["--input", str(REPO / "data/sample/slimpajama/chunk*/*.jsonl.zst"), "--format", "slimpajama",
         "--name", "slimpajama", "--valid-fraction", "0.05"],
        ["--input", str(REPO / "data/sample/starcoderdata/*/*.parquet"), "--format", "starcoder",
         "--name", "starcoder"],
    ):
        subprocess.run([py, str(REPO / "data_prep/shard.py"), *args, *common], check=True,
                       capture_output=True, cwd=REPO)
    return {
        "dir": out,
        "tokenizer": tok,
        "blend": [{"prefix": str(out / "slimpajama_train"), "weight": 0.69},
                  {"prefix": str(out / "starcoder_train"), "weight": 0.31}],
        "valid_blend": [{"prefix": str(out / "slimpajama_valid"), "weight": 1.0}],
    }
