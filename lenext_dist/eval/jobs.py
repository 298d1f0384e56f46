"""Typed evaluation jobs: one dataclass per evaluation (`PplJob`, `PasskeyJob`, `TasksJob`,
`EntropyJob`, `ScaleSweepJob`) holding its options, checked in `__post_init__` (the same one-line
messages as `lenext eval`'s flags, from the same checks in eval/options.py), `run()` (load the
model, evaluate, write JSON + PNG) and `result_path` (the JSON it writes: this module alone names result files).

Each option is declared once, as a field made by `option` (lenext_dist/flags.py): `lenext eval`'s
parser is written from the fields (eval/cli.py); `lenext extend` and experiments build the jobs
directly and ask them where their results are; they pickle (a caller may run them in workers).
Eval-time changes of the model (a uniform scale c, a sliding window, RoPE scaling, a log-length
scale) are options of the job, applied to the loaded model; they also name the result files
(`suffix`), so runs with different options never collide.
"""
from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, ClassVar, Optional

import numpy as np

from lenext_dist.errors import UserError
from lenext_dist.flags import check_fields, from_args, nonneg_int, option, pos_float, pos_int

from . import sections
from .model_io import default_dtype, load_model, model_info, write_json
from .options import (DTYPES, PROTOCOLS, ROPE_SCALINGS, TASK_NAMES, depths, entropy_length, ints, paths,
                      task_names, temperature, temperature_section)
from .ruler_tasks import LM_EVAL_SAMPLES, OFFLINE, ruler_task_names


NAME_MAX = 200
"""Longest result file stem (the file system allows 255 bytes; suffixes such as
`_losses.npz` come on top)."""
NOT_PROTOCOL = ("out", "no_progress", "threads", "device", "batch_size")
"""Options that do not change what a result measures: a rerun with other values may overwrite."""


class EvalError(UserError, ValueError):
    """An evaluation cannot run as asked (the message names the flag or file)."""


def _applies_somewhere(model, section: dict) -> None:
    """--temperature on the NoPE layers of a model with none would scale nothing while the result
    files are named after it: refused."""
    from lenext_dist.attention.temperature import applies

    from .adapter import attention_layers

    names = [getattr(a.position, "name", None) for a in attention_layers(model)]
    if not any(applies(section, n) for n in names):
        raise EvalError(f"--temperature {section.get('kind')}: on {section.get('layers', 'nope')} "
                        f"layers, but this model has no NoPE layer ({', '.join(map(str, sorted(set(names))))}): "
                        "it would change nothing; add layers=all to the spec, or drop it")


@dataclass(kw_only=True)
class EvalJob:
    """Options every evaluation shares (the flags of `lenext eval <kind>`; see eval/cli.py).

    A kind is one class, registered with `register`: its options (fields), `run` (which writes
    the JSON with `"kind": result_kind` and its plots), the texts of `lenext eval KIND --help`
    (help, description, example) and the section `lenext report` renders from its results."""
    kind: ClassVar[str] = ""
    help: ClassVar[str] = ""
    """One line, in `lenext eval --help`'s list of kinds."""
    description: ClassVar[str] = ""
    example: ClassVar[str] = ""
    result_kind: ClassVar[str] = ""
    """The `kind` its result JSON records (default: `kind`)."""
    section: ClassVar[Optional[Callable[[list, Callable], list[str]]]] = None
    """(pairs of (run, result JSON), label(run, json)) -> the markdown lines of `lenext report`."""
    model: str = option(None, str, "HF model directory (config.json, weights, tokenizer.model); loaded "
                        "with trust_remote_code=True", required=True)
    out: Optional[str] = option(None, str, "output folder (default results/<model name>)")
    tokenizer: Optional[str] = option(None, str, "SentencePiece .model (default <model>/tokenizer.model)")
    dtype: Optional[str] = option(None, help="weights/activations dtype (default: bfloat16 on CUDA, "
                                  "float32 elsewhere)", choices=DTYPES)
    device: Optional[str] = option(None, str, "cpu / cuda / cuda:1 (default: cuda if any)")
    threads: Optional[int] = option(None, pos_int, "torch CPU threads")
    batch_size: int = option(1, pos_int, "windows (prompts) per forward")
    scale_c: Optional[float] = option(None, pos_float, "set a uniform scale lambda = c/sqrt(d) on every "
                                      "head before evaluating")
    window: Optional[int] = option(None, pos_int, "sliding-window (local) attention of W tokens at eval "
                                   "time, on any variant")
    rope_scaling: Optional[str] = option(None, help="RoPE extension at eval time (RoPE models), with "
                                         "--rope-factor", choices=ROPE_SCALINGS)
    rope_factor: Optional[float] = option(None, pos_float, "s = target / training length")
    temperature: Optional[str] = option(
        None, temperature, "a temperature schedule on the NoPE layers (layers=all: every layer), e.g. "
        "log_fit:a=0.3, llama4:floor_scale=64,attn_scale=0.1, qwen_logn, uniform:c=1.5",
        metavar="KIND[:k=v,...]")
    train_length: Optional[int] = option(None, pos_int, "training context L (default: from the model config)")
    no_progress: bool = option(False, help="no tqdm progress bars", action="store_true")
    bos: Optional[bool] = option(None, help="start every document (ppl, entropy, scale-sweep) or prompt "
                                 "(passkey) with BOS; default: as the model was trained (config "
                                 "bos_at_document_start)", action=argparse.BooleanOptionalAction)

    def __post_init__(self) -> None:
        check_fields(self, lambda message: EvalError(f"lenext eval {self.kind}: {message}"))

    # ------------------------------------------------------------------ naming
    @property
    def out_dir(self) -> Path:
        return Path(self.out or os.path.join("results", os.path.basename(os.path.normpath(self.model))))

    @property
    def suffix(self) -> str:
        """Names every eval-time change of the model, e.g. `_c1.2_w64_ntk4`."""
        parts = [("c", self.scale_c), ("w", self.window),
                 (self.rope_scaling or "", self.rope_factor if self.rope_scaling else None)]
        out = "".join(f"_{k}{v:g}" for k, v in parts if v is not None)
        if self.temperature:  # 'llama4:floor_scale=64' -> _t-llama4-floor_scale64
            t = temperature_section(self.temperature)
            out += "_t-" + "-".join([t.pop("kind")] + [f"{k}{v:g}" if isinstance(v, float) else
                                                        f"{k}-{v}" for k, v in t.items()])
        return out

    @property
    def stem(self) -> Path:
        """Result path without extension (the JSON, PNG, NPZ share it)."""
        raise NotImplementedError

    def _stem(self, name: str) -> Path:
        """out_dir / name, the name bounded (a long --task-set list or temperature spec would pass
        the file system's 255 bytes only when the results are written, after the whole run):
        past NAME_MAX characters its tail becomes a hash of the full name."""
        if len(name) > NAME_MAX:
            name = name[:NAME_MAX - 13] + "_" + hashlib.sha1(name.encode()).hexdigest()[:12]
        return self.out_dir / name

    @property
    def result_path(self) -> Path:
        return self.stem.with_name(self.stem.name + ".json")

    def _recorded_args(self) -> Optional[dict]:
        """The options of the run whose results sit at result_path (None: no such file)."""
        try:
            return json.loads(self.result_path.read_text()).get("args", {})
        except FileNotFoundError:
            return None
        except OSError as e:
            # the results folder itself is wrong (--out, or results/<model name> without it)
            where = f"--out {self.out}" if self.out else f"the results folder {self.out_dir}"
            if e.errno == errno.ENOTDIR:
                raise EvalError(f"{where}: a file where a folder is needed; pass a folder "
                                "to --out") from None
            if e.errno == errno.ENAMETOOLONG:
                raise EvalError(f"{where}: a name too long for the file system; pass a shorter "
                                "--out") from None
            raise EvalError(f"{self.result_path}: cannot read the result ({e.strerror or e}); "
                            "move it away or pass --out") from None
        except (ValueError, AttributeError) as e:
            raise EvalError(f"{self.result_path}: not a readable result ({type(e).__name__}); "
                            "move it away or pass --out") from None

    def _differences(self, recorded: dict) -> list[str]:
        """The options (set in this job) that differ from those the recorded run used."""
        def norm(name, v):
            if name in ("model", "tokenizer") and v is not None:
                return os.path.realpath(v)
            if name == "data" and v is not None:
                return [os.path.abspath(x) for x in v]
            return json.loads(json.dumps(v, default=str))

        out = []
        for f in fields(self):
            mine = getattr(self, f.name)
            if f.name in NOT_PROTOCOL or mine is None or f.name not in recorded:
                continue
            if norm(f.name, mine) != norm(f.name, recorded[f.name]):
                out.append(f"--{f.name.replace('_', '-')} {recorded[f.name]} there, {mine} here")
        return out

    def done(self) -> bool:
        """The results exist and were made with this job's options (a run with others: False,
        and run() then refuses to overwrite them)."""
        recorded = self._recorded_args()
        return recorded is not None and not self._differences(recorded)

    # ------------------------------------------------------------------ running
    def run(self) -> list[str]:
        """Evaluate and write the results; returns the files written (also printed). Results of
        a run with other options at the same path are refused before anything runs."""
        recorded = self._recorded_args()
        diff = self._differences(recorded) if recorded is not None else []
        if diff:
            raise EvalError(f"lenext eval {self.kind}: {self.result_path} holds results made with "
                            f"other options ({'; '.join(diff)}); pass --out to another folder, or "
                            "remove the file")
        made = not self.out_dir.exists()
        try:
            files = self._run()
        except BaseException as e:
            if made and self.out_dir.is_dir() and not any(self.out_dir.iterdir()):
                self.out_dir.rmdir()  # a failed evaluation leaves no empty results folder
            # the eval library raises ValueError/TypeError for inputs it cannot use (documents too
            # short, a model that is not Llama-shaped, a stride that does not divide): user errors
            if not isinstance(e, (ValueError, TypeError)) or isinstance(e, UserError):
                raise
            raise EvalError(f"lenext eval {self.kind}: {e}") from e
        for f in files:
            print(f"wrote {f}")
        return files

    def _run(self) -> list[str]:
        raise NotImplementedError

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or os.path.join(self.model, "tokenizer.model")

    def _setup(self):
        """-> (model with this job's eval-time options applied, training length L, meta dict)."""
        import torch

        from .adapter import layout, set_uniform_scale, set_variant, train_length, trained_with_bos

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.dtype is None:  # resolved here, so the JSON records the dtype that ran
            self.dtype = default_dtype(self.device)
        model = load_model(self.model, self.dtype, self.device, progress=not self.no_progress)
        if self.scale_c is not None:
            set_uniform_scale(model, self.scale_c)
        options = {k: v for k, v in (("window", self.window), ("temperature", self.temperature and
                   temperature_section(self.temperature))) if v is not None}
        rope = {k: v for k, v in (("scaling", self.rope_scaling), ("factor", self.rope_factor))
                if v is not None}
        # --train-length is L for the model too (the temperature schedules of i / L, YaRN's
        # original length), not only for the plots: the export's variants are rebuilt with it
        relength = (self.train_length is not None and layout(model) == "lenext"
                    and self.train_length != train_length(model))
        if relength:
            model.config.train_length = self.train_length
        if options or rope or relength:
            set_variant(model, rope=rope or None, **options)
        if options.get("temperature", {}).get("kind", "none") != "none":
            _applies_somewhere(model, options["temperature"])
        L = self.train_length or train_length(model)
        if self.bos is None:  # the model's training decides (recorded in the JSON's args)
            self.bos = trained_with_bos(model, self.model)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        meta = {"command": " ".join(sys.argv),
                "args": {"eval_cmd": self.kind, **asdict(self)},
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "model": model_info(model, self.model, self)}
        meta["model"]["train_length"] = L
        return model, L, meta


@dataclass(kw_only=True)
class DataJob(EvalJob):
    """An evaluation over documents (--data)."""
    # type=None: argparse collects the strings, `paths` checks the list
    data: list[str] = option(None, paths, ".jsonl / .jsonl.zst / .txt files, globs or folders",
                             required=True, nargs="+", type=None)
    text_key: str = option("text", str, "JSON field holding the text")
    max_docs: Optional[int] = option(None, pos_int, "use the first N documents")

    def _docs(self, min_tokens: int):
        from .data import load_documents

        return load_documents(self.data, self.tokenizer_path, text_key=self.text_key,
                              min_tokens=min_tokens, max_docs=self.max_docs, bos=self.bos)


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
