"""The machinery every generated task shares (`prep/tasks.py` holds the tasks themselves).

A document (`TaskDoc`) is a list of `Segment`s, each stripped text with the SentencePiece ids it
encodes to alone (= its ids inside the document: pieces never span a space), so token positions
are sums of segment lengths. `Toolkit` is what a generator needs of the tokenizer, `Generator` the
base of a registry entry (`TASKS`, filled by `@register` in tasks.py), `IntRange`/`FloatRange` the
per-document ranges a parameter may be, `parse_value` a CLI string as one of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import numpy as np

from .errors import PrepError
from .passkey_wording import TAKEN_WORDS


@dataclass(frozen=True)
class IntRange:
    """Inclusive integer range, drawn uniformly per document; `64:128` or `96` on the CLI."""
    lo: int
    hi: int

    def draw(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.lo, self.hi + 1))

    def __str__(self) -> str:
        return f"{self.lo}:{self.hi}" if self.lo != self.hi else str(self.lo)


@dataclass(frozen=True)
class FloatRange:
    """Closed float range, drawn uniformly per document; `0:1` or `0.5` on the CLI."""
    lo: float
    hi: float

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.lo, self.hi))

    def __str__(self) -> str:
        return f"{self.lo:g}:{self.hi:g}" if self.lo != self.hi else f"{self.lo:g}"

class Segment(NamedTuple):
    text: str        # stripped, non-empty
    ids: list[int]   # SentencePiece ids of `text` alone (= its ids inside the document)
    role: str        # filler | needle | distractor | question | answer | pair | span | repeat


@dataclass
class TaskDoc:
    """One generated document and where its answers are (token indices into `ids`)."""
    task: str
    segments: list[Segment]
    answers: list[tuple[int, int, int]] = field(default_factory=list)
    """(source start, answer start, length): the tokens at `answer start` copy those at `source
    start` (passkey: the code in the needle; recall: a value; repeat: the span)."""
    depth: float = 0.0
    """Requested relative depth of the (first) source in the filler."""
    actual_depth: float = 0.0
    """Filler tokens before the source / all filler tokens (cut where the text has whitespace)."""

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.segments)

    @property
    def ids(self) -> list[int]:
        return [i for s in self.segments for i in s.ids]

    def start_of(self, index: int) -> int:
        return sum(len(s.ids) for s in self.segments[:index])


class Toolkit:
    """What generators need of the tokenizer: encode, and a pool of whole-word pieces."""

    def __init__(self, sp):
        self.sp = sp
        pieces = [sp.id_to_piece(i) for i in range(sp.vocab_size())]
        # Filler may be cut between two tokens where the text has whitespace (the cut becomes
        # one space): before a piece that starts with it, after one that ends with it.
        ws = {f"<0x{b:02X}>" for b in (9, 10, 11, 12, 13, 32)}
        self.ws_before = np.array([p.startswith("▁") or p in ws for p in pieces])
        self.ws_after = np.array([p.endswith("▁") or p in ws for p in pieces])
        # lower-case alphabetic whole words of >= 4 letters: one token each, for labels/values;
        # none of the passkey evaluation's words, so its wording never appears in a template
        self.words = [p[1:] for p in pieces
                      if p.startswith("▁") and len(p) >= 5 and p[1:].isascii() and p[1:].isalpha()
                      and p[1:].islower() and p[1:] not in TAKEN_WORDS]
        # tokens of the longest pool word alone (1 when every pool word is its own piece)
        self.label_tokens = max(len(self.encode(w)) for w in self.words) if self.words else 0
        if len(self.words) < 64:
            raise PrepError(f"the tokenizer has only {len(self.words)} whole-word pieces of >= 4 "
                            "letters; the task generators need at least 64 (a larger vocabulary)")

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def seg(self, text: str, role: str) -> Segment:
        text = text.strip()
        return Segment(text, self.encode(text), role)

    def pick_words(self, rng: np.random.Generator, n: int) -> list[str]:
        return [self.words[i] for i in rng.choice(len(self.words), n, replace=False)]

    def ids_of(self, words) -> frozenset:
        """The token ids `words` encode to, first in a text and after a space (the same with
        SentencePiece's dummy prefix; without it a first word has no `▁`, a later one has)."""
        head = len(self.encode("a"))
        return frozenset(i for w in words for i in self.encode(w) + self.encode("a " + w)[head:])

    @property
    def digit_ids(self) -> frozenset:
        """Pieces of ASCII digits only (`5`, `▁5`): a split-digits tokenizer's code tokens."""
        return frozenset(i for i in range(self.sp.vocab_size())
                         if (p := self.sp.id_to_piece(i).lstrip("▁")).isascii() and p.isdigit())


# ----------------------------------------------------------------------------- registry
class Generator:
    """A task: `make(rng, take)` builds one document from filler got by `take(n)` (None when
    the input's text is used up). `overhead()` bounds its non-filler tokens, checked once."""
    name: str
    Params: type

    def __init__(self, params, tk: Toolkit):
        self.p, self.tk = params, tk
        need = self.overhead() + MIN_FILLER + 1 + 4  # + EOS + slack of the bound
        if params.length.lo < need:
            raise PrepError(f"--task-set {self.name}.length={params.length}: a {self.name} "
                            f"document with these parameters needs at least {need} tokens")

    def overhead(self) -> int:
        raise NotImplementedError

    def make(self, rng, take: Callable) -> Optional[TaskDoc]:
        raise NotImplementedError

    def answer_alphabet(self) -> Optional[frozenset]:
        """The token ids an answer is drawn from, whatever the document: the candidates of the
        evaluation's no-retrieval baseline (eval/tasks.py). None: any token (an answer of real
        text)."""
        return None


class SkipDocument(Exception):
    """This filler cannot hold the task (e.g. no whitespace where a cut is needed): the filler is
    spent and the next document is drawn."""


TASKS: dict[str, type[Generator]] = {}
MIN_FILLER = 8  # real-text tokens a document holds at least


def register(cls):
    TASKS[cls.name] = cls
    return cls




def _finite(*values) -> None:
    # nan passes every comparison below unnoticed and reaches numpy's samplers as a traceback
    if not all(math.isfinite(v) for v in values if isinstance(v, float)):
        raise ValueError("must be finite")


def parse_value(tp, raw: str, where: str):
    """A CLI string as the field's type (int, float, IntRange, FloatRange)."""
    try:
        if tp in (IntRange, FloatRange):
            conv = int if tp is IntRange else float
            lo, _, hi = raw.partition(":")
            lo_v, hi_v = conv(lo), conv(hi if hi else lo)
            _finite(lo_v, hi_v)
            if lo_v > hi_v or lo_v < 0:
                raise ValueError("need 0 <= lo <= hi")
            return tp(lo_v, hi_v)
        v = tp(raw)
        _finite(v)
        if v < 0:
            raise ValueError("must be >= 0")
        return v
    except ValueError as e:
        raise PrepError(f"{where}: {raw!r} is not a valid {getattr(tp, '__name__', tp)} ({e})") \
            from None
