"""The one place that silences warnings known to be harmless, so a run shows what the user needs
(steps, progress, results, where outputs went).

Each filter names the exact message (a regex anchored at its start, as `warnings` matches) and its
category; nothing else is hidden. Installed by `errors.entry_point` for every command (`python -m
lenext_dist.train` on each rank, `lenext ...`, `python -m lenext_dist.convert`); `--debug` /
LENEXT_DEBUG=1 keeps them all.
Without them a 2-rank pretrain prints 30 such lines (each megatron module warns once per rank and
process).
"""
from __future__ import annotations

import warnings

# (message regex, category, why it is harmless here)
HARMLESS: tuple[tuple[str, type[Warning], str], ...] = (
    (r"Transformer Engine and Apex are not installed", UserWarning,
     "megatron-core falls back to torch optimizers and multi-tensor kernels: the path we use "
     "(DeepSpeed owns the optimizer; TE/Apex are not dependencies)"),
    (r"Apex is not installed\. Falling back to Torch Norm", UserWarning,
     "the torch norm is what the local (non-TE) layer spec builds on CPU and without Apex"),
    (r"full scope is deprecated\. Use empty cuda_graph_scope", UserWarning,
     "megatron's own TransformerConfig default in 0.16.1; we use no CUDA graphs"),
    (r"`torch\.distributed\.all_gather_into_tensor` is deprecated", FutureWarning,
     "called inside DeepSpeed 0.19.8's ZeRO; still supported by torch 2.13"),
)


def install() -> None:
    """Add the filters (idempotent: `warnings` drops an identical filter before re-adding it)."""
    for message, category, _why in HARMLESS:
        warnings.filterwarnings("ignore", message=message, category=category)
