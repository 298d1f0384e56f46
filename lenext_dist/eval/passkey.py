"""Passkey retrieval (DESIGN section 4; the Landmark-attention / LongLoRA prompt): a 5-digit key
hidden in repeated filler text at a relative depth, the model asked for it at the end, greedy
decoding, exact match of the first number it writes.

Prompts are built in token space with the model's own SentencePiece model (each piece encoded
separately, so lengths are exact): [prefix] [filler x n1] [key sentence] [filler x n2] [question],
n1 + n2 whole filler sentences, the most that keep the prompt <= the target length, and
n1 = round(depth * (n1 + n2)). Depth 0 puts the key right after the prefix, depth 1 right before
the question. The same keys (seeded) are used in every (length, depth) cell. The wording lives in
lenext_dist/prep/passkey_wording.py, which the task generators read to keep out of it.

Public API: `PasskeyPrompt`, `build_prompt`, `passkey_match`, `greedy_generate`, `run_passkey`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from lenext_dist.prep.passkey_wording import FILLER, KEY, PREFIX, QUESTION

from .scoring import _accepts


@dataclass
class PasskeyPrompt:
    ids: list[int]
    key: int
    depth: float           # requested relative depth
    key_token_start: int   # index of the first token of the key sentence
    fillers_before: int
    fillers_after: int

    @property
    def actual_depth(self) -> float:
        total = self.fillers_before + self.fillers_after
        return self.fillers_before / total if total else 0.0


def build_prompt(sp, length: int, depth: float, key: int, *, bos: bool = False) -> PasskeyPrompt:
    """A prompt of at most `length` tokens with `key` at relative `depth` in [0, 1]."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    enc = sp.encode
    head = ([sp.bos_id()] if bos and sp.bos_id() >= 0 else []) + enc(PREFIX)
    filler, key_ids, tail = enc(FILLER), enc(KEY.format(key=key)), enc(QUESTION)
    room = length - len(head) - len(key_ids) - len(tail)
    n = room // len(filler)
    if n < 0:
        raise ValueError(f"length {length} is too short for a passkey prompt "
                         f"(needs {length - room} tokens without filler)")
    n1 = int(round(depth * n))
    ids = head + filler * n1
    start = len(ids)
    ids = ids + key_ids + filler * (n - n1) + tail
    return PasskeyPrompt(ids, key, depth, start, n1, n - n1)


def passkey_match(generated: str, key: int) -> bool:
    """Exact match: the first run of digits in the generated text is the key."""
    m = re.search(r"\d+", generated)
    return m is not None and m.group(0) == str(key)


def answer_text(sp, new_tokens: list[int]) -> str:
    """The generated text up to EOS, as RULER cuts it: sp.decode drops EOS, so digits written
    after it would still match."""
    eos = sp.eos_id()
    return sp.decode(new_tokens[:new_tokens.index(eos)] if eos in new_tokens else new_tokens)


def greedy_generate(model: nn.Module, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding of a batch of equal-length prompts [b, s] -> new tokens [b, n]
    (KV cache when the model returns one, else full recompute)."""
    out = []
    with torch.inference_mode():
        kw = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
        res = model(input_ids=ids, use_cache=True, **kw)
        past = getattr(res, "past_key_values", None)
        nxt = res.logits[:, -1].argmax(-1, keepdim=True)
        seq = ids
        for step in range(max_new_tokens):
            out.append(nxt)
            if step == max_new_tokens - 1:
                break
            seq = torch.cat([seq, nxt], 1)
            if past is not None:
                res = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = res.past_key_values
            else:
                res = model(input_ids=seq)
            nxt = res.logits[:, -1].argmax(-1, keepdim=True)
    return torch.cat(out, 1)


def parse_depths(spec: str) -> list[float]:
    """'10' -> 10 depths evenly spaced in [0, 1]; '0,0.5,1' -> those depths."""
    if "," in spec or "." in spec:
        return [float(x) for x in spec.split(",") if x.strip()]
    n = int(spec)
    return [0.5] if n == 1 else np.linspace(0.0, 1.0, n).round(4).tolist()


def run_passkey(model: nn.Module, sp, lengths: Sequence[int], depths: Sequence[float], *,
                keys: int = 10, seed: int = 0, batch_size: int = 1, max_new_tokens: int = 8,
                bos: bool = False, progress: bool = True) -> dict:
    """Accuracy per (length, depth) over `keys` random 5-digit keys."""
    rng = np.random.default_rng(seed)
    key_list = [int(k) for k in rng.integers(10000, 100000, keys)]
    device = next(model.parameters()).device
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(lengths) * len(depths) * keys, desc="passkey", unit="prompt",
                   leave=False, disable=None)
    acc = np.zeros((len(lengths), len(depths)))
    cells, examples = [], []
    for li, L in enumerate(lengths):
        for di, dep in enumerate(depths):
            prompts = [build_prompt(sp, L, dep, k, bos=bos) for k in key_list]
            by_len: dict[int, list[PasskeyPrompt]] = {}
            for p in prompts:  # keys of different token lengths never share a batch (no padding)
                by_len.setdefault(len(p.ids), []).append(p)
            hits = 0
            for group in by_len.values():
                for j in range(0, len(group), batch_size):
                    chunk = group[j:j + batch_size]
                    ids = torch.tensor([p.ids for p in chunk], device=device)
                    new = greedy_generate(model, ids, max_new_tokens).cpu().tolist()
                    for p, toks in zip(chunk, new):
                        text = answer_text(sp, toks)
                        ok = passkey_match(text, p.key)
                        hits += ok
                        if len(examples) < 20 or not ok and len(examples) < 40:
                            examples.append({"length": L, "depth": dep, "key": p.key,
                                             "output": text, "correct": bool(ok)})
                    if bar is not None:
                        bar.update(len(chunk))
            acc[li, di] = hits / len(prompts)
            cells.append({"length": L, "depth": dep, "accuracy": acc[li, di],
                          "prompt_tokens": sorted({len(p.ids) for p in prompts}),
                          "actual_depth": prompts[0].actual_depth})
    if bar is not None:
        bar.close()
    return {"kind": "passkey", "lengths": list(lengths), "depths": list(depths),
            "keys": key_list, "accuracy": acc.round(6).tolist(),
            "accuracy_by_length": acc.mean(1).round(6).tolist(),
            "mean_accuracy": float(acc.mean()), "cells": cells, "examples": examples[:40],
            "protocol": {"prefix": PREFIX, "filler": FILLER, "key": KEY, "question": QUESTION,
                         "bos": bos, "decoding": f"greedy, {max_new_tokens} new tokens",
                         "match": "first run of digits == key", "seed": seed}}
