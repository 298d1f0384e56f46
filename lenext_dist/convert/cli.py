"""`python -m lenext_dist.convert` / `lenext convert`: its options (`build_parser`) and the export
they ask for (`run`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from lenext_dist.dtypes import CHOICES, canonical

PROG = "python -m lenext_dist.convert"
DESCRIPTION = (
    "Export a training checkpoint to a Hugging Face model folder.\n\n"
    "--format custom (default) ships the project's modeling code: every position "
    "variant; load it with\ntrust_remote_code=True. --format stock writes a standard "
    "transformers model that needs no remote\ncode (NoPE -> SmolLM3ForCausalLM, "
    "RoPE -> LlamaForCausalLM or MistralForCausalLM, iRoPE and\nLlama 4's QK-norm -> "
    "Llama4ForCausalLM, RMS QK-norm -> Qwen3ForCausalLM, partial RoPE ->\nGlmForCausalLM); "
    "other variants are refused. "
    "--verify reloads the export and compares its logits with the checkpoint's.")


def epilog(prog: str) -> str:
    return ("examples:\n"
            f"  {prog} --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope "
            "--verify\n"
            f"  {prog} --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope-c1.5 "
            "--scale-c 1.5\n"
            f"  {prog} --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope-stock "
            "--format stock --verify\n\n"
            "Manual: docs/export.md")


def build_parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog=PROG)
    p.description, p.epilog = DESCRIPTION, epilog(p.prog)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint folder (uses its `latest`) or a step_* folder in it")
    p.add_argument("--tag", help="step_NNNNNNN folder inside --checkpoint (default: latest)")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--format", default="custom", choices=["custom", "stock"],
                   help="custom: model_type lenext + our modeling code (default, every variant); "
                        "stock: a transformers architecture without remote code, scales folded "
                        "into q_proj (NoPE[+window] -> SmolLM3, RoPE[+PI/NTK/YaRN] -> Llama, "
                        "iRoPE / l2 QK-norm -> Llama 4, rms QK-norm -> Qwen3, partial RoPE -> GLM)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scale-c", type=float,
                   help="export a uniform softmax scale c for every head (lambda = c/sqrt(d))")
    g.add_argument("--head-scales-from",
                   help="per-head scales [layers, heads]: a HeadScale run's checkpoint folder, "
                        "a .json (list of lists) or a .pt tensor")
    p.add_argument("--tokenizer", help="SentencePiece model (default: the run's data.tokenizer)")
    p.add_argument("--no-tokenizer", action="store_true", help="do not ship a tokenizer")
    p.add_argument("--dtype", default="fp32", choices=CHOICES,
                   help="weight dtype in model.safetensors (head scales stay fp32)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export in --out (only an export: "
                   "a folder holding anything else, or the checkpoint/run folder, is refused)")
    p.add_argument("--verify", action="store_true",
                   help="reload the export with transformers and compare its logits with the "
                        "megatron model of the checkpoint (fp32); fail above --tolerance")
    p.add_argument("--tolerance", type=float, default=1e-4)
    return p


def run(a: argparse.Namespace) -> int:
    """The export of `a` (and its check with --verify): 0, 1 when the logits differ, 2 when
    --verify is asked of a non-fp32 export."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu") if a.verify else None

    from .export import export, verify

    info = export(a.checkpoint, a.out, tag=a.tag, scale_c=a.scale_c,
                  head_scales=a.head_scales_from,
                  tokenizer="" if a.no_tokenizer else a.tokenizer,
                  dtype=a.dtype, overwrite=a.overwrite, fmt=a.format)
    hs = info.pop("head_scales")
    print(f"[lenext.convert] {info['checkpoint']} -> {info['out']}: {info['architecture']} "
          f"({info['format']}), position={info['position']}, "
          f"head scales {info['head_scale_source']} (c={info['scale_c']}), weights from "
          f"{info['weights']} (ZeRO-{info['zero_stage']}, {info['train_precision']}) as {a.dtype}")
    if a.verify:
        if canonical(a.dtype) != "fp32":
            print("error: --verify needs --dtype fp32", file=sys.stderr)
            return 2
        diff = verify(a.out)
        ok = diff < a.tolerance
        print(f"[lenext.convert] verify: max |logits_hf - logits_megatron| = {diff:.3e} "
              f"({'ok' if ok else 'FAILED'}, tolerance {a.tolerance:g})")
        if not ok:
            return 1
    print(json.dumps({"head_scales": hs}))
    return 0
