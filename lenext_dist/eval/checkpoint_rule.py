"""A checkpoint chosen by a rule written down before the run: the first checkpoint (in training
order) whose score reaches a gate, e.g. the first with whole-answer retrieval >= 0.9 at L (c = 1,
fresh validation documents).

Why a rule and why the first: the length-extension picture of a small model depends on the
checkpoint (DESIGN section 9: once the answer loss is ~0 the effect of a temperature fades), so a
study that picked the checkpoint whose curves look best would be tuning its claim. The first
checkpoint over the gate is the earliest model that has the skill at L; a study reports the final
checkpoint beside it (experiments/nope_length does).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from lenext_dist.checkpoint.layout import COMPLETE, step_of


def checkpoint_tags(folder: Union[str, Path], every: int = 0, upto: int = 0) -> list[str]:
    """The complete step_N folders (with their COMPLETE marker: a run killed mid-save leaves a
    partial one) of a checkpoint folder, in training order; with `every`, only those of the
    run's checkpoint interval (a stop signal saves off it: a rule that read such a checkpoint
    would depend on when the run was interrupted); with `upto`, none past that step (a segment's
    rule: an interrupted later segment's checkpoints are not its own)."""
    tags = [p.name for p in Path(folder).iterdir() if (p / COMPLETE).is_file()
            and (n := step_of(p.name)) is not None and not (every and n % every)
            and not (upto and n > upto)]
    return sorted(tags, key=step_of)


def first_over_gate(tags: Sequence[str], score: Callable[[str], float], gate: float
                    ) -> tuple[Optional[str], list[dict]]:
    """(the first tag whose score >= gate, or None; every score taken, in order). Scores are
    taken in order and stop at the first over the gate (later ones cannot change the choice)."""
    seen = []
    for tag in tags:
        s = float(score(tag))
        seen.append({"tag": tag, "score": s})
        if s >= gate:
            return tag, seen
    return None, seen
