"""Generated long-context task documents (`shard.py --format tasks`): the generators.

Why: a small model trained on text alone uses a few tokens of context, so length-extension methods
have nothing to fix (DESIGN.md section 9). Documents that pay for ordered, far-back copying of
several tokens (not retrieval of one token by content, which needs no position) are the lever:

  passkey  a code of digits hidden in real-text filler among distractor codes, asked for at the end
  recall   several key -> value pairs (values several words long) scattered in filler, queried at
           the end
  repeat   a real-text span recurs at the end of the document (an induction head pays)
  copy     a span of random words in the text recurs at the end (only an induction head pays)
  kv       `key K is v1 .. vn .` in filler among distractor keys, asked as `key K is` at the end
           (the paper's passkey in its induction-aligned form)

Every generator is a registry entry (`TASKS`) with a typed parameter dataclass (docstring under
each field, rendered into docs/data-preparation.md by `task_reference`). What every task shares
(documents as segments with exact token positions, the tokenizer's toolkit, the registry's base,
parameter ranges) is in task_base.py. The wording ("vault", "code", "Entry", "Recall") is a format
family of its own: none of the passkey evaluation's template (prep/passkey_wording.py) occurs.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from .errors import PrepError
from .task_base import (MIN_FILLER, TASKS, FloatRange, Generator, IntRange, Segment,  # noqa: F401
                        SkipDocument, TaskDoc, Toolkit, parse_value, register)


def _require(cond: bool, task: str, key: str, value, msg: str) -> None:
    if not cond:
        raise PrepError(f"--task-set {task}.{key}={value}: {msg}")


def _check_common(p, task: str) -> None:
    _require(p.length.lo >= 1, task, "length", p.length, "must be >= 1")
    _require(p.depth.hi <= 1.0, task, "depth", p.depth, "must lie in [0, 1]")


def _digits(rng, n: int) -> str:
    return "".join(str(d) for d in rng.integers(0, 10, n))


def _interleave(filler_parts, inserts):
    """filler_0 insert_0 filler_1 insert_1 ... filler_n (empty filler parts dropped)."""
    out = []
    for i, part in enumerate(filler_parts):
        if part is not None:
            out.append(part)
        if i < len(inserts):
            out.extend(inserts[i])
    return out


def _depth(filler, cut_index: int) -> float:
    """Filler tokens before cut `cut_index` of the last split / all filler tokens."""
    return filler.cuts[cut_index] / max(len(filler), 1)


def _index(segs: list, seg: Segment) -> int:
    return next(i for i, s in enumerate(segs) if s is seg)  # by identity: texts may repeat


@dataclass(frozen=True)
class PasskeyParams:
    length: IntRange = IntRange(64, 96)
    """Document tokens, EOS included: <= L, and well below it so that most documents land whole
    in one packed training sequence of L tokens."""
    key_digits: IntRange = IntRange(4, 7)
    """Digits of the code (one token each with split digits)."""
    depth: FloatRange = FloatRange(0.0, 1.0)
    """Relative depth of the code in the filler (0 = first, 1 = just before the question)."""
    distractors: int = 1
    """Other vaults with other codes, at random depths."""

    def __post_init__(self):
        _check_common(self, "passkey")
        _require(self.key_digits.lo >= 1, "passkey", "key_digits", self.key_digits, "must be >= 1")


@register
class Passkey(Generator):
    """`Vault <label> opens with code <digits>.` in real text (+ distractor vaults); the document
    ends `Which code opens vault <label>? <digits>.`"""
    name, Params = "passkey", PasskeyParams

    def overhead(self) -> int:
        p, lab = self.p, self.tk.label_tokens
        # label '<word>' is `lab` tokens, without it the template has a lone '▁' (the - 1);
        # the code is '▁' + digits + '.'
        code = p.key_digits.hi + 2
        needle = len(self.tk.encode("Vault opens with code")) + lab + code
        question = len(self.tk.encode("Which code opens vault ?")) - 1 + lab + code
        return needle * (1 + p.distractors) + question

    def make(self, rng, take):
        p, tk = self.p, self.tk
        labels = tk.pick_words(rng, 1 + p.distractors)
        codes = [_digits(rng, p.key_digits.draw(rng)) for _ in labels]
        depth = p.depth.draw(rng)
        statements = [[tk.seg(f"Vault {lab} opens with code", "needle" if i == 0 else "distractor"),
                       tk.seg(f"{code}.", "needle" if i == 0 else "distractor")]
                      for i, (lab, code) in enumerate(zip(labels, codes))]
        tail = [tk.seg(f"Which code opens vault {labels[0]}?", "question"),
                tk.seg(f"{codes[0]}.", "answer")]
        fixed = sum(len(s.ids) for st in statements + [tail] for s in st)
        filler = take(p.length.draw(rng) - 1 - fixed)
        if filler is None:
            return None
        where = [depth] + [float(rng.uniform()) for _ in range(p.distractors)]
        order = sorted(range(len(where)), key=lambda i: (where[i], i))
        parts = filler.split([where[i] for i in order])
        segs = _interleave(parts, [statements[i] for i in order]) + tail
        doc = TaskDoc(self.name, segs, depth=depth,
                      actual_depth=_depth(filler, order.index(0)))
        needle = _index(segs, statements[0][1])
        # the answer: '▁' and the digits (the segment's ids less its final '.')
        doc.answers.append((doc.start_of(needle), doc.start_of(len(segs) - 1), len(tail[1].ids) - 1))
        return doc

    def answer_alphabet(self) -> frozenset:
        return self.tk.digit_ids


@dataclass(frozen=True)
class RecallParams:
    length: IntRange = IntRange(64, 96)
    """Document tokens, EOS included: <= L, and well below it so that most documents land whole
    in one packed training sequence of L tokens."""
    pairs: int = 3
    """Key -> value entries scattered in the filler."""
    queries: int = 2
    """Entries asked for at the end (distinct, random order; <= pairs)."""
    value_words: int = 3
    """Words per value (one token each): the answer is this many tokens, in order."""
    depth: FloatRange = FloatRange(0.0, 1.0)
    """Relative depths of the entries in the filler (each drawn uniformly)."""

    def __post_init__(self):
        _check_common(self, "recall")
        _require(1 <= self.queries <= self.pairs, "recall", "queries", self.queries,
                 f"must be in 1..pairs ({self.pairs})")
        _require(self.value_words >= 1, "recall", "value_words", self.value_words, "must be >= 1")


@register
class Recall(Generator):
    """`Entry <key>: <w1 w2 w3>.` x pairs in real text; the document ends with
    `Recall <key>: <w1 w2 w3>.` for `queries` of them."""
    name, Params = "recall", RecallParams

    def overhead(self) -> int:
        p, lab = self.p, self.tk.label_tokens
        value = lab * p.value_words + 1  # words + '.'
        entry = len(self.tk.encode("Entry :")) - 1 + lab + value
        query = len(self.tk.encode("Recall :")) - 1 + lab + value
        return entry * p.pairs + query * p.queries

    def make(self, rng, take):
        p, tk = self.p, self.tk
        words = tk.pick_words(rng, p.pairs * (1 + p.value_words))
        keys = words[:p.pairs]
        values = [" ".join(words[p.pairs + i * p.value_words:p.pairs + (i + 1) * p.value_words])
                  for i in range(p.pairs)]
        entries = [[tk.seg(f"Entry {k}:", "pair"), tk.seg(f"{v}.", "pair")]
                   for k, v in zip(keys, values)]
        asked = [int(i) for i in rng.choice(p.pairs, p.queries, replace=False)]
        tail = [[tk.seg(f"Recall {keys[i]}:", "question"), tk.seg(f"{values[i]}.", "answer")]
                for i in asked]
        fixed = sum(len(s.ids) for st in entries + tail for s in st)
        filler = take(p.length.draw(rng) - 1 - fixed)
        if filler is None:
            return None
        where = [p.depth.draw(rng) for _ in range(p.pairs)]
        order = sorted(range(p.pairs), key=lambda i: (where[i], i))
        parts = filler.split([where[i] for i in order])
        segs = _interleave(parts, [entries[i] for i in order])
        value_at = {i: doc_i for i in range(p.pairs) for doc_i, s in enumerate(segs)
                    if s is entries[i][1]}
        first = asked[0]
        doc = TaskDoc(self.name, segs + [s for q in tail for s in q], depth=where[first],
                      actual_depth=_depth(filler, order.index(first)))
        for qi, i in enumerate(asked):
            ans = len(segs) + 2 * qi + 1
            doc.answers.append((doc.start_of(value_at[i]), doc.start_of(ans),
                                len(entries[i][1].ids) - 1))  # the words, less the final '.'
        return doc

    def answer_alphabet(self) -> frozenset:
        return self.tk.ids_of(self.tk.words)


@dataclass(frozen=True)
class RepeatParams:
    length: IntRange = IntRange(64, 96)
    """Document tokens, EOS included: <= L, and well below it so that most documents land whole
    in one packed training sequence of L tokens."""
    span: IntRange = IntRange(8, 16)
    """Tokens of the repeated real-text span (cut at whitespace: may come out a word shorter)."""
    depth: FloatRange = FloatRange(0.0, 0.5)
    """Relative depth of the span's first occurrence in the filler; the repeat ends the document."""

    def __post_init__(self):
        _check_common(self, "repeat")
        _require(self.span.lo >= 1, "repeat", "span", self.span, "must be >= 1")


@register
class Repeat(Generator):
    """Real text in which a span (at `depth`) recurs verbatim at the end, with no marker."""
    name, Params = "repeat", RepeatParams

    def overhead(self) -> int:
        return self.p.span.hi

    def make(self, rng, take):
        p = self.p
        span = p.span.draw(rng)
        depth = p.depth.draw(rng)
        filler = take(p.length.draw(rng) - 1 - span)
        if filler is None or len(filler) <= span:
            return None
        cut = filler.span_near(int(round(depth * (len(filler) - span))), span)
        if cut is None:  # no whole word of <= span tokens in this filler (a run without spaces)
            raise SkipDocument
        start, end = cut
        before, first, after = filler.split_at([start, end])
        if first is None:  # the span is whitespace only
            raise SkipDocument
        first = Segment(first.text, first.ids, "span")
        segs = [s for s in (before, first, after) if s is not None] + \
            [Segment(first.text, first.ids, "repeat")]
        doc = TaskDoc(self.name, segs, depth=depth,
                      actual_depth=start / max(len(filler) - span, 1))
        src = _index(segs, first)
        doc.answers.append((doc.start_of(src), doc.start_of(len(segs) - 1), len(first.ids)))
        return doc


@dataclass(frozen=True)
class CopyParams:
    length: IntRange = IntRange(64, 96)
    """Document tokens, EOS included: <= L, and well below it so that most documents land whole
    in one packed training sequence of L tokens."""
    span: IntRange = IntRange(4, 12)
    """Random pool words (one token each) in the copied span."""
    depth: FloatRange = FloatRange(0.0, 0.5)
    """Relative depth of the span's first occurrence in the filler; the copy ends the document."""

    def __post_init__(self):
        _check_common(self, "copy")
        _require(self.span.lo >= 1, "copy", "span", self.span, "must be >= 1")


@register
class Copy(Generator):
    """Real text holding a span of random words (at `depth`) that recurs at the end, no marker.
    Unlike `repeat`, language cannot guess the copy: only reading it back (an induction head)
    pays, the circuit every ordered far-back copy needs (DESIGN section 9)."""
    name, Params = "copy", CopyParams

    def overhead(self) -> int:
        return 2 * self.p.span.hi * max(self.tk.label_tokens, 1)

    def make(self, rng, take):
        p, tk = self.p, self.tk
        words = tk.pick_words(rng, min(p.span.draw(rng), len(tk.words)))
        first = tk.seg(" ".join(words), "span")
        depth = p.depth.draw(rng)
        filler = take(p.length.draw(rng) - 1 - 2 * len(first.ids))
        if filler is None:
            return None
        before, after = filler.split([depth])
        segs = [s for s in (before, first, after) if s is not None] + \
            [Segment(first.text, first.ids, "repeat")]
        doc = TaskDoc(self.name, segs, depth=depth, actual_depth=_depth(filler, 0))
        doc.answers.append((doc.start_of(_index(segs, first)), doc.start_of(len(segs) - 1),
                            len(first.ids)))
        return doc

    def answer_alphabet(self) -> frozenset:
        return self.tk.ids_of(self.tk.words)


@dataclass(frozen=True)
class KVParams:
    length: IntRange = IntRange(64, 64)
    """Document tokens, EOS included. One value (64) makes every document exactly L tokens when
    the filler can be cut at every token (the synthetic filler, `lenext prep kv`): one
    document is then one training sample and packing never separates a needle from its answer."""
    values: IntRange = IntRange(4, 5)
    """Value symbols in the answer (one token each; ordered copying of several tokens needs an
    induction circuit, i.e. position)."""
    symbols: int = 32
    """Distinct value symbols: the first `symbols` of the tokenizer's whole-word pieces of >= 4
    letters, in alphabetical order (the synthetic tokenizer's value words)."""
    keys: int = 32
    """Distinct keys: the next `keys` whole-word pieces after the value symbols."""
    distractors: IntRange = IntRange(0, 0)
    """Needles of other keys (other values) at random depths: 1-3 is the harder variant, where
    the question's key, not only the marker, must select the needle."""
    depth: FloatRange = FloatRange(0.0, 1.0)
    """Relative depth of the needle in the filler (0 = first, 1 = just before the question)."""
    tail: IntRange = IntRange(0, 0)
    """Filler tokens after the answer (no loss on them). With one document length, 0 puts the
    question and answer at the same positions in every document: a model whose attention is cut
    into chunks (iRoPE) then never sees them on two sides of a chunk boundary in training, as the
    evaluation's documents (SLACK tokens shorter at most) put them (experiments/nope_layouts)."""

    def __post_init__(self):
        _check_common(self, "kv")
        _require(self.tail.lo >= 0, "kv", "tail", self.tail, "must be >= 0")
        _require(self.values.lo >= 1, "kv", "values", self.values, "must be >= 1")
        _require(self.symbols >= 2, "kv", "symbols", self.symbols, "must be >= 2")
        _require(self.keys >= 1 + self.distractors.hi, "kv", "keys", self.keys,
                 f"must exceed distractors ({self.distractors.hi})")


@register
class KeyValue(Generator):
    """`key <K> is <v1 .. vn> .` at a uniform depth in filler (+ distractor needles of other
    keys); the document ends with the same wording `key <K> is` and the answer `<v1 .. vn>`: the
    paper's passkey in its induction-aligned form (the question repeats the needle's words, so
    match-and-copy finds the answer). The answer is the value tokens only, never a format token."""
    name, Params = "kv", KVParams

    def __init__(self, params, tk: Toolkit):
        pool = sorted(tk.words)
        if params.symbols + params.keys > len(pool):
            raise PrepError(f"--task-set kv.symbols={params.symbols}, kv.keys={params.keys}: the "
                            f"tokenizer has {len(pool)} whole-word pieces of >= 4 letters")
        self.symbols = pool[:params.symbols]
        self.key_words = pool[params.symbols:params.symbols + params.keys]
        super().__init__(params, tk)

    def overhead(self) -> int:
        p, lab = self.p, self.tk.label_tokens
        marker = len(self.tk.encode("key is"))
        needle = marker + lab + lab * p.values.hi + len(self.tk.encode("."))
        return needle * (1 + p.distractors.hi) + marker + lab + lab * p.values.hi + p.tail.hi

    def make(self, rng, take):
        p, tk = self.p, self.tk
        n_keys = 1 + p.distractors.draw(rng)
        keys = [self.key_words[i] for i in rng.choice(len(self.key_words), n_keys, replace=False)]
        values = [" ".join(self.symbols[j] for j in rng.integers(0, len(self.symbols),
                                                                 p.values.draw(rng)))
                  for _ in keys]
        depth = p.depth.draw(rng)
        needles = [[tk.seg(f"key {k} is", "needle" if i == 0 else "distractor"),
                    tk.seg(v, "needle" if i == 0 else "distractor"),
                    tk.seg(".", "needle" if i == 0 else "distractor")]
                   for i, (k, v) in enumerate(zip(keys, values))]
        ask = [tk.seg(f"key {keys[0]} is", "question"), tk.seg(values[0], "answer")]
        fixed = sum(len(s.ids) for st in needles + [ask] for s in st)
        filler = take(p.length.draw(rng) - 1 - fixed)
        if filler is None:
            return None
        where = [depth] + [float(rng.uniform()) for _ in range(n_keys - 1)]
        order = sorted(range(n_keys), key=lambda i: (where[i], i))
        after = p.tail.draw(rng) if p.tail.hi else 0  # no draw: documents of tail 0 as before it
        body = max(len(filler) - after, 0) / max(len(filler), 1)  # the filler before the question
        parts = filler.split([where[i] * body for i in order] + ([body] if after else []))
        segs = _interleave(parts[:n_keys + 1], [needles[i] for i in order]) + ask
        segs += [q for q in parts[n_keys + 1:] if q is not None]  # the filler after the answer
        doc = TaskDoc(self.name, segs, depth=depth,
                      actual_depth=filler.cuts[order.index(0)] / max(body * len(filler), 1))
        doc.answers.append((doc.start_of(_index(segs, needles[0][1])),
                            doc.start_of(_index(segs, ask[1])), len(ask[1].ids)))
        return doc

    def answer_alphabet(self) -> frozenset:
        return self.tk.ids_of(self.symbols)


# ----------------------------------------------------------------------------- parameters
def make_params(name: str, overrides: dict[str, str]):
    """The typed parameters of task `name` with `field=value` strings applied."""
    cls = TASKS[name].Params
    hints = typing.get_type_hints(cls)
    kw = {}
    for key, raw in overrides.items():
        if key not in hints:
            raise PrepError(f"--task-set {name}.{key}: {name} has no parameter {key!r} "
                            f"(it has {', '.join(hints)})")
        kw[key] = parse_value(hints[key], raw, f"--task-set {name}.{key}")
    return cls(**kw)


def params_to_json(params) -> dict:
    return {f.name: str(getattr(params, f.name)) for f in dataclasses.fields(params)}


def task_reference() -> str:
    """The table of every task's parameters in docs/data-preparation.md, from the dataclass field
    docstrings."""
    from ..config.docs import _field_docs

    lines = ["| task | parameter | default | meaning |", "|---|---|---|---|"]
    for name, gen in TASKS.items():
        docs = _field_docs(gen.Params)
        for f in dataclasses.fields(gen.Params):
            lines.append(f"| `{name}` | `{f.name}` | `{f.default}` | {docs.get(f.name, '')} |")
    return "\n".join(lines)
