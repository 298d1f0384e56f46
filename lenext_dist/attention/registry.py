"""The attention-variant registry: config names -> classes. Adding a variant is a new module with a
`PositionVariant` subclass and one line here; core code never branches on a name.

`AttentionConfig.__post_init__` validates `attention.position` against `POSITIONS`. Which layers
run which variant is the layout's (layout.py: `layer_variants` builds each layer's through
`build_position`).
"""
from __future__ import annotations

from typing import Optional

from .alibi import ALiBi
from .kerple import KerpleLog, KerplePower
from .cfg import cfg_get
from .position import NoPE, PositionVariant
from .rope import RoPE
from .sandwich import Sandwich
from .xpos import XPOS

POSITIONS: dict[str, type[PositionVariant]] = {
    "nope": NoPE,
    "rope": RoPE,
    "alibi": ALiBi,
    "kerple_log": KerpleLog,
    "kerple_power": KerplePower,
    "sandwich": Sandwich,
    "xpos": XPOS,
}
"""Sliding-window attention is not a variant: `attention.window` composes with every one."""


def build_position(attn_cfg, *, head_dim: int, train_length: int,
                   num_heads: Optional[int] = None) -> PositionVariant:
    """attn_cfg: `AttentionConfig` (duck-typed: .position, .rope, .window, ...; missing optional
    attributes take their defaults). train_length: the model's training context L (YaRN's
    original_max_position_embeddings, the log-length scale's L, XPOS's block). num_heads: query
    heads (needed by per-head biases: alibi, kerple_*, sandwich).

    Returns one variant; a layer holds `variant.for_layer()` (the same object when the variant has
    no parameters, an independently initialized copy per layer otherwise)."""
    try:
        cls = POSITIONS[attn_cfg.position]
    except KeyError:
        raise ValueError(f"unknown attention.position {attn_cfg.position!r}; "
                         f"registered: {sorted(POSITIONS)}") from None
    scaling = cfg_get(attn_cfg, "rope", "scaling", default="none")
    if scaling != "none" and not cls.rope_scalings:
        # e.g. --rope-scaling yarn on a NoPE export: the numbers would be the unscaled model's
        raise ValueError(f"rope.scaling={scaling!r} scales a RoPE rotation; position "
                         f"{attn_cfg.position!r} has none to scale (use rope.scaling 'none')")
    fraction = float(cfg_get(attn_cfg, "rope", "fraction", default=1.0))
    if fraction != 1.0 and not cls.rope_scalings:
        raise ValueError(f"rope.fraction={fraction} rotates part of each head with RoPE; position "
                         f"{attn_cfg.position!r} has no RoPE rotation (use rope.fraction 1.0)")
    variant = cls.from_config(attn_cfg, head_dim=head_dim, train_length=train_length,
                              num_heads=num_heads)
    return variant.configure(attn_cfg, train_length=train_length)
