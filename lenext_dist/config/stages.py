"""Length stages of one run (`train.stages`): the settings of each stage and the rules that make a
staged run resumable and its data order deterministic.

A run of T = train.steps optimizer steps is cut at the stages' start steps s_1 < s_2 < ... < T;
stage 0 ([0, s_1)) is the run's own config, stage k ([s_k, s_{k+1})) that config with the
settings of stages 1..k applied in turn (an unset value keeps the previous stage's):
model.seq_length, attention.rope.base / scaling / factor, train.micro_batch_size,
train.global_batch_size and data.blend. model.train_length (L, the pretrained context the
length-relative variants refer to) stays stage 0's: a stage lengthens the context, it does not
redefine L.

Tokens per step: a stage without global_batch_size keeps stage 0's tokens per step, G_k = G_0 x
S_0 / S_k sequences (an error when that is not a whole multiple of the micro batch); a stage that
sets it changes the tokens per step, and the header, the log and the dry run say so.

LR schedule: a pure function of the optimizer step over train.steps (train/optim.py), so it
runs on across boundaries untouched.

Data order (the rule, exact across and inside stages, at any world size): stage k reads a megatron
GPTDataset of its own, at its sequence length S_k and blend, sized for its own steps ((e_k - s_k) x
G_k samples, e_k the next stage's start or T), and optimizer step t reads its samples
[(t - s_k) x G_k, (t - s_k + 1) x G_k): a stage reads its blend from the start, as a run of its
steps alone would, so no sample is read twice while the blend holds the stage's samples. (A dataset
sized for the whole run, T x G_k, and read from s_k x G_k, the earlier rule, draws the stage's samples
from megatron's shuffle of several epochs as soon as the blend holds fewer than T x G_k samples: a
long-document blend of a late stage repeated some samples and never showed others;
tests/unit/test_stages_data.py.) The offset derives from the step alone, so a resume anywhere
needs only the step; a run without stages is the one stage [0, T), read as always. The
checkpoint's consumed_samples counts the samples actually read, summed over the stages.

Boundaries: the loop saves a checkpoint at every s_k and builds the next stage's model, data and
engine from it in the same process (weights, optimizer state and RNG carried by the ordinary
resume), so a kill anywhere resumes into the stage of the checkpoint's step.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Literal, Optional

from .blend import BlendItem
from .checks import ConfigError, _check


@dataclass
class StageConfig:
    """One length stage of train.stages: from `start_step` on, the run trains with these settings
    (unset ones keep the previous stage's; stage 0 is the run's own model/attention/data/train
    settings). Rules and data order: lenext_dist/config/stages.py; recipes: docs/recipe.md."""

    start_step: Optional[int] = None
    """First optimizer step (0-based) of the stage (or start_tokens); > the previous stage's, < train.steps."""
    start_tokens: Optional[int] = None
    """Or the tokens trained before the stage starts (counted with each earlier stage's tokens
    per step): the stage starts at the first step that many tokens have been trained by; resolved
    into start_step when the config is read (a saved config holds both; they must agree)."""
    seq_length: Optional[int] = None
    """Tokens per sample from here on (model.seq_length of the stage); null keeps the previous."""
    rope_base: Optional[float] = None
    """attention.rope.base (RoPE theta) of the stage, e.g. 1.5e6 at 32K (SmolLM3); null keeps it."""
    rope_scaling: Optional[Literal["none", "pi", "ntk", "yarn"]] = None
    """attention.rope.scaling of the stage; null keeps it."""
    rope_factor: Optional[float] = None
    """attention.rope.factor of the stage; null keeps it."""
    micro_batch_size: Optional[int] = None
    """train.micro_batch_size of the stage; null keeps the previous stage's."""
    global_batch_size: Optional[int] = None
    """train.global_batch_size of the stage; null keeps the tokens per step of stage 0
    (global batch x seq_length), which must then divide into whole sequences."""
    blend: list[BlendItem] = field(default_factory=list)
    """data.blend of the stage (e.g. a long-document mix); empty keeps the previous stage's."""

    def __post_init__(self):
        _check(self.start_step is not None or self.start_tokens is not None, "train.stages[]",
               "needs start_step or start_tokens")
        _check(self.start_step is None or self.start_step > 0, "train.stages[].start_step",
               "must be > 0 (stage 0 is the run's own settings)")
        _check(self.start_tokens is None or self.start_tokens > 0, "train.stages[].start_tokens", "must be > 0")
        for k in ("seq_length", "micro_batch_size", "global_batch_size"):
            v = getattr(self, k)
            _check(v is None or v > 0, f"train.stages[].{k}", "must be > 0")
        _check(self.rope_base is None or self.rope_base > 1.0, "train.stages[].rope_base", "must be > 1")
        _check(self.rope_factor is None or self.rope_factor >= 1.0, "train.stages[].rope_factor",
               "must be >= 1")


def bounds(cfg) -> list[tuple[int, int]]:
    """[(first step, end step)] of every stage, stage 0 included."""
    starts = [0] + [st.start_step for st in cfg.train.stages]
    return list(zip(starts, starts[1:] + [cfg.train.steps]))


def index_at(cfg, step: int) -> int:
    """The stage that optimizer step `step` (0-based) belongs to; train.steps -> the last."""
    return max(k for k, (a, _) in enumerate(bounds(cfg)) if a <= step or k == 0)


def stage_config(cfg, k: int):
    """The RunConfig of stage k: the run's with stages 1..k applied and no stages of its own
    (stage 0: `cfg` itself), every section's checks run again on the result (a ConfigError
    names train.stages[i] where the stage is at fault)."""
    if k == 0:
        return cfg
    model, rope, train, data = cfg.model, cfg.attention.rope, cfg.train, cfg.data
    tokens = cfg.train.global_batch_size * cfg.model.seq_length
    for i, st in enumerate(cfg.train.stages[:k]):
        where = f"train.stages[{i}]"
        seq = st.seq_length or model.seq_length
        gbs = st.global_batch_size
        if gbs is None:
            _check(tokens % seq == 0, f"{where}.global_batch_size",
                   f"stage 0's {tokens:,} tokens per step are not whole sequences of {seq}; set it")
            gbs = tokens // seq
        micro = st.micro_batch_size or train.micro_batch_size
        _check(gbs % micro == 0, f"{where}.global_batch_size",
               f"{gbs} sequences per step (tokens per step kept: {tokens:,} / {seq}) is not a multiple "
               f"of micro_batch_size {micro}; set global_batch_size or micro_batch_size")
        try:
            model = replace(model, seq_length=seq)
            rope = replace(rope, base=st.rope_base or rope.base, scaling=st.rope_scaling or rope.scaling,
                           factor=st.rope_factor or rope.factor)
            train = replace(train, micro_batch_size=micro, global_batch_size=gbs, grad_accum=None)
            data = replace(data, blend=copy.deepcopy(st.blend) or data.blend)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    attention = replace(cfg.attention, rope=rope)
    train = replace(train, stages=[])  # a one-stage run; the loop keeps the whole config for saving
    try:
        return replace(cfg, model=model, attention=attention, train=train, data=data)
    except ConfigError as e:
        raise ConfigError(f"train.stages[{k - 1}]: {e}") from None


def _tokens_per_step(cfg, k: int) -> int:
    s = stage_config(cfg, k)
    return s.train.global_batch_size * s.model.seq_length


def tokens_offset(cfg, k: int) -> int:
    """Tokens trained before stage k's start minus start x stage k's tokens per step: the run's
    tokens at step t of stage k are this + t x its tokens per step (reads the starts of stages
    1..k only)."""
    starts = [0] + [st.start_step for st in cfg.train.stages[:k]]
    total = sum((starts[j + 1] - starts[j]) * _tokens_per_step(cfg, j) for j in range(k))
    return total - starts[k] * _tokens_per_step(cfg, k)


def check_stages(cfg) -> None:
    """Resolve start_tokens into start steps, check the starts (increasing, < train.steps) and
    that every stage's config can be built (called by RunConfig's checks)."""
    prev = 0
    for i, st in enumerate(cfg.train.stages):
        where = f"train.stages[{i}]"
        if st.start_tokens is not None:
            # the stage before runs from `prev` at t tokens per step: the first step n by which
            # tokens_offset + n t >= start_tokens
            t = _tokens_per_step(cfg, i)
            step = -(-(st.start_tokens - tokens_offset(cfg, i)) // t)
            _check(st.start_step in (None, step), f"{where}.start_step",
                   f"{st.start_step} contradicts start_tokens {st.start_tokens:,} (step {step}); set one")
            st.start_step = step
        _check(st.start_step > prev, f"{where}.start_step",
               f"{st.start_step} must be > the previous stage's start {prev}")
        _check(st.start_step < cfg.train.steps, f"{where}.start_step",
               f"{st.start_step} must be < train.steps {cfg.train.steps}")
        prev = st.start_step
        if st.rope_base is not None:
            _check_rotary(cfg, f"{where}.rope_base")
    for k in range(1, len(cfg.train.stages) + 1):
        stage_config(cfg, k)


def _check_rotary(cfg, key: str) -> None:
    """A stage's RoPE theta needs a layer that reads attention.rope.base, RoPE's or XPOS's (a RoPE
    subclass); without one it would be ignored (as a stage's rope_scaling is refused there, by
    the attention checks stage_config runs)."""
    from lenext_dist.attention import layout
    from lenext_dist.attention.registry import POSITIONS
    from lenext_dist.attention.rope import RoPE

    names = layout.layer_names(cfg.attention, cfg.model.num_layers)
    _check(any(issubclass(POSITIONS[x], RoPE) for x in names), key,
           f"sets RoPE's theta, but no layer ({layout.describe(names)}) rotates with RoPE: remove it")


def describe(cfg, k: int) -> str:
    """One line for the header, the log and the dry run: steps, length, theta, tokens per step."""
    s = stage_config(cfg, k)
    a, b = bounds(cfg)[k]
    tok, tok0 = s.train.global_batch_size * s.model.seq_length, cfg.train.global_batch_size * cfg.model.seq_length
    r = s.attention.rope
    return (f"stage {k}: steps [{a}, {b}), seq_length {s.model.seq_length:,}, rope base {r.base:g}"
            + (f" ({r.scaling} x{r.factor:g})" if r.scaling != "none" else "")
            + f", micro {s.train.micro_batch_size} x global {s.train.global_batch_size} = {tok:,} tokens/step"
            + ("" if tok == tok0 else f" (NOT kept: stage 0 has {tok0:,})"))
