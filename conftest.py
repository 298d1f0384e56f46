"""Shared test fixtures: repo paths, the sample tokenizer, tiny shards, free ports."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

REPO = Path(__file__).resolve().parent
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


@pytest.fixture(scope="module")
def gloo_1rank():
    """A 1-rank in-memory gloo group for one module (megatron's dataset builder needs one)."""
    from lenext_dist.model import init_single_process_group

    own = init_single_process_group()
    yield
    if own:
        destroy_group()


@pytest.fixture(scope="module")
def megatron_1rank():
    """A 1-rank gloo group + megatron's parallel state for one module; yields `init_megatron`
    (call it with a seed to re-seed megatron's RNG trackers)."""
    from lenext_dist.model import destroy_megatron, init_megatron, init_single_process_group

    own = init_single_process_group()
    init_megatron(1234)
    yield init_megatron
    destroy_megatron()
    if own:
        destroy_group()


def destroy_group():
    """Destroy the 1-rank group, and DeepSpeed's cached clone of its WORLD (deepspeed.utils.groups
    keeps it in a module global: an engine built under the next module's group would use the
    destroyed one, 'Group ... is not registered')."""
    dist.destroy_process_group()
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None and hasattr(groups, "_release_process_group_references"):
        groups._release_process_group_references(None)


def pytest_sessionfinish(session):
    """A process a test left running (a failed test's loader worker, a launcher's rank) can hold
    pytest's exit forever: multiprocessing waits for its children at exit. Kill each one, and name
    it in the summary (a leak is a defect of that test or of the code it ran)."""
    import psutil

    left, names = [], []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline()[:4])
            if any(f"multiprocessing.{s}" in cmd for s in SERVICES):
                continue
            p.kill()
        except psutil.Error:  # it ended meanwhile
            continue
        left.append(p)
        names.append(cmd)
    session.config.stash[LEFT] = names
    psutil.wait_procs(left, timeout=10)


def pytest_terminal_summary(terminalreporter):
    for line in terminalreporter.config.stash.get(LEFT, []):
        terminalreporter.write_line(f"killed a process the tests left running: {line}", yellow=True)


LEFT = pytest.StashKey[list]()
SERVICES = ("resource_tracker", "forkserver")
"""multiprocessing's own helpers, started once per process: they end when pytest does."""
