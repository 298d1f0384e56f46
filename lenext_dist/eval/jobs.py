"""Typed evaluation jobs: one dataclass per evaluation (`PplJob`, `PasskeyJob`, `TasksJob`,
`EntropyJob`, `ScaleSweepJob`, `RulerJob`) on the shared base of eval/job.py, and their registry.

Each option is declared once, as a field made by `option` (lenext_dist/flags.py): `lenext eval`'s
parser is written from the fields of the registered kinds (eval/cli.py); `lenext extend` and
experiments build the jobs directly and ask them where their results are; they pickle (a caller may
run them in workers).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

import numpy as np

from lenext_dist.flags import from_args, nonneg_int, option, pos_float, pos_int

from . import sections
from .job import NAME_MAX, DataJob, EvalError, EvalJob  # noqa: F401 (NAME_MAX, EvalError: re-exported)
from .model_io import write_json
from .options import PROTOCOLS, TASK_NAMES, depths, entropy_length, ints, task_names
from .ruler_tasks import LM_EVAL_SAMPLES, OFFLINE, ruler_task_names


@dataclass(kw_only=True)
class PplJob(DataJob):
    """Sliding-window perplexity at several lengths (`lenext eval ppl`)."""
    kind: ClassVar[str] = "ppl"
    help: ClassVar[str] = "sliding-window perplexity by length, with context-use and extrapolation diagnostics"
    description: ClassVar[str] = (
        "Sliding-window perplexity of --data at each of --lengths.\n\nWith context use and "
        "the extrapolation penalty past the training length.")
    example: ClassVar[str] = (
        "lenext eval ppl --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
        "--lengths 128,256,512,1024 --stride 64")
    section = staticmethod(sections.ppl)
    lengths: list[int] = option(None, ints, "e.g. 2048,4096,8192", required=True)
    stride: int = option(256, pos_int, "S (last-stride and yarn)")
    protocol: str = option("last-stride", choices=PROTOCOLS)
    budget_tokens: Optional[int] = option(None, pos_int, "scored tokens per length (whole windows, "
                                          "interleaved across documents)")
    curve_all: bool = option(False, help="per-position curve over all window positions, not only scored "
                             "ones", action="store_true")
    no_penalty: bool = option(False, help="skip the extrapolation penalty / context-use pass (lengths >= L)",
                              action="store_true")
    penalty_stride: Optional[int] = option(None, pos_int, "stride of the window-L baseline (default L/4; "
                                           "must divide W-L)")

    @property
    def stem(self) -> Path:
        return self._stem(f"ppl_{self.protocol}{self.suffix}")

    def _run(self) -> list[str]:
        from . import plots
        from .ppl import run_ppl

        model, L, meta = self._setup()
        docs = self._docs(min_tokens=min(self.lengths) + 1)
        res = run_ppl(model, docs, self.lengths, stride=self.stride, protocol=self.protocol,
                      budget_tokens=self.budget_tokens, batch_size=self.batch_size,
                      curve_all=self.curve_all, penalty=not self.no_penalty,
                      penalty_stride=self.penalty_stride, train_length=L,
                      progress=not self.no_progress)
        res = {**meta, **res}
        stem = str(self.stem)
        files = [write_json(res, stem + ".json"), plots.plot_ppl(res, stem + ".png")]
        if any("penalty_binned" in d for d in res["diagnostics"]):
            files.append(plots.plot_penalty(res, str(
                self._stem(f"penalty_{self.protocol}{self.suffix}")) + ".png"))
        for r in res["results"]:
            print(f"W={r['length']:>6}  {self.protocol}  ppl {r['ppl']:.4f}  "
                  f"({r['scored_tokens']} tokens, {r['windows']} windows)")
        for d in res["diagnostics"]:
            cu = d.get("context_use", {})
            pen = d.get("penalty_mean")
            print(f"W={d['length']:>6}  context use gain {cu.get('gain')} (unpaired "
                  f"{cu.get('gain_unpaired')})"
                  + (f"  penalty mean {pen:.4f}" if pen is not None else ""))
        return files


@dataclass(kw_only=True)
class PasskeyJob(EvalJob):
    """Passkey retrieval, length x depth (`lenext eval passkey`)."""
    kind: ClassVar[str] = "passkey"
    help: ClassVar[str] = "passkey retrieval, length x depth"
    description: ClassVar[str] = (
        "Passkey retrieval by prompt length and depth of the key.\n\nA 5-digit key hidden in "
        "filler, asked for at the end; greedy answers scored.")
    example: ClassVar[str] = (
        "lenext eval passkey --model hf/tiny-nope --lengths 128,256,512 --depths 5 --keys 10")
    section = staticmethod(sections.passkey)
    lengths: list[int] = option(None, ints, required=True)
    depths: str = option("10", depths, "N evenly spaced depths in [0,1], or a list")
    keys: int = option(10, pos_int, "random 5-digit keys per cell")
    seed: int = option(0, nonneg_int)
    max_new_tokens: int = option(8, pos_int)

    @property
    def stem(self) -> Path:
        return self._stem(f"passkey{self.suffix}")

    def _run(self) -> list[str]:
        from . import plots
        from .data import load_tokenizer
        from .passkey import parse_depths, run_passkey

        model, L, meta = self._setup()
        sp = load_tokenizer(self.tokenizer_path)
        res = run_passkey(model, sp, self.lengths, parse_depths(self.depths), keys=self.keys,
                          seed=self.seed, batch_size=self.batch_size,
                          max_new_tokens=self.max_new_tokens, bos=self.bos,
                          progress=not self.no_progress)
        res = {**meta, **res, "tokenizer": os.path.abspath(self.tokenizer_path)}
        stem = str(self.stem)
        for Lp, a in zip(res["lengths"], res["accuracy_by_length"]):
            print(f"length {Lp:>6}  accuracy {a:.3f}")
        return [write_json(res, stem + ".json"), plots.plot_passkey(res, stem + ".png")]


@dataclass(kw_only=True)
class TasksJob(DataJob):
    """Task-format retrieval (documents of every task generator) by length (`lenext eval tasks`;
    eval/tasks.py): the skill a model learned from task documents, past its training length."""
    kind: ClassVar[str] = "tasks"
    help: ClassVar[str] = "retrieval in the training task formats, by length (filler from --data)"
    description: ClassVar[str] = (
        "Retrieval in the formats of the training task documents, by length.\n\nFresh "
        "documents of each generator at each length, filler from the held-out --data;\na "
        "document is right when every answer token is.")
    example: ClassVar[str] = (
        "lenext eval tasks --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
        "--lengths 128,256,512 --tasks passkey,recall,copy --docs 32")
    section = staticmethod(sections.tasks)
    # 1: documents seeded by task name and length value (were: their list indices), baseline
    # candidates from the generator's answer alphabet (were: the answers drawn in the cell);
    # 2: baseline a fixed alphabet token (was: the one most frequent in context, i.e. kv's needle)
    protocol_version: ClassVar[int] = 2
    lengths: list[int] = option(None, ints, "document lengths, e.g. 128,256,512", required=True)
    tasks: list[str] = option(None, task_names, f"comma-separated, from {','.join(TASK_NAMES)} (default: all)")
    docs: int = option(32, pos_int, "documents per (task, length)")
    seed: int = option(0, nonneg_int)
    task_set: list[str] = option(
        default_factory=list, help="a generator parameter other than the training default, as in lenext prep's "
        "(e.g. kv.distractors=1, kv.values=6:8); repeatable; length is set per cell", action="append",
        metavar="[TASK.]FIELD=VALUE")
    entropy: bool = option(False, help="also the attention entropy (H / ln n, per layer and head) of the "
                           "queries that predict the answers", action="store_true")

    def __post_init__(self) -> None:
        if self.tasks is None:
            self.tasks = list(TASK_NAMES)
        super().__post_init__()

    @property
    def stem(self) -> Path:
        # other generator parameters name the file too (a variant never overwrites the default)
        sets = "".join(f"_{s.replace('=', '-').replace(':', '-')}" for s in self.task_set)
        return self._stem(f"tasks{self.suffix}{sets}")

    def _run(self) -> list[str]:
        from . import plots
        from .data import load_tokenizer
        from .tasks import run_tasks

        model, L, meta = self._setup()
        docs = self._docs(min_tokens=1)
        sp = load_tokenizer(self.tokenizer_path)
        texts = [sp.decode(d.tokens[int(docs.bos):].tolist()).strip() for d in docs.docs]
        res = run_tasks(model, sp, texts, self.lengths, self.tasks, docs=self.docs, seed=self.seed,
                        bos=self.bos, progress=not self.no_progress, task_set=self.task_set,
                        entropy=self.entropy)
        res = {**meta, **res, "data": docs.describe()}
        for c in res["cells"]:
            print(f"{c['task']:>8}  length {c['length']:>6}  accuracy {c['accuracy']:.3f}  "
                  f"(answer tokens {c['token_accuracy']:.3f})")
        stem = str(self.stem)
        return [write_json(res, stem + ".json"), plots.plot_tasks(res, stem + ".png")]


@dataclass(kw_only=True)
class EntropyJob(DataJob):
    """Per-position attention entropy per head and layer (`lenext eval entropy`)."""
    kind: ClassVar[str] = "entropy"
    help: ClassVar[str] = "attention entropy per position, head and layer"
    description: ClassVar[str] = (
        "Attention entropy per position, head and layer.\n\nAveraged over windows of "
        "--length tokens, with the uniform-attention upper bound.")
    example: ClassVar[str] = (
        "lenext eval entropy --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
        "--length 1024 --samples 8")
    section = staticmethod(sections.entropy)
    length: int = option(None, entropy_length, "window length W (>= 2)", required=True)
    samples: int = option(8, pos_int, "windows averaged over")
    chunk_size: Optional[int] = option(None, pos_int, "query rows per chunk (default: from --mem-mb)")
    mem_mb: int = option(256, pos_int, "memory for one chunk of probs")

    @property
    def stem(self) -> Path:
        return self._stem(f"entropy{self.suffix}_{self.length}")

    @property
    def npz_path(self) -> Path:
        """The full [layers, heads, N] entropy array."""
        return self.stem.with_name(self.stem.name + ".npz")

    def _run(self) -> list[str]:
        from . import plots
        from .entropy import evaluate_entropy, summarize_entropy

        model, L, meta = self._setup()
        docs = self._docs(min_tokens=self.length + 1)
        raw = evaluate_entropy(model, docs.docs, self.length, samples=self.samples,
                               batch_size=self.batch_size, chunk_size=self.chunk_size,
                               mem_bytes=self.mem_mb << 20, progress=not self.no_progress)
        summ = summarize_entropy(raw, L)
        res = {**meta, "kind": "entropy",
               "protocol": {"windows": "non-overlapping windows of `length` tokens, interleaved "
                            "across documents", "samples": raw["samples"],
                            "entropy": "H_i = -sum_j a_ij ln a_ij (nats), fp32, query chunks",
                            "upper_bound": "ln(keys visible to query i): ln(i+1) for 0-based "
                            "query i, ln min(i+1, W) under a sliding window W"},
               "windows": raw["windows"], "data": docs.describe(), **summ}
        stem = str(self.stem)
        np.savez_compressed(str(self.npz_path), entropy=raw["entropy"],
                            upper_bound=raw["upper_bound"])
        print(f"mean entropy at end {summ['mean_at_end']:.4f} "
              f"(normalized {summ['normalized_at_end']:.3f})")
        return [write_json(res, stem + ".json"), plots.plot_entropy(summ, stem + ".png"),
                str(self.npz_path)]


@dataclass(kw_only=True)
class ScaleSweepJob(DataJob):
    """Uniform-scale grid, best c per position, log fit (`lenext eval scale-sweep`)."""
    kind: ClassVar[str] = "scale-sweep"
    help: ClassVar[str] = "the best uniform attention scale per position, and its log fit"
    description: ClassVar[str] = (
        "The best uniform attention scale c per position, and its log fit.\n\nThe loss per "
        "position for each c of a grid; the fit c(s) = 1 + a ln s beyond the training length.")
    example: ClassVar[str] = (
        "lenext eval scale-sweep --model hf/tiny-nope --data data/sample/heldout/books.jsonl.zst "
        "--length 1024 --c-min 0.8 --c-max 2.0 --c-step 0.05")
    result_kind: ClassVar[str] = "scale_sweep"
    section = staticmethod(sections.scale_sweep)
    length: int = option(None, pos_int, required=True)
    c_min: float = option(0.8, pos_float)
    c_max: float = option(2.0, pos_float)
    c_step: float = option(0.01, pos_float)
    budget_tokens: Optional[int] = option(None, pos_int, "tokens per c")
    samples: Optional[int] = option(None, pos_int, "windows per c")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scale_c is not None:
            raise EvalError("--scale-c makes no sense with scale-sweep (it sets every c itself)")
        if self.c_min > self.c_max:
            raise EvalError(f"--c-min {self.c_min:g} > --c-max {self.c_max:g}: swap them")

    @property
    def stem(self) -> Path:
        return self.out_dir / "scale_sweep"  # the sweep sets every c itself: no suffix

    def _run(self) -> list[str]:
        from . import plots
        from .scale_sweep import make_grid, run_scale_sweep

        model, L, meta = self._setup()
        if not L:
            raise EvalError("the training length is unknown: pass --train-length")
        if self.length <= L:  # the result would be a fit of no points (a = None), exit 0
            raise EvalError(f"--length {self.length}: the fit c(s) = 1 + a ln s is over the positions "
                            f"past the training length L = {L}; give --length > {L} (e.g. {4 * L})")
        docs = self._docs(min_tokens=self.length + 1)
        grid = make_grid(self.c_min, self.c_max, self.c_step)
        res, loss = run_scale_sweep(model, docs, self.length, grid, L,
                                    budget_tokens=self.budget_tokens, samples=self.samples,
                                    batch_size=self.batch_size, progress=not self.no_progress)
        res = {**meta, **res}
        stem = str(self.stem)
        np.savez_compressed(stem + "_losses.npz", loss=loss, grid=np.asarray(grid))
        fit = res["fit"]
        print(f"best c (all positions) {res['best_c_mean']}; fit a = {fit['a']} R2 = {fit['r2']}")
        return [write_json(res, stem + ".json"), plots.plot_scale_sweep(res, stem + ".png"),
                stem + "_losses.npz"]


@dataclass(kw_only=True)
class RulerJob(EvalJob):
    """lm-eval's offline RULER tasks by length (`lenext eval ruler`; eval/ruler.py)."""
    kind: ClassVar[str] = "ruler"
    help: ClassVar[str] = "lm-eval's offline RULER tasks by length (needs lm_eval[ruler])"
    description: ClassVar[str] = (
        "RULER (lm-eval's ruler tasks) at each of --lengths.\n\nThe offline tasks (niah_single_1, "
        "niah_multikey_2/3, vt, cwe, fwe): prompts made and scored\nby lm-eval with the export's "
        "tokenizer, answers decoded greedily; beside each score a\nno-retrieval baseline. Tasks "
        "that download data, and lengths a task cannot fill, are refused.")
    example: ClassVar[str] = (
        "lenext eval ruler --model hf/tiny-nope --lengths 1024,2048 --tasks niah_single_1,vt "
        "--samples 20")
    section = staticmethod(sections.ruler)
    # 1: each (task, length) made alone, seeded by the cell (were: one stream across the lists)
    protocol_version: ClassVar[int] = 1
    lengths: list[int] = option(None, ints, "RULER lengths (lm-eval's max_seq_lengths), e.g. 1024,2048",
                                required=True)
    tasks: list[str] = option(None, ruler_task_names, f"comma-separated, from {','.join(OFFLINE)} "
                              "(default: all of them)")
    samples: int = option(20, pos_int, f"samples per (task, length), at most {LM_EVAL_SAMPLES}")
    seed: int = option(0, nonneg_int, "seed of lm-eval's sample generators")

    def __post_init__(self) -> None:
        if self.tasks is None:
            self.tasks = list(OFFLINE)
        super().__post_init__()
        if self.samples > LM_EVAL_SAMPLES:
            raise EvalError(f"lenext eval ruler: argument --samples: lm-eval makes {LM_EVAL_SAMPLES} "
                            f"per (task, length), got {self.samples}")

    @property
    def stem(self) -> Path:
        return self._stem(f"ruler{self.suffix}")

    def _run(self) -> list[str]:
        from .ruler import evaluate_ruler, preflight

        preflight(self.tokenizer_path, self.tasks, self.lengths)  # refuses before the model loads
        model, L, meta = self._setup()
        res = evaluate_ruler(model, self.tokenizer_path, self.tasks, self.lengths, samples=self.samples,
                             seed=self.seed, bos=self.bos, progress=not self.no_progress,
                             batch_size=self.batch_size)
        res = {**meta, **res, "tokenizer": os.path.abspath(self.tokenizer_path)}
        for c in res["cells"]:
            print(f"{c['task']:>16}  length {c['length']:>6}  score {c['score']:.3f}  "
                  f"(no-retrieval baseline {c['baseline']:.3f}, {c['samples']} samples)")
        return [write_json(res, str(self.stem) + ".json")]


JOBS: dict[str, type[EvalJob]] = {}
"""The registered kinds, in the order of `lenext eval --help` and of `lenext report`'s sections."""


def register(job: type[EvalJob]) -> type[EvalJob]:
    """Add a kind: `lenext eval KIND` (flags from its fields), its help and its report section.
    A kind's name and its result kind are unique."""
    if not job.kind or job.kind in JOBS:
        raise ValueError(f"eval kind {job.kind!r}: empty or registered already")
    job.result_kind = job.result_kind or job.kind
    if job.result_kind in {j.result_kind for j in JOBS.values()}:
        raise ValueError(f"eval kind {job.kind!r}: result kind {job.result_kind!r} is taken")
    JOBS[job.kind] = job
    return job


for _job in (PplJob, PasskeyJob, TasksJob, EntropyJob, ScaleSweepJob, RulerJob):
    register(_job)


def job_from_args(args: argparse.Namespace) -> EvalJob:
    """The job `lenext eval <kind> ...` describes (argparse dests are the job's field names)."""
    return from_args(JOBS[args.eval_cmd], args)
