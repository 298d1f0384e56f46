"""The synthetic key-value regime's inputs (`data_prep/build_kv.py`): filler text from a small
alphabet and a word-level SentencePiece model in which every word is one piece.

Why: real-text filler with a 4K-piece tokenizer did not teach any CPU-scale model to retrieve
(DESIGN section 9); the synthetic regime does, through the same model. The `kv` task generator
(prep/tasks.py) then writes the documents over this filler with `shard.py --format tasks --tasks kv`,
exactly as it would over real text. The alphabet:

  filler   32 two-letter syllables ("ba", "de", ...): never whole-word pool pieces (< 4 letters)
  values   32 four-letter words starting b..m: the first pool words in alphabetical order, so
           `kv.symbols` picks them
  keys     32 four-letter words starting n..z: the next pool words, `kv.keys`
  markers  "key", "is", "."

With the word model each of them is one piece `▁word`: no bare `▁` piece and no format token in
any answer. Filler files are .jsonl of records of `RECORD_WORDS` words (one unit of work per
file in data prep, so several files keep several workers busy).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from lenext_dist.atomic import atomic_write
from lenext_dist.flags import Parser

from .errors import PrepError
from .tokenizer import refuse_other_model

FILLER = [c + v for c in "bdfghkl" for v in "aeiou"][:32]


def _words(first: str, n: int) -> list[str]:
    """n four-letter consonant-vowel words whose first letter is in `first` (a fixed pattern)."""
    cv = [(c, v) for c in first for v in "aeiou"]
    tail = [(c, v) for c in "mnprstvz" for v in "aeiou"]
    return sorted(a + b + c + d for (a, b), (c, d) in
                  zip(cv * 2, tail[3::2] + tail[0::2]))[:n]


VALUES = _words("bcdfghjk", 32)
KEYS = _words("nprstvwz", 32)
MARKERS = ["key", "is", "."]
RECORD_WORDS = 1000


@dataclass(frozen=True)
class KVCorpus:
    out: str
    """Folder: <out>/train/filler-NNN.jsonl, <out>/heldout/filler.jsonl, <out>/tokenizer.model."""
    train_files: int = 8
    train_words: int = 250_000
    """Filler words per training file (`--task-passes` reuses them with new needles)."""
    heldout_words: int = 50_000
    seed: int = 0

    def __post_init__(self):
        for name in ("train_files", "train_words", "heldout_words"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")


def alphabet() -> dict[str, list[str]]:
    assert len(VALUES) == len(KEYS) == 32 and not set(VALUES) & set(KEYS), "alphabet drifted"
    return {"filler": FILLER, "values": VALUES, "keys": KEYS, "markers": MARKERS}


def write_filler(path: Path, words: int, rng: np.random.Generator, p: Optional[np.ndarray] = None) -> None:
    """`words` filler syllables in records of RECORD_WORDS; p: their probabilities (default uniform;
    experiments/kv_regime draws a skewed held-out filler with it)."""
    vocab = np.array(alphabet()["filler"])
    lines = []
    for start in range(0, words, RECORD_WORDS):
        draw = vocab[rng.choice(len(vocab), min(RECORD_WORDS, words - start), p=p) if p is not None
                     else rng.integers(0, len(vocab), min(RECORD_WORDS, words - start))]
        lines.append(json.dumps({"text": " ".join(draw)}))
    atomic_write(path, "\n".join(lines) + "\n")


def train_word_tokenizer(prefix: str) -> str:
    """A word-level SentencePiece model holding exactly the alphabet (+ unk, bos, eos)."""
    import sentencepiece as spm

    words = [w for group in alphabet().values() for w in group]
    lines = [" ".join(words)] * 4  # every word a few times: the trainer keeps them all
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, model_type="word",
        vocab_size=len(words) + 3, hard_vocab_limit=False, character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    return prefix + ".model"


def _tokenizer(out: Path) -> str:
    """Train the word tokenizer into <out>/tokenizer.model; one already there is kept when it is
    the same model (a rerun) and refused when it is another (shards may have been made with it)."""
    model = out / "tokenizer.model"
    if not model.exists():
        return train_word_tokenizer(os.fspath(out / "tokenizer"))
    tmp = out / f"tokenizer.tmp-{os.getpid()}"
    try:
        refuse_other_model(os.fspath(model), train_word_tokenizer(os.fspath(tmp)))
    finally:
        for ext in (".model", ".vocab"):
            Path(os.fspath(tmp) + ext).unlink(missing_ok=True)
    return os.fspath(model)


def build(corpus: KVCorpus) -> dict:
    """Write the tokenizer and the filler files; return what was written (also kv.json)."""
    out = Path(corpus.out)
    out.mkdir(parents=True, exist_ok=True)
    model = _tokenizer(out)  # first: a refused --out gets nothing written
    rng = np.random.default_rng(corpus.seed)
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "heldout").mkdir(parents=True, exist_ok=True)
    for i in range(corpus.train_files):
        write_filler(out / "train" / f"filler-{i:03d}.jsonl", corpus.train_words, rng)
    write_filler(out / "heldout" / "filler.jsonl", corpus.heldout_words,
                  np.random.default_rng(corpus.seed + 1_000_003))
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model)
    info = {"tokenizer": model, "vocab_size": sp.vocab_size(), "alphabet": alphabet(),
            "train_files": corpus.train_files, "train_words": corpus.train_words,
            "heldout_words": corpus.heldout_words, "seed": corpus.seed}
    atomic_write(out / "kv.json", json.dumps(info, indent=1))
    return info


def main(argv=None, prog: str = "lenext prep kv") -> int:
    import argparse
    import sys

    p = Parser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write the synthetic key-value regime's filler text and its word-level tokenizer.\n\n"
                    "Every word is one piece; `lenext prep --format tasks --tasks kv` then writes the "
                    "key-value documents\nover this filler.",
        epilog=f"example:\n  {'python ' if prog.endswith('.py') else ''}{prog} --out data/kv\n"
               "  lenext prep --format tasks --tasks kv --input 'data/kv/train/*.jsonl' "
               "\\\n      --tokenizer data/kv/tokenizer.model --out shards/kv --name kv --task-passes 4\n\n"
               "Manual: docs/data-preparation.md")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--train-files", type=int, default=KVCorpus.train_files,
                   help=f"filler files for training (default {KVCorpus.train_files})")
    p.add_argument("--train-words", type=int, default=KVCorpus.train_words,
                   help=f"filler words per training file (default {KVCorpus.train_words})")
    p.add_argument("--heldout-words", type=int, default=KVCorpus.heldout_words,
                   help=f"filler words for evaluation (default {KVCorpus.heldout_words})")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        info = build(KVCorpus(a.out, a.train_files, a.train_words, a.heldout_words, a.seed))
    except (ValueError, OSError, PrepError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"[build_kv] {a.out}: {a.train_files} x {a.train_words:,} filler words, "
          f"tokenizer of {info['vocab_size']} pieces ({info['tokenizer']})", file=sys.stderr)
    return 0
