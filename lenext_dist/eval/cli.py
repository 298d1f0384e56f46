"""`lenext eval {ppl,passkey,entropy,scale-sweep}`: load a model directory, run one evaluation,
write JSON (+ PNG) into --out. Every JSON records the exact protocol, the model (path, config,
attention layout, scales) and the data (files, sha256, token counts).

Output files in --out (default results/<model dir name>):
  ppl        ppl_<protocol>[_c<C>].json, ppl_<protocol>[_c<C>].png, penalty_<...>.png
  passkey    passkey[_c<C>].json, passkey[_c<C>].png
  entropy    entropy[_c<C>]_<N>.json, .png, .npz (full [layers, heads, N] array)
  scale-sweep  scale_sweep.json, scale_sweep.png, scale_sweep_losses.npz
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Optional, Sequence

import numpy as np

from lenext_dist.errors import UserError, entry_point


# argparse `type=` checks: a bad value exits 2 with "argument --flag: ..." before any model loads
def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None


def _float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not np.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be finite, got {s!r}")
    return v


def _pos_int(s: str) -> int:
    v = _int(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def _nonneg_int(s: str) -> int:
    v = _int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _pos_float(s: str) -> float:
    v = _float(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v:g}")
    return v


def _ints(s: str) -> list[int]:
    """'2048,4096' -> [2048, 4096]: a non-empty list of lengths > 0."""
    out = [_pos_int(x) for x in s.replace(" ", "").split(",") if x]
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of lengths > 0")
    return out


def _depths(s: str) -> str:
    """'N' (N >= 1 evenly spaced depths) or a list of depths in [0, 1]."""
    from .passkey import parse_depths

    try:
        d = parse_depths(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or a list of depths in [0, 1], got {s!r}") from None
    if not d or not all(0.0 <= x <= 1.0 for x in d):
        raise argparse.ArgumentTypeError(f"needs at least one depth, each in [0, 1], got {s!r}")
    return s


def _add_common(p: argparse.ArgumentParser, data: bool = True) -> None:
    p.add_argument("--model", required=True, help="HF model directory (config.json, weights, "
                   "tokenizer.model); loaded with trust_remote_code=True")
    p.add_argument("--out", default=None, help="output folder (default results/<model name>)")
    p.add_argument("--tokenizer", default=None,
                   help="SentencePiece .model (default <model>/tokenizer.model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default=None, help="cpu / cuda / cuda:1 (default: cuda if any)")
    p.add_argument("--threads", type=_pos_int, default=None, help="torch CPU threads")
    p.add_argument("--batch-size", type=_pos_int, default=1, help="windows (prompts) per forward")
    p.add_argument("--scale-c", type=_pos_float, default=None,
                   help="set a uniform scale lambda = c/sqrt(d) on every head before evaluating")
    p.add_argument("--window", type=_pos_int, default=None,
                   help="sliding-window (local) attention of W tokens at eval time, on any variant")
    p.add_argument("--rope-scaling", default=None, choices=["none", "pi", "ntk", "yarn"],
                   help="RoPE extension at eval time (RoPE models), with --rope-factor")
    p.add_argument("--rope-factor", type=_pos_float, default=None, help="s = target / training length")
    p.add_argument("--log-scale-a", type=_float, default=None,
                   help="position-dependent scale lambda_i = c (1 + a ln max(1, i/L)) / sqrt(d)")
    p.add_argument("--train-length", type=_pos_int, default=None,
                   help="training context L (default: from the model config)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    p.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None,
                   help="start every document (ppl, entropy, scale-sweep) or prompt (passkey) "
                   "with BOS; default: as the model was trained (config bos_at_document_start)")
    if data:
        p.add_argument("--data", nargs="+", required=True,
                       help=".jsonl / .jsonl.zst / .txt files, globs or folders")
        p.add_argument("--text-key", default="text", help="JSON field holding the text")
        p.add_argument("--max-docs", type=_pos_int, default=None, help="use the first N documents")


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    ap = parser or argparse.ArgumentParser(prog="lenext eval", description=__doc__,
                                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="eval_cmd", required=True)

    p = sub.add_parser("ppl", help="sliding-window perplexity at several lengths")
    _add_common(p)
    p.add_argument("--lengths", type=_ints, required=True, help="e.g. 2048,4096,8192")
    p.add_argument("--stride", type=_pos_int, default=256, help="S (last-stride and yarn)")
    p.add_argument("--protocol", default="last-stride", choices=["last-stride", "yarn", "full"])
    p.add_argument("--budget-tokens", type=_pos_int, default=None,
                   help="scored tokens per length (whole windows, interleaved across documents)")
    p.add_argument("--curve-all", action="store_true",
                   help="per-position curve over all window positions, not only scored ones")
    p.add_argument("--no-penalty", action="store_true",
                   help="skip the extrapolation penalty / context-use pass (lengths >= L)")
    p.add_argument("--penalty-stride", type=_pos_int, default=None,
                   help="stride of the window-L baseline (default L/4; must divide W-L)")

    p = sub.add_parser("passkey", help="passkey retrieval, length x depth heatmap")
    _add_common(p, data=False)
    p.add_argument("--lengths", type=_ints, required=True)
    p.add_argument("--depths", type=_depths, default="10", help="N evenly spaced depths in [0,1], or a list")
    p.add_argument("--keys", type=_pos_int, default=10, help="random 5-digit keys per cell")
    p.add_argument("--seed", type=_nonneg_int, default=0)
    p.add_argument("--max-new-tokens", type=_pos_int, default=8)

    p = sub.add_parser("entropy", help="per-position attention entropy per head and layer")
    _add_common(p)
    p.add_argument("--length", type=_pos_int, required=True)
    p.add_argument("--samples", type=_pos_int, default=8, help="windows averaged over")
    p.add_argument("--chunk-size", type=_pos_int, default=None, help="query rows per chunk "
                   "(default: from --mem-mb)")
    p.add_argument("--mem-mb", type=_pos_int, default=256, help="memory for one chunk of probs")

    p = sub.add_parser("scale-sweep", help="uniform-scale grid, best c per position, log fit")
    _add_common(p)
    p.add_argument("--length", type=_pos_int, required=True)
    p.add_argument("--c-min", type=_pos_float, default=0.8)
    p.add_argument("--c-max", type=_pos_float, default=2.0)
    p.add_argument("--c-step", type=_pos_float, default=0.01)
    p.add_argument("--budget-tokens", type=_pos_int, default=None, help="tokens per c")
    p.add_argument("--samples", type=_pos_int, default=None, help="windows per c")
    return ap


# ----------------------------------------------------------------------------- shared
def load_model(path: str, dtype: str = "float32", device: Optional[str] = None):
    import torch
    from transformers import AutoModelForCausalLM

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{path}: no config.json (not an HF model directory)")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True,
                                                 dtype=getattr(torch, dtype))
    return model.to(dev).eval()


def _git_commit() -> Optional[str]:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def model_info(model, path: str, args) -> dict:
    import torch
    import transformers

    from .adapter import head_scales, layout

    info = {"path": os.path.abspath(path), "class": type(model).__name__,
            "config": model.config.to_dict(), "dtype": args.dtype,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "scale_c": args.scale_c, "train_length": None}
    try:
        info["attention_layout"] = layout(model)
        m = head_scales(model)
        info["head_scale"] = {"min": float(m.min()), "max": float(m.max()),
                              "mean": float(m.mean())}
        pos = getattr(model.model.layers[0].self_attn, "position", None)
        if pos is not None:
            info["position"] = repr(pos)
    except (TypeError, AttributeError) as e:
        info["attention_layout"] = f"unknown ({e})"
    info["software"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                        "python": platform.python_version(), "lenext_git": _git_commit()}
    return info


def _setup(args):
    import torch

    from .adapter import set_uniform_scale, set_variant, train_length, trained_with_bos

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, args.dtype, args.device)
    if args.scale_c is not None:
        set_uniform_scale(model, args.scale_c)
    options = {k: v for k, v in (("window", args.window), ("log_scale_a", args.log_scale_a)) if v is not None}
    rope = {k: v for k, v in (("scaling", args.rope_scaling), ("factor", args.rope_factor)) if v is not None}
    if options or rope:
        set_variant(model, rope=rope or None, **options)
    L = args.train_length or train_length(model)
    if args.bos is None:  # the model's training decides (recorded in args, so in the JSON)
        args.bos = trained_with_bos(model, args.model)
    out = args.out or os.path.join("results", os.path.basename(os.path.normpath(args.model)))
    os.makedirs(out, exist_ok=True)
    meta = {"command": " ".join(sys.argv),
            "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": model_info(model, args.model, args)}
    meta["model"]["train_length"] = L
    return model, L, out, meta


def _tokenizer(args) -> str:
    return args.tokenizer or os.path.join(args.model, "tokenizer.model")


def _docs(args, min_tokens: int):
    from .data import load_documents

    return load_documents(args.data, _tokenizer(args), text_key=args.text_key,
                          min_tokens=min_tokens, max_docs=args.max_docs, bos=args.bos)


def result_suffix(scale_c=None, window=None, log_scale_a=None, rope_scaling=None,
                  rope_factor=None) -> str:
    """Result-file suffix naming every eval-time change of the model (so runs never collide);
    `lenext extend` and the study find finished results by it."""
    parts = [("c", scale_c), ("w", window), ("loga", log_scale_a),
             (rope_scaling or "", rope_factor if rope_scaling else None)]
    return "".join(f"_{k}{v:g}" for k, v in parts if v is not None)


def _suffix(args) -> str:
    return result_suffix(args.scale_c, args.window, args.log_scale_a, args.rope_scaling,
                         args.rope_factor)


def write_json(obj: dict, path: str) -> str:
    def default(o):
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(type(o).__name__)

    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=default)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- commands
def cmd_ppl(args) -> list[str]:
    from . import plots
    from .ppl import run_ppl

    model, L, out, meta = _setup(args)
    docs = _docs(args, min_tokens=min(args.lengths) + 1)
    res = run_ppl(model, docs, args.lengths, stride=args.stride, protocol=args.protocol,
                  budget_tokens=args.budget_tokens, batch_size=args.batch_size,
                  curve_all=args.curve_all, penalty=not args.no_penalty,
                  penalty_stride=args.penalty_stride, train_length=L,
                  progress=not args.no_progress)
    res = {**meta, **res}
    stem = os.path.join(out, f"ppl_{args.protocol}{_suffix(args)}")
    files = [write_json(res, stem + ".json"), plots.plot_ppl(res, stem + ".png")]
    if any("penalty_binned" in d for d in res["diagnostics"]):
        files.append(plots.plot_penalty(res, os.path.join(
            out, f"penalty_{args.protocol}{_suffix(args)}.png")))
    for r in res["results"]:
        print(f"W={r['length']:>6}  {args.protocol}  ppl {r['ppl']:.4f}  "
              f"({r['scored_tokens']} tokens, {r['windows']} windows)")
    for d in res["diagnostics"]:
        cu = d.get("context_use", {})
        pen = d.get("penalty_mean")
        print(f"W={d['length']:>6}  context use gain {cu.get('gain')} (unpaired "
              f"{cu.get('gain_unpaired')})"
              + (f"  penalty mean {pen:.4f}" if pen is not None else ""))
    return files


def cmd_passkey(args) -> list[str]:
    from . import plots
    from .data import load_tokenizer
    from .passkey import parse_depths, run_passkey

    model, L, out, meta = _setup(args)
    sp = load_tokenizer(_tokenizer(args))
    res = run_passkey(model, sp, args.lengths, parse_depths(args.depths), keys=args.keys,
                      seed=args.seed, batch_size=args.batch_size,
                      max_new_tokens=args.max_new_tokens, bos=args.bos,
                      progress=not args.no_progress)
    res = {**meta, **res, "tokenizer": os.path.abspath(_tokenizer(args))}
    stem = os.path.join(out, f"passkey{_suffix(args)}")
    for Lp, a in zip(res["lengths"], res["accuracy_by_length"]):
        print(f"length {Lp:>6}  accuracy {a:.3f}")
    return [write_json(res, stem + ".json"), plots.plot_passkey(res, stem + ".png")]


def cmd_entropy(args) -> list[str]:
    from . import plots
    from .entropy import evaluate_entropy, summarize_entropy

    model, L, out, meta = _setup(args)
    docs = _docs(args, min_tokens=args.length + 1)
    raw = evaluate_entropy(model, docs.docs, args.length, samples=args.samples,
                           batch_size=args.batch_size, chunk_size=args.chunk_size,
                           mem_bytes=args.mem_mb << 20, progress=not args.no_progress)
    summ = summarize_entropy(raw, L)
    res = {**meta, "kind": "entropy",
           "protocol": {"windows": "non-overlapping windows of `length` tokens, interleaved "
                        "across documents", "samples": raw["samples"],
                        "entropy": "H_i = -sum_j a_ij ln a_ij (nats), fp32, query chunks",
                        "upper_bound": "ln(keys visible to query i): ln(i+1) for 0-based "
                        "query i, ln min(i+1, W) under a sliding window W"},
           "windows": raw["windows"], "data": docs.describe(), **summ}
    stem = os.path.join(out, f"entropy{_suffix(args)}_{args.length}")
    np.savez_compressed(stem + ".npz", entropy=raw["entropy"], upper_bound=raw["upper_bound"])
    print(f"mean entropy at end {summ['mean_at_end']:.4f} "
          f"(normalized {summ['normalized_at_end']:.3f})")
    return [write_json(res, stem + ".json"), plots.plot_entropy(summ, stem + ".png"),
            stem + ".npz"]


def cmd_scale_sweep(args) -> list[str]:
    from . import plots
    from .scale_sweep import make_grid, run_scale_sweep

    if args.scale_c is not None:
        raise EvalError("--scale-c makes no sense with scale-sweep (it sets every c itself)")
    if args.c_min > args.c_max:
        raise EvalError(f"--c-min {args.c_min:g} > --c-max {args.c_max:g}: swap them")
    model, L, out, meta = _setup(args)
    if not L:
        raise EvalError("the training length is unknown: pass --train-length")
    docs = _docs(args, min_tokens=args.length + 1)
    grid = make_grid(args.c_min, args.c_max, args.c_step)
    res, loss = run_scale_sweep(model, docs, args.length, grid, L,
                                budget_tokens=args.budget_tokens, samples=args.samples,
                                batch_size=args.batch_size, progress=not args.no_progress)
    res = {**meta, **res}
    stem = os.path.join(out, "scale_sweep")
    np.savez_compressed(stem + "_losses.npz", loss=loss, grid=np.asarray(grid))
    fit = res["fit"]
    print(f"best c (all positions) {res['best_c_mean']}; fit a = {fit['a']} R2 = {fit['r2']}")
    return [write_json(res, stem + ".json"), plots.plot_scale_sweep(res, stem + ".png"),
            stem + "_losses.npz"]


COMMANDS = {"ppl": cmd_ppl, "passkey": cmd_passkey, "entropy": cmd_entropy,
            "scale-sweep": cmd_scale_sweep}


class EvalError(UserError, ValueError):
    """An evaluation cannot run as asked (the message names the flag or file)."""


def run(args) -> list[str]:
    try:
        files = COMMANDS[args.eval_cmd](args)
    except (ValueError, TypeError) as e:
        # the eval library raises ValueError/TypeError for inputs it cannot use (documents too
        # short, a model that is not Llama-shaped, a stride that does not divide): user errors
        if isinstance(e, UserError):
            raise
        raise EvalError(f"lenext eval {args.eval_cmd}: {e}") from e
    for f in files:
        print(f"wrote {f}")
    return files


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
