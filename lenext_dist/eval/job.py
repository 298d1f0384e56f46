"""The evaluation job: what every `lenext eval` kind shares (eval/jobs.py holds the kinds).

`EvalJob` holds the options of every kind (model, output folder, dtype, device, eval-time changes
of the model: a uniform scale c, a sliding window, RoPE scaling, a temperature schedule), checked in
`__post_init__` (the same one-line messages as `lenext eval`'s flags, from the same checks in
eval/options.py); `run()` loads the model, calls the kind's `_run` and writes its JSON + PNG; the
result file names come from here alone (`result_path`, `suffix`), so runs with different options
never collide. `DataJob` adds the documents (--data) of the kinds that read them.
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

from lenext_dist.errors import UserError
from lenext_dist.flags import check_fields, option, pos_float, pos_int

from .model_io import default_dtype, load_model, model_info
from .options import DTYPES, ROPE_SCALINGS, paths, temperature, temperature_section


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
    protocol_version: ClassVar[int] = 0
    """Raised when the kind draws or scores otherwise for the same options: its JSON records it
    (`args.protocol_version`, absent = 0), and a result of another version is neither taken as
    done nor overwritten."""
    model: str = option(None, str, "HF model directory (config.json, weights, tokenizer.model); no code "
                        "from it runs (a custom export loads with lenext_dist.hf)", required=True)
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
        if recorded.get("protocol_version", 0) != self.protocol_version:
            out.append(f"protocol version {recorded.get('protocol_version', 0)} there (lenext eval "
                       f"{self.kind} then drew or scored otherwise), {self.protocol_version} here")
        for f in fields(self):
            mine = getattr(self, f.name)
            if f.name == "dtype" and mine is None:  # what _run would resolve it to on this machine
                mine = default_dtype(self.device)
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
                "args": {"eval_cmd": self.kind, **asdict(self),
                         "protocol_version": self.protocol_version},
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
