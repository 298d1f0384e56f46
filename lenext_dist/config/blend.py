"""One item of a data blend (data.blend, data.valid_blend, train.stages[].blend)."""
from __future__ import annotations

from dataclasses import dataclass

from .checks import _check


@dataclass
class BlendItem:
    prefix: str
    """Path prefix of a megatron .bin/.idx pair (relative paths are from the current directory)."""
    weight: float = 1.0
    """Sampling weight in the blend (normalized over all items)."""

    def __post_init__(self):
        _check(self.weight > 0, "data.blend[].weight", "must be > 0")
