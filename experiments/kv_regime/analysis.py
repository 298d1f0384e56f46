"""The kv regime's gate (issue 43, item 1), fixed here before the regime's runs: does a model
retrieve in formats it was not trained on, or only in the template it saw?

  formats  FORMATS below: the training mixture itself, 1 / 2 / 3 distractor keys, one value among
           distractors, 9-10 values (more than training's 2-8), and the training mixture over
           filler of other statistics (Zipf-skewed syllables instead of uniform); documents from
           the held-out filler and a generator seed never used in training (eval's test seed)
  score    whole-answer accuracy at L (teacher forced, `lenext eval tasks`), the checkpoint the
           study names (its last); beside it the rule that never retrieves (the answer symbol
           most frequent in the context) on the same documents
  gate     a model passes a format when its accuracy at L is >= GATE and above the baseline's by
           MARGIN; a position (NoPE, RoPE, ...) passes when EVERY seed passes EVERY format and it
           has >= MIN_SEEDS seeds: never the best seed, never a mean
"""
from __future__ import annotations

GATE = 0.9
MARGIN = 0.1
"""A format the baseline solves (one candidate answer in the context) cannot show retrieval."""
MIN_SEEDS = 3

FORMATS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    # (name, `lenext eval tasks --task-set` kv parameters, filler: uniform | zipf)
    ("trained mix", ("values=2:8", "distractors=0:3"), "uniform"),
    ("1 distractor", ("distractors=1",), "uniform"),
    ("2 distractors", ("distractors=2",), "uniform"),
    ("3 distractors", ("distractors=3",), "uniform"),
    ("1 value, 2 distractors", ("values=1", "distractors=2"), "uniform"),
    ("9-10 values", ("values=9:10",), "uniform"),
    ("skewed filler", ("values=2:8", "distractors=0:3"), "zipf"),
)
TRAIN_MIX = ("values=2:8", "distractors=0:3")
"""The training documents' kv parameters (the first format is this mixture, in-format)."""


def passes(accuracy: float, baseline: float) -> bool:
    return accuracy >= GATE and round(accuracy - baseline, 9) >= MARGIN


def gate(scores: dict[str, dict[str, tuple[float, float]]]) -> dict:
    """scores: model name "<position>-s<seed>" -> format name -> (accuracy at L, baseline at L).
    Per position: the seeds, the failures (model, format, accuracy, baseline), a verdict."""
    by_position: dict[str, list[str]] = {}
    for name in scores:
        by_position.setdefault(name.rsplit("-s", 1)[0], []).append(name)
    out = {}
    for pos, names in sorted(by_position.items()):
        fails = [(n, f, *scores[n].get(f, (0.0, 0.0))) for n in sorted(names) for f, _, _ in FORMATS
                 if f not in scores[n] or not passes(*scores[n][f])]
        seeds_ok = len(names) >= MIN_SEEDS
        out[pos] = {"seeds": sorted(names), "failures": fails,
                    "verdict": ("passes" if seeds_ok and not fails else
                                f"too few seeds ({len(names)} < {MIN_SEEDS})" if not fails else
                                "fails")}
    return out
