"""SentencePiece tokenization for data prep, and the stable train/validation split.

We tokenize with SentencePiece itself (not a converted HF tokenizer: the conversion
disagrees with SentencePiece on whitespace runs). Every document becomes
`sp.encode(text) + [eos]`; no BOS, and no padding of remainders (megatron's GPTDataset
packs documents into sequences itself).

Speed: texts are encoded in batches with `return_type="numpy"`, so no token ever becomes
a Python int; `threads` bounds SentencePiece's own thread pool (1 per worker process by
default, so N workers use N cores and the per-worker rate is comparable to a bare
single-threaded encode).

Memory: SentencePiece needs ~50 bytes per character of one input string (measured: a
50 MB one-line document peaked at 2.8 GB). Documents longer than CHUNK_CHARS are encoded
in pieces cut only where the result is provably the same as one `sp.encode(text)` call
(see `_safe_cuts`), so memory stays ~CHUNK_CHARS x 50 bytes whatever the document size.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

import numpy as np

from lenext_dist.errors import UserError

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


def refuse_other_model(existing: str, new: str) -> None:
    """Refuse to put the model at `new` in place of another one at `existing`: shards and
    checkpoints made with that one would silently stop matching it."""
    if os.path.exists(existing) and not _same_model(*map(_read, (existing, new))):
        raise PrepError(f"{existing}: a different tokenizer is already there; choose another "
                        "--out or remove it")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _same_model(a: bytes, b: bytes) -> bool:
    """Two SentencePiece models alike but for the output path they were trained to (the same
    command run with --out spelled another way)."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2 as pb

    protos = []
    for data in (a, b):
        m = pb.ModelProto()
        try:
            m.ParseFromString(data)
        except DecodeError:
            return False
        m.trainer_spec.ClearField("model_prefix")
        protos.append(m)
    return protos[0] == protos[1]


def load_sentencepiece(path: str, what: str = "",
                       hint: str = "pass the tokenizer.model the data was prepared with"):
    """The SentencePieceProcessor of the .model file `path`; a missing or unreadable file, or one
    that is not a SentencePiece model, is a UserError naming it (`what`: the flag or key it came
    from; `hint`: what to do about a file that is not a model)."""
    import sentencepiece as spm

    where = f"{what}: {path}" if what else str(path)
    if not os.path.isfile(path):
        raise UserError(f"{where}: no such SentencePiece model file; pass a tokenizer.model "
                        "(e.g. data/sample/tokenizer.model)")
    try:  # SentencePiece reports an unreadable file as a bad model: open it first
        open(path, "rb").close()
    except OSError as e:
        raise UserError(f"{where}: cannot be read ({e.strerror}); check its permissions") from None
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(os.fspath(path))
    except (OSError, RuntimeError) as e:
        raise UserError(f"{where}: not a SentencePiece model ({str(e).strip()[:200]}); {hint}") \
            from None
    return sp


class SpmTokenizer:
    """A loaded SentencePiece model plus what the shard format needs to know about it."""

    def __init__(self, model_path: str, threads: int = 1):
        if not os.path.isfile(model_path):
            raise PrepError(
                f"tokenizer model {model_path!r} not found. Pass a SentencePiece .model "
                "(e.g. data/sample/tokenizer.model) or train one with `lenext prep tokenizer`"
            )
        self.path = os.path.abspath(model_path)
        try:
            self.sp = load_sentencepiece(self.path, hint="pass a SentencePiece .model, or train "
                                                         "one with `lenext prep tokenizer`")
        except UserError as e:  # a PrepError, which a worker process reports as the user's
            raise PrepError(str(e)) from None
        self.sha256 = sha256_file(self.path)
        self.vocab_size = int(self.sp.vocab_size())
        self.eos_id = int(self.sp.eos_id())
        if self.eos_id < 0:
            raise PrepError(
                f"{model_path}: the model has no EOS piece (eos_id=-1); documents must end "
                "in EOS. Train it with --eos_id (`lenext prep tokenizer` sets eos=2)."
            )
        self.threads = max(1, int(threads))
        self.dtype = token_dtype(self.vocab_size)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text followed by EOS, one numpy array per text."""
        texts = list(texts)
        if max(map(len, texts), default=0) <= CHUNK_CHARS or self._chunking() is None:
            return self._encode(texts, eos=True)
        return [self._encode([t], eos=True)[0] if len(t) <= CHUNK_CHARS else self._encode_long(t)
                for t in texts]

    def _encode(self, texts: list, eos: bool) -> list:
        return self.sp.encode(texts, add_bos=False, add_eos=eos, num_threads=self.threads,
                              return_type="numpy")

    def _encode_long(self, text: str) -> np.ndarray:
        cuts = _safe_cuts(text, self._chunking())
        # Piece k > 0 starts at a space that we drop: the model's dummy prefix puts the
        # same "▁" back, so the normalized piece equals that span of the normalized text.
        bounds = list(zip([0, *cuts], [*cuts, len(text)]))
        ids = [self._encode([text[a + (a > 0):b]], eos=False)[0] for a, b in bounds]
        ids.append(np.array([self.eos_id], dtype=ids[0].dtype))
        return np.concatenate(ids)

    def _chunking(self):
        """The characters after which a cut before a space is unsafe, or None when this
        model cannot be cut at all (its normalization is not character by character)."""
        if not hasattr(self, "_unsafe"):
            self._unsafe = chunkable_model(self.sp.serialized_model_proto())
        return self._unsafe

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
    from .mcore_io import indexed_dataset

    return indexed_dataset().DType.optimal_dtype(vocab_size)


CHUNK_CHARS = 1 << 20  # longer documents are encoded in pieces of about this many chars
_SPACE = "\u2581"  # SentencePiece's visible space


def chunkable_model(proto: bytes):
    """For a model whose encoding can be cut at some spaces, the set of characters c such
    that a vocabulary piece contains c followed by the space mark; else None.

    Why a cut before a space s (text = A + s + B) is exact when no piece contains the pair
    (last char of A, space): the normalizer must map characters one by one (identity rule,
    no charsmap, whitespace kept as is) and add the dummy-prefix space, so normalize(s+B)
    is "▁"+B' = normalize(B) and normalize(A+s+B) = normalize(A) + normalize(B) with
    the cut at a symbol boundary. BPE only ever joins adjacent symbols into a
    vocabulary piece; no piece spans the cut, so no merge crosses it, and the merges on
    each side happen in the same relative order (SentencePiece breaks score ties by
    position), so both sides segment exactly as they do in the whole text.
    """
    try:
        from sentencepiece import sentencepiece_model_pb2 as pb
    except ImportError:  # protobuf missing: no proof, no cutting
        return None
    m = pb.ModelProto()
    m.ParseFromString(proto)
    ns = m.normalizer_spec
    if (ns.name != "identity" or ns.precompiled_charsmap or not ns.add_dummy_prefix
            or ns.remove_extra_whitespaces or m.trainer_spec.treat_whitespace_as_suffix
            or m.trainer_spec.model_type != 2):  # BPE only (unigram's Viterbi: not proven here)
        return None
    unsafe = set()
    for p in m.pieces:
        s = p.piece
        unsafe.update(s[i] for i in range(len(s) - 1) if s[i + 1] == _SPACE)
    # In the text the mark is a plain space; a space before a space may merge ("▁▁").
    if _SPACE in unsafe:
        unsafe.add(" ")
    return frozenset(unsafe)


def _safe_cuts(text: str, unsafe: frozenset) -> list[int]:
    """Positions of spaces, about CHUNK_CHARS apart, whose left neighbour is not in `unsafe`.
    With no such space for a while, the piece just grows (correctness over memory)."""
    cuts, pos = [], CHUNK_CHARS
    while pos < len(text):
        i = text.find(" ", pos)
        while i > 0 and text[i - 1] in unsafe:
            i = text.find(" ", i + 1)
        if i <= 0 or len(text) - i < 2:
            break
        cuts.append(i)
        pos = i + CHUNK_CHARS
    return cuts


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


_TOKENIZERS: dict = {}  # one loaded model per (path, threads) per process


def get_tokenizer(path: str, threads: int) -> SpmTokenizer:
    key = (path, threads)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = SpmTokenizer(path, threads)
    return _TOKENIZERS[key]
