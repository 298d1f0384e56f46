"""python -m lenext_dist.convert --checkpoint runs/x/checkpoints --out hf/x [options]"""
from __future__ import annotations

import argparse
import json
import os
import sys

from lenext_dist.dtypes import CHOICES, canonical
from lenext_dist.errors import entry_point


@entry_point
def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lenext_dist.convert",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a training checkpoint to a Hugging Face model folder.\n\n"
                    "--format custom (default) ships the project's modeling code: every position "
                    "variant; load it with\ntrust_remote_code=True. --format stock writes a standard "
                    "transformers model that needs no remote\ncode (NoPE -> SmolLM3ForCausalLM, "
                    "RoPE -> LlamaForCausalLM or MistralForCausalLM); other variants\nare refused. "
                    "--verify reloads the export and compares its logits with the checkpoint's.",
        epilog="examples:\n"
               "  python -m lenext_dist.convert --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope "
               "--verify\n"
               "  python -m lenext_dist.convert --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope-c1.5 "
               "--scale-c 1.5\n"
               "  python -m lenext_dist.convert --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope-stock "
               "--format stock --verify\n\n"
               "Manual: docs/export.md")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint folder (uses its `latest`) or a step_* folder in it")
    p.add_argument("--tag", help="step_NNNNNNN folder inside --checkpoint (default: latest)")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--format", default="custom", choices=["custom", "stock"],
                   help="custom: model_type lenext + our modeling code (default, every variant); "
                        "stock: a transformers architecture without remote code, scales folded "
                        "into q_proj (NoPE[+window] -> SmolLM3, RoPE[+PI/NTK/YaRN] -> Llama)")
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
    a = p.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
