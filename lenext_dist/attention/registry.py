"""The attention-variant registry: config names -> classes. Adding a variant is a new module with a
`PositionVariant` subclass and one line here; core code never branches on a name.

`AttentionConfig.__post_init__` validates `attention.position` against `POSITIONS`.
"""
from __future__ import annotations

from .position import NoPE, PositionVariant
from .rope import RoPE

POSITIONS: dict[str, type[PositionVariant]] = {
    "nope": NoPE,
    "rope": RoPE,
    # later: "alibi", "kerple", "sandwich", "xpos", "local" (see position.py for the hooks)
}


def build_position(attn_cfg, *, head_dim: int, train_length: int) -> PositionVariant:
    """attn_cfg: `AttentionConfig` (duck-typed: .position, .rope, ...). train_length: the model's
    training context L (YaRN's original_max_position_embeddings; future log-length scales)."""
    try:
        cls = POSITIONS[attn_cfg.position]
    except KeyError:
        raise ValueError(f"unknown attention.position {attn_cfg.position!r}; "
                         f"registered: {sorted(POSITIONS)}") from None
    return cls.from_config(attn_cfg, head_dim=head_dim, train_length=train_length)
