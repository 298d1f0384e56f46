"""`python -m lenext_dist.convert` / `lenext convert`: its options (`build_parser`) and the export
they ask for (`run`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from lenext_dist.dtypes import CHOICES, canonical
from lenext_dist.flags import Parser, pos_float

PROG = "python -m lenext_dist.convert"
DESCRIPTION = (
    "Export a training checkpoint to a Hugging Face model folder.\n\n"
    "--format custom (default) ships the project's modeling code: every position "
    "variant; load it with\ntrust_remote_code=True. --format stock writes a standard "
    "transformers model that needs no remote\ncode (NoPE -> SmolLM3ForCausalLM, "
    "RoPE -> LlamaForCausalLM or MistralForCausalLM, iRoPE and\nLlama 4's QK-norm -> "
    "Llama4ForCausalLM, RMS QK-norm -> Qwen3ForCausalLM, partial RoPE ->\nGlmForCausalLM); "
    "other variants are refused. "
    "--verify reloads the export and compares its logits with the checkpoint's.\n\n"
    "--from-hf HF_DIR goes the other way: a Hugging Face folder (Llama, Mistral, SmolLM3, Qwen3, "
    "Llama 4 text\nwith dense MLPs, or our custom export; safetensors only, no remote code) -> a run "
    "folder --out with\nconfig.yaml and checkpoints/ that `lenext train` (checkpoint.init_from) "
    "and `lenext extend --base`\nstart from; KEY=VALUE overrides go into its config.yaml.")


def epilog(prog: str) -> str:
    return ("examples:\n"
            f"  {prog} --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope "
            "--verify\n"
            f"  {prog} --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope-c1.5 "
            "--scale-c 1.5\n"
            f"  {prog} --checkpoint runs/tiny-cpu-nope/checkpoints --out hf/tiny-nope-stock "
            "--format stock --verify\n"
            f"  {prog} --from-hf ~/models/TinyLlama-NoPE-1.1B --out runs/tinyllama-nope "
            "attention.position=nope\n\n"
            "Manual: docs/export.md, docs/import.md")


def step_name(s: str) -> str:
    """--tag: a step folder's name; an empty one would name the checkpoint folder itself."""
    if not s.strip():
        raise argparse.ArgumentTypeError("is empty; name a step_NNNNNNN folder, or leave --tag out "
                                         "for the latest")
    return s


def build_parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    p = p or Parser(prog=PROG)
    p.description, p.epilog = DESCRIPTION, epilog(p.prog)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint",
                     help="checkpoint folder (uses its `latest`) or a step_* folder in it")
    src.add_argument("--from-hf", metavar="HF_DIR",
                     help="import: a Hugging Face model folder -> a run folder (--out) to train "
                          "or extend from (docs/import.md)")
    p.add_argument("--out", required=True, help="output folder (created)")
    exp = p.add_argument_group("export options (--checkpoint only)")
    exp.add_argument("--tag", type=step_name, help="step_NNNNNNN folder inside --checkpoint (default: latest)")
    exp.add_argument("--format", default="custom", choices=["custom", "stock"],
                     help="custom: model_type lenext + our modeling code (default, every variant); "
                          "stock: a transformers architecture without remote code, scales folded "
                          "into q_proj (NoPE[+window] -> SmolLM3, RoPE[+PI/NTK/YaRN] -> Llama, "
                          "iRoPE / l2 QK-norm -> Llama 4, rms QK-norm -> Qwen3, partial RoPE -> GLM)")
    g = exp.add_mutually_exclusive_group()
    g.add_argument("--scale-c", type=pos_float,  # inf: infinite head scales
                   help="export a uniform softmax scale c for every head (lambda = c/sqrt(d))")
    g.add_argument("--head-scales-from",
                   help="per-head scales [layers, heads]: a HeadScale run's checkpoint folder, "
                        "a .json (list of lists) or a .pt tensor")
    exp.add_argument("--tokenizer", help="SentencePiece model (default: the run's data.tokenizer)")
    exp.add_argument("--no-tokenizer", action="store_true", help="do not ship a tokenizer")
    exp.add_argument("--dtype", default="fp32", choices=CHOICES,
                     help="weight dtype in model.safetensors (what training keeps fp32 stays fp32: "
                          "head scales, KERPLE's r1/r2)")
    exp.add_argument("--overwrite", action="store_true", help="replace a previous export in --out (only an export: "
                     "a folder holding anything else, or the checkpoint/run folder, is refused)")
    exp.add_argument("--verify", action="store_true",
                     help="reload the export with transformers and compare its logits with the "
                          "megatron model of the checkpoint (fp32); fail above --tolerance")
    exp.add_argument("--tolerance", type=pos_float, default=1e-4)  # nan: every --verify fails
    # the one declaration of what --from-hf refuses: every option of the group, with its default
    p.set_defaults(_export_only={x.dest: (x.option_strings[0], x.default) for x in exp._group_actions})
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="--from-hf only: config overrides for the imported run's config.yaml "
                        "(data.blend, model.seq_length, ...)")
    return p


def run_import(a: argparse.Namespace) -> int:
    from lenext_dist.config import split_cli_overrides

    from .hf_import import import_hf

    given = [flag if isinstance(getattr(a, dest), bool) else f"{flag} {getattr(a, dest)}"
             for dest, (flag, default) in a._export_only.items() if getattr(a, dest) != default]
    if given:
        print(f"error: export options ({', '.join(given)}) do not go with --from-hf, which takes "
              "--out and KEY=VALUE overrides", file=sys.stderr)
        return 2
    s = import_hf(a.from_hf, a.out, overrides=split_cli_overrides(a.overrides))
    print(f"[lenext.convert] {s['source']} ({s['architecture']}) -> {s['out']}: layers "
          f"{s['layers']}, windows {s['windows']}, chunks {s['chunks']}, rope {s['rope']}, "
          f"temperature {s['temperature']}, L={s['train_length']}; tokenizer files "
          f"{s['tokenizer'] or 'none'}; train from it with checkpoint.init_from="
          f"{s['out']}/checkpoints or `lenext extend --base {s['out']}`")
    return 0


def run(a: argparse.Namespace) -> int:
    """The export of `a` (and its check with --verify): 0, 1 when the logits differ, 2 when
    --verify is asked of a non-fp32 export."""
    if a.from_hf:
        return run_import(a)
    if a.overrides:
        print(f"error: KEY=VALUE overrides ({a.overrides[0]}) are for --from-hf only", file=sys.stderr)
        return 2
    if a.verify and canonical(a.dtype) != "fp32":  # before the export: refused, nothing written
        print("error: --verify needs --dtype fp32 (it compares fp32 logits); drop one of them",
              file=sys.stderr)
        return 2
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
        diff = verify(a.out)
        ok = diff < a.tolerance
        print(f"[lenext.convert] verify: max |logits_hf - logits_megatron| = {diff:.3e} "
              f"({'ok' if ok else 'FAILED'}, tolerance {a.tolerance:g})")
        if not ok:
            return 1
    print(json.dumps({"head_scales": hs}))
    return 0
