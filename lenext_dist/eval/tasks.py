"""Task-format retrieval (`lenext eval tasks`): fresh documents of the training task generators
(passkey, recall, repeat, copy; lenext_dist/prep/tasks.py) at lengths beyond the training length, their
filler real text from held-out documents, scored by whether the model copies every answer.

Why beside the LongLoRA passkey (eval/passkey.py): a model that learned far-back copying from task
documents at CPU scale knows their format, not the passkey prompt's; the question a length study
asks of it is whether the skill it has at L survives at 2L..16L (DESIGN section 9's probe, and the
issue of the study regime). The generators are the training ones with only `length` changed, so
the documents differ from training in length and filler alone (held-out text, other seeds).

Score (teacher forced, one forward per document [1, n]): a document counts as right when the argmax
at every answer token is that token (the answer span(s): passkey's code, recall's values, the span of
repeat and copy), which is exactly what greedy decoding would write after the document's own prefix.
`token_accuracy` is the share of answer tokens right.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from lenext_dist.prep.errors import PrepError
from lenext_dist.prep.task_source import FillerStream
from lenext_dist.prep.tasks import TASKS, SkipDocument, TaskDoc, Toolkit, make_params

SLACK = 16
"""Documents of a cell have length - SLACK .. length tokens (the generators need a range)."""


def make_documents(tk: Toolkit, texts: Sequence[str], kind: str, length: int, n: int,
                   seed: int) -> list[TaskDoc]:
    """`n` documents of task `kind`, `length - SLACK`..`length` tokens (EOS excluded), filler
    from `texts` (cycled, so a small held-out set still fills long documents)."""
    if kind not in TASKS:
        raise ValueError(f"unknown task {kind!r} (known: {', '.join(TASKS)})")
    try:
        gen = TASKS[kind](make_params(kind, {"length": f"{max(1, length - SLACK)}:{length}"}), tk)
    except PrepError as e:  # the generator's own bound, in its data-prep words
        raise ValueError(f"length {length} is too short for a {kind} document ({e})") from None
    if not any(t.strip() for t in texts):
        raise ValueError("no filler text: --data holds no text")
    stream = FillerStream(itertools.cycle(texts), tk)
    rng = np.random.default_rng(seed)
    docs: list[TaskDoc] = []
    for _ in range(100 * n):  # bounded: a filler that never fits ends in an error, not a hang
        try:
            doc = gen.make(rng, stream.take)
        except SkipDocument:
            continue
        if doc is not None:
            docs.append(doc)
            if len(docs) == n:
                return docs
    raise ValueError(f"{kind}: made {len(docs)} of {n} documents of {length} tokens from --data "
                     "in 100 tries each; the text may be too short or have too little whitespace")


def score(model: nn.Module, ids: list[int], answers: Iterable[tuple[int, int, int]],
          pad_to: int = 0, pad_id: int = 0) -> tuple[int, int]:
    """(answer tokens right, answer tokens) of one document `ids` (answers index into `ids`).
    pad_to: right-pad the input to this many tokens with `pad_id`. Attention is causal, so the
    padding changes no scored logit; it gives every document of a length one shape, which a
    compiled kernel (FlexAttention on CPU, attention/paths.py) then compiles once instead of per
    document (~30 s each for a window at 2K here)."""
    device = next(model.parameters()).device
    x = ids + [pad_id] * max(0, pad_to - len(ids))
    with torch.inference_mode():
        pred = model(input_ids=torch.tensor([x], device=device)).logits[0].argmax(-1).cpu()
    target = torch.tensor(ids)
    right = total = 0
    for _, start, k in answers:
        right += int((pred[start - 1:start - 1 + k] == target[start:start + k]).sum())
        total += k
    return right, total


def run_tasks(model: nn.Module, sp, texts: Sequence[str], lengths: Sequence[int],
              kinds: Sequence[str], *, docs: int = 32, seed: int = 0, bos: bool = False,
              progress: bool = True) -> dict:
    """Accuracy per (task, length): the share of documents with every answer token right."""
    tk = Toolkit(sp)
    head = [sp.bos_id()] if bos else []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(kinds) * len(lengths) * docs, desc="tasks", unit="doc", leave=False,
                   disable=None)
    cells, examples = [], []
    for ki, kind in enumerate(kinds):
        for li, length in enumerate(lengths):
            # the same documents for every model and scale: seeded by (seed, task, length)
            made = make_documents(tk, texts, kind, length - len(head), docs,
                                  seed=seed * 1_000_003 + ki * 10_007 + li)
            exact = right = total = 0
            first = None
            for doc in made:
                ids = head + doc.ids
                answers = [(s + len(head), a + len(head), k) for s, a, k in doc.answers]
                first = first or [sp.decode(ids[a:a + k]) for _, a, k in answers]
                r, t = score(model, ids, answers, pad_to=length, pad_id=sp.eos_id())
                exact += r == t
                right, total = right + r, total + t
                if len(examples) < 3 * len(kinds) * len(lengths) and r != t:
                    examples.append({"task": kind, "length": len(ids), "depth": doc.actual_depth,
                                     "answers": [sp.decode(ids[a:a + k]) for _, a, k in answers]})
                if bar is not None:
                    bar.update(1)
            cells.append({"task": kind, "length": length, "accuracy": exact / len(made),
                          "token_accuracy": right / max(total, 1), "documents": len(made),
                          "answer_tokens": total, "first_answers": first,
                          "tokens": [min(len(head) + len(d.ids) for d in made),
                                     max(len(head) + len(d.ids) for d in made)]})
    if bar is not None:
        bar.close()
    acc = {k: [c["accuracy"] for c in cells if c["task"] == k] for k in kinds}
    return {"kind": "tasks", "lengths": list(lengths), "tasks": list(kinds), "cells": cells,
            "accuracy": acc, "missed_examples": examples,
            "protocol": {"documents": f"{docs} per (task, length), the training generators "
                         f"(lenext_dist/prep/tasks.py) with length {SLACK} tokens below the "
                         "target at most, filler from --data cycled, right-padded with EOS to "
                         "the target (causal: the padding changes no scored logit)",
                         "score": "teacher forced: right when the argmax at every answer token is "
                         "that token (= greedy decoding of the answer)", "seed": seed, "bos": bos}}
