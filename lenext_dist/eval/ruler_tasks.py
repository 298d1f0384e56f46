"""Which RULER tasks of lm-eval (`lm_eval/tasks/ruler`, the `ruler` group) `lenext eval ruler`
runs, and the guards around lm-eval's data generators (one home: the task table `RULER`).

RULER's synthetic tasks make their prompts with the evaluated model's tokenizer, sized to each
length. Six need nothing from the network (the `lm_eval[ruler]` extras: wonderwords, nltk):
niah_single_1 (repeated filler), niah_multikey_2/3 (needle haystacks), vt, cwe, fwe. The others
download data at generation time (the Paul Graham essays from the Hugging Face hub; SQuAD,
HotpotQA): refused by name, in one line, before anything loads.

Guards, each against a failure seen with lm-eval 0.4.13 and a small-vocabulary tokenizer:
- vt: its sample loop (`vt_utils.sys_vartrack_w_noise_random`) retries forever when the smallest
  prompt (an in-context example of up to 500 tokens + 10 noise sentences + 30 answer tokens) does
  not fit the length: at 512 tokens with a 4K-piece tokenizer it never ends. `min_length`
  measures that smallest prompt first and refuses shorter lengths.
- cwe: when 10 words do not fit, its size search ends at 0 words and every sample has an empty
  answer list (the metric then divides by zero); `min_length` refuses those lengths, and
  `check_samples` refuses any sample without answers or whose answers are not in its prompt.
- nltk: lm-eval's niah module downloads punkt_tab at import; only the essay haystack uses it
  (sentence splitting), so the download is skipped (`quiet_import`).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
from dataclasses import dataclass
from typing import Callable, Optional

MARGIN = 16
"""Tokens of slack on a measured smallest prompt: its random words (needle keys, variable names,
common words) tokenize to a few more or fewer tokens from one draw to the next."""
DRAWS = 8
"""Random draws measured per smallest prompt (the longest counts)."""


@dataclass(frozen=True)
class RulerTask:
    name: str                 # our name (--tasks); lm-eval's is `lm_eval_name`
    lm_eval_name: str
    download: Optional[str] = None   # why it needs the network, or None (offline)
    min_length: Optional[Callable] = None  # (tokenizer, length) -> smallest length that works


def _tokens(tok, text: str) -> int:
    return len(tok(text).input_ids)


def _vt_min_length(tok, length: int) -> int:
    """The smallest vt prompt + answer: lm-eval's in-context example (the most 5-noise steps
    whose prompt + 30 tokens stay under 500) + a 10-noise question + 30 generated tokens."""
    from lm_eval.tasks.ruler import vt_utils

    def longest(noises: int, icl: bool) -> int:
        return max(_tokens(tok, t + " " + " ".join(a)) for t, a in
                   (vt_utils.generate_input_output(noises, 1, 4, is_icl=icl) for _ in range(DRAWS)))

    noises, icl = 5, longest(5, True)
    if icl + 30 + MARGIN >= 500:
        return 10**9  # no in-context example fits lm-eval's 500 tokens: vt cannot run at all
    while (nxt := longest(noises + 5, True)) + 30 < 500:
        noises, icl = noises + 5, nxt
    return icl + longest(10, False) + 30 + MARGIN


def _cwe_min_length(tok, length: int) -> int:
    """The smallest cwe prompt lm-eval's size search accepts: its in-context example + a list of
    10 words (the 10 common ones) + the answer + 120 generated tokens (the template differs
    below and above 4096 tokens, so it is measured at `length`)."""
    from lm_eval.tasks.ruler import cwe_utils

    def one() -> int:
        example, text, answer = cwe_utils.generate_input_output(10, length)
        return _tokens(tok, example + "\n" + text + " "
                       + " ".join(f"{i + 1}. {w}" for i, w in enumerate(answer)))

    return max(one() for _ in range(DRAWS)) + 120 + MARGIN


_ESSAYS = ("the essay haystack downloads Paul Graham's essays from the Hugging Face hub "
           "(baber/paul_graham_essays)")
RULER: dict[str, RulerTask] = {t.name: t for t in (
    RulerTask("niah_single_1", "niah_single_1"),
    RulerTask("niah_multikey_2", "niah_multikey_2"),
    RulerTask("niah_multikey_3", "niah_multikey_3"),
    RulerTask("vt", "ruler_vt", min_length=_vt_min_length),
    RulerTask("cwe", "ruler_cwe", min_length=_cwe_min_length),
    RulerTask("fwe", "ruler_fwe"),
    RulerTask("niah_single_2", "niah_single_2", download=_ESSAYS),
    RulerTask("niah_single_3", "niah_single_3", download=_ESSAYS),
    RulerTask("niah_multikey_1", "niah_multikey_1", download=_ESSAYS),
    RulerTask("niah_multiquery", "niah_multiquery", download=_ESSAYS),
    RulerTask("niah_multivalue", "niah_multivalue", download=_ESSAYS),
    RulerTask("qa_squad", "ruler_qa_squad", download="it downloads SQuAD v2 (rajpurkar.github.io)"),
    RulerTask("qa_hotpot", "ruler_qa_hotpot", download="it downloads HotpotQA (huggingface.co)"),
)}
OFFLINE = tuple(n for n, t in RULER.items() if t.download is None)
LM_EVAL_SAMPLES = 500
"""Samples lm-eval generates per (task, length) (its generators' fixed num_samples)."""


def ruler_task_names(s) -> list[str]:
    """'niah_single_1,vt' (or a list; lm-eval's names `ruler_vt` too): offline RULER tasks. A task
    that downloads its data is refused with the reason (argparse type of --tasks)."""
    items = s.replace(" ", "").split(",") if isinstance(s, str) else list(s)
    out = [x.removeprefix("ruler_") if x.removeprefix("ruler_") in RULER else x for x in items if x]
    unknown = [x for x in out if x not in RULER]
    if not out or unknown:
        raise argparse.ArgumentTypeError(f"expected RULER tasks from {', '.join(OFFLINE)}, got {s!r}")
    for x in out:
        if RULER[x].download:
            raise argparse.ArgumentTypeError(
                f"{x} needs a download ({RULER[x].download}); offline RULER tasks: {', '.join(OFFLINE)}")
    return list(dict.fromkeys(out))


def too_short(tok, tasks, lengths) -> list[str]:
    """'vt at 512 (needs >= 930 tokens with this tokenizer)' for every (task, length) whose
    smallest prompt does not fit; [] when all fit."""
    import random

    state = random.getstate()  # measuring draws random words: leave the seeded state as it was
    try:
        out = []
        for name in tasks:
            fn = RULER[name].min_length
            for length in lengths if fn else ():
                need = fn(tok, length)
                if length < need:
                    out.append(f"{name} at {length} (" + ("its in-context example does not fit lm-eval's "
                               "500 tokens with this tokenizer" if need >= 10**9 else
                               f"needs >= {need} tokens with this tokenizer") + ")")
        return out
    finally:
        random.setstate(state)


def check_samples(name: str, length: int, docs) -> None:
    """Every sample of (task, length) has answers, each in its prompt; else ValueError (lm-eval
    made a sample nothing can answer: an empty answer list also divides its metric by zero)."""
    empty = sum(1 for d in docs if not d["outputs"])
    absent = sum(1 for d in docs if d["outputs"] and not all(str(a) in d["input"] for a in d["outputs"]))
    if empty or absent:
        raise ValueError(f"{name} at {length}: lm-eval made {empty} samples without answers and "
                         f"{absent} whose answers are not in the prompt (of {len(docs)}); the length "
                         "is too short for this task with this tokenizer: ask a longer one")


@contextlib.contextmanager
def quiet_import(progress: bool = True):
    """Import and run lm-eval's RULER generators offline and quietly: nltk's punkt_tab download at
    import is skipped (only the essay haystack, refused here, splits sentences), lm-eval's
    per-task advice logs are silenced, vt's prints of its size search dropped and, without
    progress, its generators' tqdm bars (written to stderr; logging keeps its own stream)."""
    import nltk

    saved = nltk.download
    nltk.download = lambda *a, **k: False
    log = logging.getLogger("lm_eval")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), (
                contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())):
            yield
    finally:
        nltk.download = saved
        log.setLevel(level)


def require_lm_eval() -> None:
    """lm-eval and its RULER extras importable, else a one-line UserError."""
    from lenext_dist.errors import UserError

    try:
        import lm_eval  # noqa: F401
        import nltk  # noqa: F401
        import wonderwords  # noqa: F401
    except ImportError as e:
        raise UserError(f"lenext eval ruler needs lm-eval with its RULER extras ({e.name} is missing): "
                        "pip install 'lm_eval[ruler]' (make setup installs it)") from None


__all__ = ["RULER", "OFFLINE", "RulerTask", "ruler_task_names", "too_short", "check_samples",
           "quiet_import", "require_lm_eval", "LM_EVAL_SAMPLES"]
