"""The one dtype vocabulary. The project's names are fp32 / bf16 / fp16 (train.precision,
parallel.reduce_dtype, `convert --dtype`); torch's and HF's spellings float32 / bfloat16 /
float16 are documented aliases, accepted wherever a dtype is named on the command line
(`lenext eval --dtype` keeps float32 as its default and in its result records). Torch is imported
only when a torch dtype is asked for, so `--help` stays fast."""
from __future__ import annotations

NAMES = ("fp32", "bf16", "fp16")
TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # also HF's config.json `dtype`
ALIASES = {v: k for k, v in TORCH_NAMES.items()}
CHOICES = NAMES + tuple(ALIASES)  # what a --dtype flag accepts


def canonical(name: str) -> str:
    """'float32' -> 'fp32'; 'fp32' -> 'fp32'; anything else: ValueError naming the choices."""
    if name in TORCH_NAMES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    raise ValueError(f"unknown dtype {name!r}: use one of {', '.join(NAMES)} "
                     f"(or torch's {', '.join(ALIASES)})")


def torch_dtype(name: str):
    """'bf16' or 'bfloat16' -> torch.bfloat16."""
    import torch

    return getattr(torch, TORCH_NAMES[canonical(name)])
