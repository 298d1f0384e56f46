"""Task-format retrieval (`lenext eval tasks`): fresh documents of the training task generators
(passkey, recall, repeat, copy; lenext_dist/prep/tasks.py) at lengths beyond the training length, their
filler real text from held-out documents, scored by whether the model copies every answer.

Why beside the LongLoRA passkey (eval/passkey.py): a model that learned far-back copying from task
documents at CPU scale knows their format, not the passkey prompt's; the question a length study
asks of it is whether the skill it has at L survives at 2L..16L (DESIGN section 9's probe, and the
issue of the kv regime). The generators are the training ones with only `length` changed, so
the documents differ from training in length and filler alone (held-out text, other seeds).

Score (teacher forced, one forward per document [1, n]): a document counts as right when the argmax
at every answer token is that token (the answer span(s): passkey's code, recall's values, the span of
repeat and copy), which is exactly what greedy decoding would write after the document's own prefix.
`token_accuracy` is the share of answer tokens right.
"""
from __future__ import annotations

import hashlib
import itertools
from typing import Collection, Iterable, Optional, Sequence

import numpy as np
import torch
from torch import nn

from lenext_dist.prep.errors import PrepError
from lenext_dist.prep.task_source import FillerStream, task_spec
from lenext_dist.prep.tasks import TASKS, Generator, SkipDocument, TaskDoc, Toolkit, make_params

SLACK = 16
"""Documents of a cell have length - SLACK .. length tokens (the generators need a range)."""


def generator(tk: Toolkit, kind: str, length: int, params: Optional[dict] = None):
    """The training generator of task `kind` for documents of `length - SLACK`..`length` tokens.
    params: other generator parameters (field -> CLI string; `length` is the cell's)."""
    if kind not in TASKS:
        raise ValueError(f"unknown task {kind!r} (known: {', '.join(TASKS)})")
    try:
        return TASKS[kind](make_params(kind, {**(params or {}),
                                              "length": f"{max(1, length - SLACK)}:{length}"}), tk)
    except PrepError as e:  # the generator's own bound, in its data-prep words
        raise ValueError(f"length {length} is too short for a {kind} document ({e})") from None


def make_documents(gen: Generator, texts: Sequence[str], n: int, seed: int) -> list[TaskDoc]:
    """`n` documents of generator `gen` (see `generator`), filler from `texts` (cycled, so a
    small held-out set still fills long documents)."""
    if not any(t.strip() for t in texts):
        raise ValueError("no filler text: --data holds no text")
    stream = FillerStream(itertools.cycle(texts), gen.tk)
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
    raise ValueError(f"{gen.name}: made {len(docs)} of {n} documents of {gen.p.length.hi} tokens "
                     "from --data in 100 tries each; the text may be too short or have too little "
                     "whitespace")


def cell_seed(seed: int, task: str, length: int) -> int:
    """The documents' generator seed of one (task, length) cell: the same documents for every
    model and scale, and for every list the cell is in (seeded by the task's name and the
    length's value, not their places in --tasks and --lengths: `--lengths 512` and
    `--lengths 256,512` score the same documents at 512)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{task}/{length}".encode()).digest()[:8], "little")


def content_tokens(sp) -> np.ndarray:
    """[vocab] bool: pieces that carry content (a letter or digit). A format piece (a bare `▁`,
    punctuation) is never scored as an answer token: a rule that never retrieves gets it right
    (every passkey code of a 4K-piece tokenizer starts with a bare `▁`; issue of the kv regime)."""
    return np.array([any(ch.isalnum() for ch in sp.id_to_piece(i)) and not sp.is_control(i)
                     and not sp.is_unknown(i) for i in range(sp.vocab_size())])


def answer_positions(ids: Sequence[int], answers: Iterable[tuple[int, int, int]],
                     content: np.ndarray) -> list[int]:
    """Indices into `ids` of the scored answer tokens: the answer spans less format pieces."""
    return [i for _, start, k in answers for i in range(start, start + k) if content[ids[i]]]


def score(model: nn.Module, ids: list[int], positions: Sequence[int], pad_to: int = 0,
          pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(right [n] bool, nll [n] float) at the answer token indices `positions` of one document
    `ids`, teacher forced. pad_to: right-pad the input to this many tokens with `pad_id`.
    Attention is causal, so the padding changes no scored logit; it gives every document of a
    length one shape, which a compiled kernel (FlexAttention on CPU, attention/paths.py) then
    compiles once instead of per document (~30 s each for a window at 2K here)."""
    device = next(model.parameters()).device
    x = list(ids) + [pad_id] * max(0, pad_to - len(ids))
    at = torch.tensor(positions, dtype=torch.long)
    keep = (at - 1).to(device)  # the rows that predict the answers: the logit before each token
    with torch.inference_mode():  # no KV cache, and the LM head on the scored rows only (all
        # [s, vocab] logits are 3.9 GiB in bf16 at 64K tokens of a 32K vocabulary); a model that
        # ignores logits_to_keep returns them all
        logits = model(input_ids=torch.tensor([x], device=device), use_cache=False,
                       logits_to_keep=keep).logits[0]
        pred = (logits if logits.shape[0] == len(keep) else logits[keep]).float().cpu()  # [n, vocab]
    target = torch.tensor(ids)[at]
    nll = torch.nn.functional.cross_entropy(pred, target, reduction="none")
    return (pred.argmax(-1) == target).numpy(), nll.numpy()


def answer_entropy(model: nn.Module, ids: Sequence[int], positions: Sequence[int], pad_to: int = 0,
                   pad_id: int = 0) -> np.ndarray:
    """[layers, heads, 2]: attention entropy H / ln(n) (n: keys the query sees) of the query that
    predicts the first answer token (the question's last token), and mean over the queries that
    predict the others. The paper's mechanism: past L a NoPE head's attention spreads (H rises)
    and a temperature c > 1 sharpens it; the model's head scales are applied. pad_to, pad_id: as
    score's (one shape a length, one compile; causal, so no scored row sees the padding)."""
    from .adapter import attention_layers, capture_qk, layout
    from .entropy import _position_hooks, entropy_by_position, visible_keys

    at = torch.tensor([p - 1 for p in positions])  # queries: the tokens before the answers
    layers = attention_layers(model)
    out = np.zeros((len(layers), int(model.config.num_attention_heads), 2))
    kind = layout(model)
    # ln(keys each query sees) per layer: fewer than i + 1 under a window, chunks or blocks
    norm = torch.log(torch.from_numpy(visible_keys(model, int(at.max()) + 1)[:, at.numpy()]).double())

    lo = int(at.min())  # rows lo.. only, against every key (a row is the same without the rows
    # before it; a task's answers come last: [h, s, s] -> [h, few, s])

    def on_layer(i, q, k, m):
        qs, mod = (_position_hooks(layers[i], q.shape[2], q.device) if kind == "lenext"
                   else (None, None))
        h = entropy_by_position(q[:, :, lo:], k, m, q_scale=None if qs is None else qs[lo:],
                                score_mod=mod)[0][:, at - lo].double().cpu()
        h = h / norm[i]  # [heads, answers]
        out[i, :, 0] = h[:, 0].numpy()
        out[i, :, 1] = h[:, 1:].mean(1).numpy() if h.shape[1] > 1 else h[:, 0].numpy()

    device = next(model.parameters()).device
    x = list(ids) + [pad_id] * max(0, pad_to - len(ids))
    capture_qk(model, torch.tensor([x], device=device), on_layer)
    return out


def no_retrieval_baseline(ids: Sequence[int], positions: Sequence[int],
                          candidates: Collection[int]) -> np.ndarray:
    """right [n]: a rule that never retrieves. At every answer position it emits one fixed token,
    the smallest id of the candidates (the generator's answer alphabet, `answer_alphabet`; any
    content token for repeat), whatever the document: its token accuracy is that token's share of
    the answers, chance (1/|alphabet|) for the uniform draws of passkey, recall, copy and kv. It
    reads no needle: the alphabet token most frequent in the context did (kv's only value symbols
    there are the needle's: first-token accuracy 0.82 at L = 128 where chance is 1/32)."""
    guess = min(candidates)
    return np.array([ids[i] == guess for i in positions])


def _cell(kind: str, length: int, rights: list, nlls: list, base: list, made: list,
          head: int, entropies: list) -> dict:
    """One (task, length) cell: the model's and the baseline's scores over its documents."""
    n_pos = max(len(r) for r in rights)
    by_pos = [float(np.mean([r[j] for r in rights if len(r) > j])) for j in range(n_pos)]
    tokens = int(sum(len(r) for r in rights))
    return {"task": kind, "length": length, "documents": len(rights), "answer_tokens": tokens,
            "accuracy": float(np.mean([r.all() for r in rights])),
            "token_accuracy": float(sum(r.sum() for r in rights) / max(tokens, 1)),
            "token_accuracy_by_position": by_pos,
            "answer_nll": float(np.concatenate(nlls).mean()),
            "baseline": {"accuracy": float(np.mean([b.all() for b in base])),
                         "token_accuracy": float(sum(b.sum() for b in base) / max(tokens, 1))},
            "tokens": [min(head + len(d.ids) for d in made), max(head + len(d.ids) for d in made)],
            **({"entropy": _entropy_summary(entropies)} if entropies else {})}


def _entropy_summary(entropies: list) -> dict:
    """Mean over documents of answer_entropy: per layer and head, and over all heads."""
    e = np.mean(entropies, axis=0)  # [layers, heads, 2]
    return {"query": e[:, :, 0].tolist(), "answers": e[:, :, 1].tolist(),
            "query_mean": float(e[:, :, 0].mean()), "answers_mean": float(e[:, :, 1].mean())}


def run_tasks(model: nn.Module, sp, texts: Sequence[str], lengths: Sequence[int],
              kinds: Sequence[str], *, docs: int = 32, seed: int = 0, bos: bool = False,
              progress: bool = True, task_set: Sequence[str] = (), entropy: bool = False) -> dict:
    """Accuracy per (task, length): the share of documents with every answer token right, beside
    the no-retrieval baseline on the same documents and the answers' NLL. task_set: generator
    parameters as shard.py's --task-set (`[task.]field=value`). entropy: also the attention
    entropy of the queries that predict the answers (answer_entropy), one more forward a document."""
    try:  # one parser of --task-set for data prep and evaluation
        spec = task_spec(",".join(kinds), list(task_set), 0, 1)
    except PrepError as e:
        raise ValueError(str(e)) from None
    params = {g["name"]: {k: v for k, v in g["params"].items() if k != "length"}
              for g in spec["generators"]}
    tk = Toolkit(sp)
    content = content_tokens(sp)
    head = [sp.bos_id()] if bos else []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(kinds) * len(lengths) * docs, desc="tasks", unit="doc", leave=False,
                   disable=None)
    cells, examples = [], []
    for kind in kinds:
        for length in lengths:
            # the same documents for every model and scale: seeded by (seed, task, length)
            gen = generator(tk, kind, length - len(head), params[kind])
            made = make_documents(gen, texts, docs, seed=cell_seed(seed, kind, length))
            alphabet = gen.answer_alphabet()
            candidates = {int(i) for i in np.flatnonzero(content)} if alphabet is None else \
                {i for i in alphabet if content[i]}
            scored = [(head + d.ids, answer_positions(
                head + d.ids, [(s + len(head), a + len(head), k) for s, a, k in d.answers],
                content), d) for d in made]
            if not any(pos for _, pos, _ in scored):
                raise ValueError(f"{kind}: no answer token carries content (all format pieces)")
            # a document whose answers are format pieces only has nothing to score (an empty
            # answer is all right, for the model and the baseline alike): counted, not scored
            unscored = sum(not pos for _, pos, _ in scored)
            scored = [x for x in scored if x[1]]
            rights, nlls, base, ents = [], [], [], []
            for ids, pos, doc in scored:
                r, nll = score(model, ids, pos, pad_to=length, pad_id=sp.eos_id())
                if entropy:
                    ents.append(answer_entropy(model, ids, pos, pad_to=length, pad_id=sp.eos_id()))
                rights.append(r)
                nlls.append(nll)
                base.append(no_retrieval_baseline(ids, pos, candidates))
                if len(examples) < 3 * len(kinds) * len(lengths) and not r.all():
                    examples.append({"task": kind, "length": len(ids), "depth": doc.actual_depth,
                                     "answers": [sp.decode([ids[i] for i in pos])]})
                if bar is not None:
                    bar.update(1)
            cells.append(_cell(kind, length, rights, nlls, base, made, len(head), ents))
            if unscored:
                cells[-1]["unscored_documents"] = unscored
            ids, pos, _ = scored[0]  # what is scored, for a reader of the JSON
            cells[-1]["first_answers"] = [sp.decode([ids[i] for i in pos])]
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
                         "that token (= greedy decoding of the answer); answer tokens are the "
                         "answer spans less format pieces (no letter or digit)",
                         "baseline": "no retrieval: at every answer position one fixed token, "
                         "the smallest id of the generator's answer alphabet (content tokens of "
                         "any answer it can draw), whatever the document",
                         "documents_seed": "sha256 of (seed, task name, length value)",
                         "seed": seed, "bos": bos, "task_set": list(task_set),
                         "params": params}}
