"""Shared helpers of the data-prep tests (not a test module)."""

from __future__ import annotations

import glob
import os

import zstandard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "data", "sample")
TOKENIZER = os.path.join(SAMPLE, "tokenizer.model")
SLIMPAJAMA = sorted(glob.glob(os.path.join(SAMPLE, "slimpajama", "chunk*", "*.jsonl.zst")))
STARCODER = sorted(glob.glob(os.path.join(SAMPLE, "starcoderdata", "*", "*.parquet")))


def write_zst(path: str, lines: list[bytes]) -> str:
    """A .jsonl.zst whose raw lines are exactly `lines` (for malformed-input cases)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3).compress(b"".join(ln + b"\n" for ln in lines)))
    return path


def shard(inputs, out, name="t", fmt="slimpajama", **kw):
    """Run the shard step in-process (megatron is imported once per test session)."""
    from lenext_dist.prep.runner import ShardJob, run_shard

    kw.setdefault("progress", False)
    return run_shard(ShardJob(inputs=list(inputs), fmt=fmt, tokenizer=TOKENIZER, out=str(out),
                              name=name, **kw))


def load_docs(prefix) -> list:
    """Documents of a megatron prefix, read back with megatron's own IndexedDataset."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    # copy: the arrays view megatron's mmap, which is closed when `ds` is collected
    return [ds[i].copy() for i in range(len(ds))]


def file_bytes(out, name, splits=("train",)) -> dict:
    out = str(out)
    return {f"{s}{ext}": open(os.path.join(out, f"{name}_{s}{ext}"), "rb").read()
            for s in splits for ext in (".bin", ".idx")}
