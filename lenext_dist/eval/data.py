"""Evaluation documents: text files -> SentencePiece token ids, one array per document.

Inputs (`--data`, globs allowed): `.jsonl` / `.jsonl.zst` (one JSON object per line, text under
`text_key`, optional `meta.title` used as the document name) and `.txt` (one file = one
document). Documents are tokenized with SentencePiece itself (`sp.encode(text)`, no BOS, no EOS:
a held-out document is one contiguous token stream, and windows are cut from inside it), the same
tokenizer the model was trained with (`tokenizer.model` in the model directory). `bos=True`
(a model trained with data.bos) puts BOS before each document, as training saw it: the first
window of a document then starts with BOS (never a target), later windows do not.

Public API: `EvalDoc`, `expand_inputs`, `load_documents`, `load_tokenizer`, `round_robin`.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from ..prep.errors import Bad
from ..prep.readers import JsonlReader, TxtReader

EXTENSIONS = (".jsonl.zst", ".jsonl", ".txt")


@dataclass
class EvalDoc:
    """One tokenized document."""

    name: str            # "<file basename>:<title or line number>"
    path: str            # the source file
    tokens: np.ndarray   # [n] int64 token ids

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class DocSet:
    """Documents plus what the JSON results record about them."""

    docs: list[EvalDoc]
    tokenizer: str
    files: list[dict] = field(default_factory=list)  # {path, sha256, documents, tokens}
    bos: bool = False  # each document starts with BOS (counted in its tokens)

    def describe(self) -> dict:
        return {"tokenizer": self.tokenizer, "files": self.files, "bos": self.bos,
                "documents": [{"name": d.name, "tokens": len(d)} for d in self.docs],
                "total_tokens": int(sum(len(d) for d in self.docs))}


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Globs / directories / files -> sorted absolute paths of the supported extensions."""
    found: set[str] = set()
    for pat in patterns:
        if os.path.isdir(pat):
            hits = [os.path.join(r, f) for r, _, fs in os.walk(pat) for f in fs
                    if f.endswith(EXTENSIONS)]
        else:
            hits = [p for p in glob.glob(pat, recursive=True) if os.path.isfile(p)]
        if not hits:
            raise FileNotFoundError(f"--data {pat!r} matches no {'/'.join(EXTENSIONS)} file")
        bad = [p for p in hits if not p.endswith(EXTENSIONS)]
        if bad:
            raise ValueError(f"{bad[0]}: unsupported extension (use {', '.join(EXTENSIONS)})")
        found.update(os.path.abspath(p) for p in hits)
    return sorted(found)


def load_tokenizer(path: str):
    """A SentencePieceProcessor for `path` (a .model file, or a directory holding tokenizer.model)."""
    from ..prep.tokenizer import load_sentencepiece

    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.model")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SentencePiece model {path!r} not found (pass --tokenizer)")
    return load_sentencepiece(path, "--tokenizer")


def _iter_texts(path: str, text_key: str) -> Iterator[tuple[str, str]]:
    """(name, text) for every document of one file; raises on a bad record."""
    base = os.path.basename(path)
    if path.endswith(".txt"):
        reader: Iterable = TxtReader(path)
        for rec in reader:
            if isinstance(rec, Bad):
                raise ValueError(f"{rec.where}: {rec.reason}: {rec.detail}")
            yield base, rec.text
        return
    # titles are read here from the raw line (the prep reader keeps only the text)
    titles = _jsonl_titles(path)
    for i, rec in enumerate(JsonlReader(path, text_key)):
        if isinstance(rec, Bad):
            raise ValueError(f"{rec.where}: {rec.reason}: {rec.detail}")
        title = titles[i] if i < len(titles) and titles[i] else f"line{i + 1}"
        yield f"{base}:{title}", rec.text


def _jsonl_titles(path: str) -> list[Optional[str]]:
    """meta.title of each record, lines as JsonlReader splits them (at "\n" only, blank lines
    none: a title per physical line shifted every name after a blank one). Bytes that are not
    UTF-8 or a stream that is not zstd give no titles: the reader that follows reports the
    damage by line (a one-line error)."""
    import io

    import zstandard

    try:
        if path.endswith(".zst"):
            with open(path, "rb") as f:
                stream = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), "utf-8",
                                          errors="replace", newline="\n")
                lines = list(stream)
        else:
            with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
                lines = list(f)
    except zstandard.ZstdError:
        return []
    out: list[Optional[str]] = []
    for line in (x for x in lines if not x.isspace()):
        try:
            meta = json.loads(line).get("meta")
        except (ValueError, AttributeError):
            meta = None
        out.append(str(meta.get("title")) if isinstance(meta, dict) and meta.get("title") else None)
    return out


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def load_documents(patterns: Sequence[str], tokenizer: str, *, text_key: str = "text",
                   min_tokens: int = 0, max_docs: Optional[int] = None,
                   bos: bool = False) -> DocSet:
    """Tokenize every document of `patterns` with the SentencePiece model `tokenizer`.

    Documents with fewer than `min_tokens` tokens are dropped (protocols skip them anyway);
    `max_docs` keeps the first N documents in sorted-file order.
    """
    sp = load_tokenizer(tokenizer)
    if bos and sp.bos_id() < 0:
        raise ValueError(f"{tokenizer}: no BOS piece, cannot start documents with BOS (--no-bos)")
    head = [sp.bos_id()] if bos else []
    docs: list[EvalDoc] = []
    files = []
    for path in expand_inputs(patterns):
        n_docs = n_tok = 0
        for name, text in _iter_texts(path, text_key):
            if max_docs is not None and len(docs) >= max_docs:
                break
            ids = np.asarray(head + sp.encode(text), dtype=np.int64)
            n_docs += 1
            n_tok += len(ids)
            if len(ids) >= max(min_tokens, 1):
                docs.append(EvalDoc(name, path, ids))
        files.append({"path": path, "sha256": _sha256(path), "documents": n_docs, "tokens": n_tok})
    if not docs:
        raise ValueError(f"no document with at least {min_tokens} tokens in {list(patterns)}")
    tok_path = os.path.join(tokenizer, "tokenizer.model") if os.path.isdir(tokenizer) else tokenizer
    return DocSet(docs, os.path.abspath(tok_path), files, bos=bos)


def round_robin(per_doc: Sequence[Sequence]) -> list:
    """Interleave per-document lists (doc0[0], doc1[0], ..., doc0[1], ...), so a token budget
    samples every document instead of exhausting the first one."""
    out = []
    depth = max((len(x) for x in per_doc), default=0)
    for j in range(depth):
        out.extend(x[j] for x in per_doc if j < len(x))
    return out
