"""RULER through lm-eval (`lenext eval ruler`): lm-eval's own task code makes the prompts (sized
with our tokenizer) and scores the answers; our greedy decoding writes them.

Pipeline per run: `hf_tokenizer` writes the export's SentencePiece model as a tokenizer.json
folder that encodes exactly as SentencePiece (lenext_dist/convert/tokenizer_json.py, checked on
probe texts), handed to lm-eval as the `tokenizer` its RULER generators load
(`common_utils.get_tokenizer`: `AutoTokenizer.from_pretrained(metadata["tokenizer"])`); the
guards of eval/ruler_tasks.py refuse lengths a task cannot fill; lm-eval's `TaskManager` loads
each (task, length) alone with `metadata={"max_seq_lengths": [length], "tokenizer": ...}`, its
generators seeded by the cell (the data is made at load, `LM_EVAL_SAMPLES` of them); the first
`samples` of each are decoded greedily (eval/passkey.py's `greedy_generate`, stopped at EOS) from
lm-eval's request context (template + the task's answer prefix); `task.process_results` scores
each (RULER's string match: the share of the answers that occur in the output) under the sample's
length.

Scores are averaged per (task, length) here: lm-eval 0.4.13 aggregates only the lengths of its
YAML metric_list (4096..131072) and averages any other length's key over every sample (the
-1 placeholders of the other lengths included).

Beside each score, a rule that reads no question (`copy_baseline`): the prompt's last
max_gen_toks tokens taken as the answer, scored the same way. RULER's metric counts an answer
found anywhere in the output, so a model that copies its recent context scores this much
without retrieving; a score counts as retrieval only above it.
"""
from __future__ import annotations

import contextlib
import io
import os
import random
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .passkey import greedy_generate
from .ruler_tasks import LM_EVAL_SAMPLES, RULER, check_samples, quiet_import, require_lm_eval, too_short


def hf_tokenizer(spm_path: str, out_dir: str, bos: bool = False) -> str:
    """A folder AutoTokenizer loads (tokenizer.json + config) encoding as SentencePiece
    `spm_path`; ValueError when no tokenizer.json reproduces it. (transformers' own conversion
    is not used: it disagrees on whitespace runs, and transformers 5's
    `LlamaTokenizer(vocab_file=...)` has a 3-token vocabulary and encodes text to no tokens.)"""
    from pathlib import Path

    from lenext_dist.convert.tokenizer_json import write_stock_tokenizer

    from .data import load_tokenizer

    load_tokenizer(spm_path)  # a missing file: the one-line error of every eval kind
    if os.path.isdir(spm_path):
        spm_path = os.path.join(spm_path, "tokenizer.model")
    _, note = write_stock_tokenizer(Path(out_dir), Path(spm_path), bos=bos)
    if not (Path(out_dir) / "tokenizer.json").exists():
        raise ValueError(f"{spm_path}: lm-eval's RULER needs a Hugging Face tokenizer; {note}")
    return out_dir


def preflight(spm_path: str, tasks: Sequence[str], lengths: Sequence[int]) -> None:
    """lm-eval importable and every (task, length) long enough for its generator (before the model
    loads); else a ValueError naming each refused cell."""
    import tempfile

    require_lm_eval()
    from lm_eval.tasks.ruler.common_utils import get_tokenizer

    with tempfile.TemporaryDirectory(prefix="lenext_ruler_tok_") as tok_dir, quiet_import():
        short = too_short(get_tokenizer(hf_tokenizer(spm_path, tok_dir)), tasks, lengths)
    if short:
        raise ValueError(f"too short for lm-eval's generators: {'; '.join(short)}: drop the task "
                         "from --tasks or raise --lengths")


def evaluate_ruler(model: nn.Module, spm_path: str, tasks: Sequence[str], lengths: Sequence[int], *,
                   samples: int, seed: int = 0, bos: bool = False, progress: bool = True,
                   batch_size: int = 1) -> dict:
    """The tokenizer folder lm-eval sizes prompts with, the tasks loaded at `lengths`, run_ruler."""
    import tempfile

    from lm_eval.tasks.ruler.common_utils import get_tokenizer

    from .data import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="lenext_ruler_tok_") as tok_dir:
        hf_tok = get_tokenizer(hf_tokenizer(spm_path, tok_dir, bos=bos))
        task_objs = load_tasks(tasks, lengths, tok_dir, seed, progress)
        return run_ruler(model, load_tokenizer(spm_path), task_objs, lengths, samples=samples,
                         bos=bos, progress=progress, hf_tok=hf_tok, batch_size=batch_size)


def load_tasks(names: Sequence[str], lengths: Sequence[int], tokenizer_dir: str, seed: int,
               progress: bool) -> dict:
    """{(our name, length): lm-eval Task with its samples made at that length}. Each cell is made
    alone, its generators seeded by (seed, task, length) (eval/tasks.py's `cell_seed`): lm-eval
    draws from `random`, `numpy.random` and cwe's module RNG across its tasks and lengths in one
    stream, so a cell's samples depended on what else --tasks and --lengths held."""
    from lm_eval.tasks import TaskManager

    from .tasks import cell_seed

    out = {}
    with quiet_import(progress):
        from lm_eval.tasks._yaml_loader import _load_module_with_cache
        from lm_eval.tasks.ruler import cwe_utils

        # the cwe module its YAML's `!function` runs: lm-eval executes the file again as a module
        # of its own (the RNG of a plain import is not the one its samples draw from), once, then
        # reuses it, so loading it first here gives the module to seed (lm-eval 0.4.13)
        cwe = _load_module_with_cache(Path(cwe_utils.__file__).resolve())
        for length in lengths:
            # lm-eval's ruler folder alone: indexing all of lm_eval/tasks takes ~8 s a manager
            tm = TaskManager(include_defaults=False, include_path=os.path.dirname(cwe_utils.__file__),
                             metadata={"max_seq_lengths": [length], "tokenizer": tokenizer_dir})
            for n in names:
                s = cell_seed(seed, n, length)
                random.seed(s)
                np.random.seed(s % 2**32)
                cwe.RNG.seed(s)
                (task,) = tm.load([RULER[n].lm_eval_name])["tasks"].values()
                out[n, length] = task
    return out


def copy_baseline(ctx_ids: Sequence[int], n: int) -> list[int]:
    """The last n prompt tokens: the answer of a rule that copies its recent context."""
    return list(ctx_ids[-n:])


def _cut(text: str, until: Sequence[str]) -> str:
    for u in until:
        if u and u in text:
            text = text[:text.index(u)]
    return text


def generate(model: nn.Module, prompts: Sequence[list], n_new: int, *, batch_size: int = 1,
             eos: int = -1, bar=None) -> list[list[int]]:
    """Greedy answers of `n_new` tokens, cut at EOS, one per prompt; prompts of equal length share
    a batch of at most `batch_size` (no padding, as in eval/passkey.py)."""
    device = next(model.parameters()).device
    out: list = [None] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for group in by_len.values():
        for j in range(0, len(group), batch_size):
            chunk = group[j:j + batch_size]
            ids = torch.tensor([prompts[i] for i in chunk], device=device)  # [b, s]
            for i, new in zip(chunk, greedy_generate(model, ids, n_new).cpu().tolist()):
                out[i] = new[:new.index(eos)] if eos in new else new
            if bar is not None:
                bar.update(len(chunk))
    return out


def run_ruler(model: nn.Module, sp, task_objs: dict, lengths: Sequence[int], *, samples: int,
              bos: bool = False, progress: bool = True, hf_tok=None, batch_size: int = 1) -> dict:
    """Score per (task, length) over the first `samples` samples of that length. hf_tok: the
    tokenizer lm-eval sized the prompts with; the first prompt of every cell is checked to
    encode to the same ids as SentencePiece (else the lengths are not the lengths asked)."""
    head = [sp.bos_id()] if bos and sp.bos_id() >= 0 else []
    plan = {}
    for (name, length), task in task_objs.items():
        docs = list(task.test_docs())
        idx = [i for i, d in enumerate(docs) if d["max_length"] == length][:samples]
        check_samples(name, length, [docs[i] for i in idx])
        if len(idx) < samples:
            raise ValueError(f"{name} at {length}: lm-eval made {len(idx)} samples, "
                             f"{samples} asked (--samples)")
        plan[name, length] = idx
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(len(v) for v in plan.values()), desc="ruler", unit="sample",
                   leave=False, disable=None)
    names = list(dict.fromkeys(n for n, _ in task_objs))
    cells, examples = [], []
    for name in names:
        for length in lengths:
            task = task_objs[name, length]
            with contextlib.redirect_stderr(io.StringIO()):  # lm-eval's "building contexts" bar
                task.build_all_requests(samples=plan[name, length])
            by_doc = {inst.doc_id: inst for inst in task.instances}
            insts = [by_doc[i] for i in plan[name, length]]
            gen = insts[0].args[1]  # the task's generation settings (the same for every sample)
            n_new = int(gen.get("max_gen_toks", 128))
            prompts = [head + sp.encode(inst.args[0]) for inst in insts]
            if hf_tok is not None and hf_tok(insts[0].args[0]).input_ids != prompts[0]:
                raise ValueError(f"{name} at {length}: the Hugging Face tokenizer lm-eval sized "
                                 "the prompt with encodes it differently from SentencePiece")
            news = generate(model, prompts, n_new, batch_size=batch_size, eos=sp.eos_id(), bar=bar)
            scores, base = [], []
            for inst, ids, new in zip(insts, prompts, news):
                out = _cut(sp.decode(new), gen.get("until") or [])
                key = str(length)  # process_results scores a sample under its own length
                scores.append(float(task.process_results(inst.doc, [out])[key]))
                base.append(float(task.process_results(
                    inst.doc, [sp.decode(copy_baseline(ids, n_new))])[key]))
                if len(examples) < 3 * len(task_objs):
                    examples.append({"task": name, "length": length, "answers": list(inst.doc["outputs"]),
                                     "output": out, "score": scores[-1]})
            tokens = [len(ids) + n_new for ids in prompts]
            cells.append({"task": name, "length": length, "samples": len(scores),
                          "score": float(np.mean(scores)), "baseline": float(np.mean(base)),
                          "tokens": [min(tokens), max(tokens)]})
    if bar is not None:
        bar.close()
    import lm_eval

    score = {n: [c["score"] for c in cells if c["task"] == n] for n in names}
    return {"kind": "ruler", "lengths": list(lengths), "tasks": names, "cells": cells,
            "score": score, "examples": examples,
            "protocol": {"suite": f"lm-eval {lm_eval.__version__} RULER (lm_eval/tasks/ruler), "
                         "prompts and scoring by its task code",
                         "tasks": {n: RULER[n].lm_eval_name for n in names},
                         "seed": "each (task, length) made alone, lm-eval's generators seeded by "
                         "sha256 of (--seed, task, length)",
                         "samples": f"the first {samples} of the {LM_EVAL_SAMPLES} lm-eval makes "
                         "per (task, length)",
                         "decoding": "greedy, the task's max_gen_toks, stopped at EOS",
                         "score": "RULER string match: the share of the answers found in the "
                         "output, averaged over samples",
                         "baseline": "no retrieval: the prompt's last max_gen_toks tokens as the "
                         "answer, scored the same way",
                         "tokens": "prompt + max_gen_toks per sample (min, max); lm-eval sizes "
                         "fwe's prompt to the length itself, so fwe may exceed it",
                         "bos": bos}}
