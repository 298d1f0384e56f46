"""One item of a data blend (data.blend, data.valid_blend, train.stages[].blend)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .checks import _check


@dataclass
class BlendItem:
    prefix: str
    """Path prefix of a megatron .bin/.idx pair (relative paths are from the current directory)."""
    weight: float = 1.0
    """Sampling weight in the blend (normalized over all items)."""
    text: bool = False
    """Under data.task_loss 'answers': this shard is text and trains on all its tokens. Needed for
    a shard with neither an answer mask nor a manifest beside it saying it is text (a task shard
    copied without its mask would otherwise train on its filler unnoticed), e.g.
    `{prefix: shards/web_train, weight: 0.5, text: true}`; refused on a shard with a mask."""

    def __post_init__(self):
        _check(self.weight > 0, "data.blend[].weight", "must be > 0")  # NaN and inf: the loader's


def check_weights(items: list[BlendItem], key: str) -> None:
    """The blend's weights must sum to a finite number: megatron normalizes by the sum (each item
    finite, two of 1e308 still overflow, and every weight would become 0)."""
    _check(math.isfinite(sum(item.weight for item in items)), key,
           "the weights sum past the largest float; scale them down (only their ratios count)")
