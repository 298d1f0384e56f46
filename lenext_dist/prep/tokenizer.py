"""SentencePiece tokenization for data prep, and the stable train/validation split.

We tokenize with SentencePiece itself (not a converted HF tokenizer: the conversion
disagrees with SentencePiece on whitespace runs). Every document becomes
`sp.encode(text) + [eos]`; no BOS, and no padding of remainders (megatron's GPTDataset
packs documents into sequences itself).

Speed: texts are encoded in batches with `return_type="numpy"`, so no token ever becomes
a Python int; `threads` bounds SentencePiece's own thread pool (1 per worker process by
default, so N workers use N cores and the per-worker rate is comparable to a bare
single-threaded encode).
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

import numpy as np

from .errors import PrepError


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


class SpmTokenizer:
    """A loaded SentencePiece model plus what the shard format needs to know about it."""

    def __init__(self, model_path: str, threads: int = 1):
        import sentencepiece as spm

        if not os.path.isfile(model_path):
            raise PrepError(
                f"tokenizer model {model_path!r} not found. Pass a SentencePiece .model "
                "(e.g. data/sample/tokenizer.model) or train one with data_prep/train_tokenizer.py"
            )
        self.path = os.path.abspath(model_path)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.Load(self.path)
        except (OSError, RuntimeError) as e:
            raise PrepError(f"{model_path}: not a SentencePiece model ({e})") from None
        self.sha256 = sha256_file(self.path)
        self.vocab_size = int(self.sp.vocab_size())
        self.eos_id = int(self.sp.eos_id())
        if self.eos_id < 0:
            raise PrepError(
                f"{model_path}: the model has no EOS piece (eos_id=-1); documents must end "
                "in EOS. Train it with --eos_id (train_tokenizer.py sets eos=2)."
            )
        self.threads = max(1, int(threads))
        self.dtype = token_dtype(self.vocab_size)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text followed by EOS, one numpy array per text."""
        return self.sp.encode(
            list(texts),
            add_bos=False,
            add_eos=True,
            num_threads=self.threads,
            return_type="numpy",
        )

    def describe(self) -> dict:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "bos_id": int(self.sp.bos_id()),
            "dtype": np.dtype(self.dtype).name,
        }


def token_dtype(vocab_size: int):
    """megatron's own choice (uint16 below 65500 ids, else int32), so merge/load agree."""
    from megatron.core.datasets.indexed_dataset import DType

    return DType.optimal_dtype(vocab_size)


def stable_fraction(text: str, salt: bytes) -> float:
    """A number in [0, 1) that is a pure function of (text, salt).

    blake2b depends on nothing machine- or run-dependent (unlike Python's hash()), so
    decisions made from it are the same for any worker count, machine or rerun; the
    salt keeps independent decisions (validation split, tokenizer sample) uncorrelated.
    """
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=salt).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def in_valid_split(text: str, fraction: float) -> bool:
    """Document-level train/validation split by a stable hash of the text: exact
    duplicates never straddle the two splits."""
    return fraction > 0.0 and stable_fraction(text, b"valid") < fraction
