"""The `tasks` input format: an input file's real text becomes the filler of generated documents.

`shard.py --format tasks --tasks passkey,recall,repeat --input <corpus>` reads each input file
(`.jsonl[.zst]` text under --text-key, `.parquet` column `content`, `.txt`) as a stream of
SentencePiece tokens, cut only where the text has whitespace, and hands it to the generators of tasks.py, which
consume it in order: one pass over the text (`--task-passes` for more) makes as many documents as
it fills. The reader yields the documents' text to the ordinary write path (worker.py), which
tokenizes it again to the same ids (tasks.py says why) and writes shards and manifest as for any
source.

Determinism: an input file is one unit of work, and its documents depend only on (the task spec,
`--task-seed`, the file's bytes): the generator's RNG is seeded with the seed and the file's
sha256, never with its path or the worker that runs it. So the bytes are the same for any
--workers / --num-tasks and on any machine with the same tokenizer.
"""
from __future__ import annotations

import os
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from .errors import Bad, PrepError
from .readers import Doc, JsonlReader, ParquetReader, TxtReader
from .tasks import (MIN_FILLER, TASKS, SkipDocument, TaskDoc, Toolkit, make_params,
                    params_to_json)
from .tokenizer import get_tokenizer, sha256_file


class Filler:
    """A run of real-text tokens from the stream: `ids` [n] with the cut points `bounds`
    (sorted indices in [0, n], 0 and n included) where it may be cut."""

    def __init__(self, ids: np.ndarray, bounds: np.ndarray, tk: Toolkit):
        self.ids, self.bounds, self.tk = ids, bounds, tk
        self.cuts: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def snap(self, pos: int) -> int:
        """The cut point nearest token position `pos` (the earlier one on a tie)."""
        b = self.bounds
        i = int(np.searchsorted(b, pos))
        if i == 0:
            return int(b[0])
        if i == len(b) or pos - b[i - 1] <= b[i] - pos:
            return int(b[i - 1])
        return int(b[i])

    def split(self, fractions: Sequence[float]) -> list:
        """Cut at the cut points nearest `fractions` (sorted) of the length: len+1 parts."""
        self.cuts = [self.snap(int(round(f * len(self)))) for f in fractions]
        return self.split_at(self.cuts)

    def split_at(self, positions: Sequence[int]) -> list:
        edges = [0, *positions, len(self)]
        return [self._segment(a, b) for a, b in zip(edges, edges[1:])]

    def span_near(self, pos: int, n: int) -> Optional[tuple[int, int]]:
        """(start, end): cut points with 0 < end - start <= n, start nearest `pos`."""
        b = self.bounds
        ok = np.flatnonzero(np.diff(b) <= n)  # word i fits: b[i+1] - b[i] <= n
        if len(ok) == 0:
            return None
        i = ok[np.argmin(np.abs(b[ok] - pos))]
        end = b[np.searchsorted(b, b[i] + n, side="right") - 1]
        return int(b[i]), int(end)

    def _segment(self, a: int, b: int):
        if b <= a:
            return None
        text = self.tk.sp.decode(self.ids[a:b].tolist()).strip()
        return self.tk.seg(text, "filler") if text else None


class FillerStream:
    """Word-aligned real text, consumed front to back by `take`."""

    def __init__(self, texts: Iterator[str], tk: Toolkit):
        self.texts, self.tk = texts, tk
        self.ids = np.zeros(0, np.int64)
        self.starts = np.zeros(0, bool)  # [n]: whitespace (or a source document) before token i
        self.done = False

    def _refill(self) -> None:
        for text in self.texts:
            ids = np.asarray(self.tk.encode(text), np.int64)
            if len(ids):
                starts = self.tk.ws_before[ids]
                starts[1:] |= self.tk.ws_after[ids[:-1]]
                starts[0] = True  # a document boundary is a cut point
                self.ids = np.concatenate([self.ids, ids])
                self.starts = np.concatenate([self.starts, starts])
                return
        self.done = True

    def take(self, n: int) -> Optional[Filler]:
        """The longest run of <= n tokens that ends at a cut point; None when the text is used
        up. Runs without any cut point in their first n tokens are dropped."""
        n = max(n, MIN_FILLER)
        while True:
            while len(self.ids) <= n and not self.done:
                self._refill()
            avail = len(self.ids)
            if avail < n and self.done:
                return None
            ends = np.flatnonzero(self.starts[1:n + 1]) + 1  # cut before token i, i in (0, n]
            if avail == n and self.done:
                ends = np.append(ends, n)
            if len(ends) == 0:  # one "word" longer than n tokens (a run with no spaces)
                nxt = np.flatnonzero(self.starts[n + 1:])
                cut = n + 1 + int(nxt[0]) if len(nxt) else avail
                self.ids, self.starts = self.ids[cut:], self.starts[cut:]
                continue
            end = int(ends[-1])
            ids, starts = self.ids[:end], self.starts[:end]
            self.ids, self.starts = self.ids[end:], self.starts[end:]
            return Filler(ids, np.append(np.flatnonzero(starts), end), self.tk)


# ----------------------------------------------------------------------------- documents
_TOOLKITS: dict = {}


def toolkit(tok) -> Toolkit:
    """One Toolkit per tokenizer model per process (tok: prep.tokenizer.SpmTokenizer)."""
    if tok.path not in _TOOLKITS:
        _TOOLKITS[tok.path] = Toolkit(tok.sp)
    return _TOOLKITS[tok.path]


def source_reader(path: str, text_key: Optional[str]):
    """The real text of an input file, by extension."""
    if path.endswith(".parquet"):
        return ParquetReader(path, text_key or "content")
    if path.endswith(".txt"):
        return TxtReader(path)
    return JsonlReader(path, text_key or "text")


def generators(spec: dict, tk: Toolkit) -> list:
    return [TASKS[g["name"]](make_params(g["name"], g["params"]), tk) for g in spec["generators"]]


def generate(path: str, text_key: Optional[str], spec: dict, tok,
             reader_box: Optional[list] = None) -> Iterator[Union[TaskDoc, Bad]]:
    """The task documents of one input file, in order (and the source's Bad records, once)."""
    tk = toolkit(tok)
    gens = generators(spec, tk)
    weights = np.array([g["weight"] for g in spec["generators"]], float)
    weights /= weights.sum()
    rng = np.random.default_rng([int(spec["seed"]), int(sha256_file(path)[:16], 16)])
    bad: list[Bad] = []
    checked = 0  # documents whose planned ids were checked against one encode of their text
    for pass_i in range(int(spec["passes"])):
        src = source_reader(path, text_key)
        if reader_box is not None:
            reader_box[:] = [src, pass_i]

        def texts(src=src, first=pass_i == 0):
            for rec in src:
                if isinstance(rec, Bad):
                    if first:  # reported once, not once per pass
                        bad.append(rec)
                elif not rec.text.isspace():
                    yield rec.text

        stream = FillerStream(texts(), tk)
        while True:
            gen = gens[int(rng.choice(len(gens), p=weights))]
            try:
                doc = gen.make(rng, stream.take)
                # a cut after a line break re-encodes the next word with its space, which can
                # cost a token more than planned: such a (rare) document would pass the bound
                if doc and len(doc.ids) + 1 > gen.p.length.hi:
                    raise SkipDocument
            except SkipDocument:
                doc = False
            yield from bad
            bad.clear()
            if doc is None:
                break
            if doc:
                checked += 1
                if checked <= 16 and tok.sp.encode(doc.text) != doc.ids:
                    raise PrepError(
                        f"{tok.path}: this SentencePiece model merges pieces across a space, so "
                        "task documents' token positions cannot be planned; --format tasks needs "
                        "a model trained with split_by_whitespace (the default)")
                yield doc


class TaskReader:
    """A reader (readers.py protocol) of generated documents: yields Doc(text) and Bad."""

    def __init__(self, path: str, text_key: Optional[str], spec: dict, tokenizer):
        if not spec:
            raise PrepError("--format tasks needs --tasks (e.g. --tasks passkey,recall,repeat)")
        self.path, self.text_key, self.spec, self.tok = path, text_key, spec, tokenizer
        self.bytes_done = 0
        self._box: list = []

    def __iter__(self):
        size, passes = os.path.getsize(self.path), int(self.spec["passes"])
        for item in generate(self.path, self.text_key, self.spec, self.tok, self._box):
            if self._box:  # progress: bytes of the source file over all passes
                src, p = self._box
                self.bytes_done = (p * size + src.bytes_done) // passes
            yield item if isinstance(item, Bad) else Doc(
                item.text, None, tuple((start, k) for _, start, k in item.answers))
        self.bytes_done = size


# ----------------------------------------------------------------------------- the CLI's spec
MAX_TASK_WEIGHT = 1e6


def task_spec(tasks: str, sets: Sequence[str], seed: int, passes: int) -> dict:
    """`--tasks a,b:2 --task-set [task.]field=value ... --task-seed S --task-passes K` as the
    JSON spec recorded in the plan (and fingerprinted: it decides the output bytes)."""
    chosen: dict[str, float] = {}
    for item in (x.strip() for x in tasks.split(",") if x.strip()):
        name, _, w = item.partition(":")
        if name not in TASKS:
            raise PrepError(f"--tasks: unknown task {name!r} (choose from {', '.join(TASKS)})")
        try:
            weight = float(w) if w else 1.0
        except ValueError:
            weight = -1.0
        if not 0 < weight <= MAX_TASK_WEIGHT:  # inf, nan, 1e308 (the sum overflows): refused
            raise PrepError(f"--tasks {item}: the weight after ':' must be a number > 0 "
                            f"(and at most {MAX_TASK_WEIGHT:,.0f}; weights are relative)")
        chosen[name] = weight
    if not chosen:
        raise PrepError("--tasks: name at least one task (e.g. passkey,recall,repeat)")
    if passes < 1:
        raise PrepError(f"--task-passes must be >= 1, got {passes}")
    if seed < 0:  # numpy seeds are non-negative
        raise PrepError(f"--task-seed must be >= 0, got {seed}")
    overrides: dict[str, dict[str, str]] = {n: {} for n in chosen}
    for s in sets:
        key, eq, value = s.partition("=")
        if not eq:
            raise PrepError(f"--task-set {s!r}: expected [task.]field=value, e.g. length=48:64")
        name, dot, fld = key.strip().rpartition(".")
        if dot and name not in chosen:
            raise PrepError(f"--task-set {s}: {name!r} is not among --tasks ({', '.join(chosen)})")
        targets = [name] if dot else [n for n in chosen if fld in TASKS[n].Params.__annotations__]
        if not targets:
            raise PrepError(f"--task-set {s}: no task in --tasks has a parameter {fld!r}")
        for n in targets:
            overrides[n][fld] = value.strip()
    # answer_mask: the run writes <shard>_answers beside each shard (a run of an earlier version,
    # without masks, has another fingerprint and is not silently resumed)
    return {"seed": int(seed), "passes": int(passes), "answer_mask": True,
            "generators": [{"name": n, "weight": w,
                            "params": params_to_json(make_params(n, overrides[n]))}
                           for n, w in chosen.items()]}


def checked_task_spec(tasks: str, sets: Sequence[str], seed: int, passes: int,
                      tokenizer: str) -> dict:
    """task_spec, with every generator built once on the tokenizer (so a document length too
    short for its parameters is a one-line error before any work starts)."""
    spec = task_spec(tasks, sets, seed, passes)
    generators(spec, toolkit(get_tokenizer(os.path.abspath(tokenizer), 1)))
    return spec
