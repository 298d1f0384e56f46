"""The kv regime's runs (issue 43, item 1): many small trainings at once on one GPU, then the
gate of analysis.py on the held-out formats, scored at home on the CPU.

  train   (on the GPU node) kv documents of each run's training mixture (Run.mix, L tokens; the
          skip-bigram text too where a run has Run.lm),
          every run of --grid in parallel (one process each, one GPU shared), cut at --seconds
          (SIGTERM: a checkpoint, exit 0; rerunning resumes), then each run's last checkpoint
          exported; models and metrics packed into <= 15 MB tars under --out (what a device call
          may bring back: 8 files of 16 MiB)
  collect (here) the device calls' $OUT folders, in order: the last call's models and logs
          unpacked under --into (models/, logs/), every call's summary.json in train-summary.json
  score   (anywhere) each exported model on every format of analysis.FORMATS at L and 2L, the
          no-retrieval baseline beside; the gate per position; results.json + REGIME.md

  python -m experiments.kv_regime.sweep train --shards /tmp/sh --work /tmp/w --out $OUT --grid seeds
  python -m experiments.kv_regime.sweep score --models DIR --out experiments/kv_regime/results/NAME

The grids (GRIDS; each one's docstring says why it exists and, for the explorations, the rule
written before its run): pilot (regime candidates, one seed each), seeds (the regime it pointed to:
4 layers, d128, 256 sequences a step, lr 3e-3; 3 seeds of NoPE and RoPE), distract (a distractor
key in every training document), others (ALiBi, KERPLE, windowed NoPE on it), and the levers tried
for NoPE on it: distract_bos, distract_warm, distract_long, distract_lm, distract_lm_all (and
others_lm_all: the others grid in distract_lm_all's regime), distract_vary (and others_vary).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import NamedTuple, Optional

from .analysis import FORMATS, TRAIN_MIX, gate, passes
from lenext_dist.flags import Parser

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "kv"
"""The regime's tokenizer, training filler and held-out filler (`lenext prep kv`; ignored by git)."""
L = 96
"""Document length: the mixture's longest needles (3 distractors of 8 values) need ~60 tokens."""
STEPS = 6000


class Run(NamedTuple):
    position: str
    layers: int
    hidden: int
    heads: int
    batch: int
    """Sequences a step (= micro-batch: one rank)."""
    lr: float
    seed: int
    mix: tuple[str, ...] = TRAIN_MIX
    """The training documents' kv parameters."""
    window: int = 0
    """Sliding-window attention of this many tokens (0: none)."""
    bos: bool = False
    """BOS before every document (data.bos): documents of L - 1 tokens, so a sample is still one
    document; evaluation then starts every document with BOS (the export records it)."""
    warm: Optional["Warm"] = None
    """A first length stage of shorter documents (train.stages); None: one stage of `mix` at L."""
    steps: int = STEPS
    """Optimizer steps; the LR schedule (configs/train/kv.yaml's, warmup 200) spans them."""
    lm: float = 0.0
    """Weight of the skip-bigram text (`skip_text`) in the training blend, the kv documents the
    rest (0: none). A text shard: every one of its tokens trains; the validation set stays kv."""
    lm_text: str = "filler"
    """The alphabets that text draws its words from: a key of SKIP_TEXTS."""
    fill: str = "uniform"
    """The kv documents' training filler: uniform (kv_data's train/ files) or vary (`vary_filler`:
    records of varying statistics)."""


class Warm(NamedTuple):
    """The first `steps` optimizer steps train on documents of `length` tokens of `mix` (the same
    sequences a step), the rest on the run's own mix at L: a length curriculum (one run,
    train.stages; model.train_length stays L). The validation set is the run's mix at L
    throughout, so a validation loss before `steps` (samples of `length` tokens cut from its
    documents) measures nothing."""
    steps: int
    length: int
    mix: tuple[str, ...]


PILOT = {
    "nope-4l128-b64-lr3": Run("nope", 4, 128, 4, 64, 3e-3, 0),
    "nope-4l128-b256-lr3": Run("nope", 4, 128, 4, 256, 3e-3, 0),
    "nope-4l128-b256-lr1": Run("nope", 4, 128, 4, 256, 1e-3, 0),
    "rope-4l128-b256-lr3": Run("rope", 4, 128, 4, 256, 3e-3, 0),
    "rope-4l128-b64-lr3": Run("rope", 4, 128, 4, 64, 3e-3, 0),
    "nope-4l256-b256-lr1": Run("nope", 4, 256, 8, 256, 1e-3, 0),
    "nope-6l128-b256-lr3": Run("nope", 6, 128, 4, 256, 3e-3, 0),
    "nope-2l128-b256-lr3": Run("nope", 2, 128, 4, 256, 3e-3, 0),
}
SEEDS = {f"{p}-s{s}": Run(p, 4, 128, 4, 256, 3e-3, s) for p in ("nope", "rope") for s in (0, 1, 2)}
DISTRACT_MIX = ("values=2:8", "distractors=1:3")
"""The `distract` grid's documents (written after the seeds grid, before its runs): 1-3 distractor
keys in every document. In the seeds grid two NoPE seeds of three learned to copy a needle without
matching its key, which scores 1/(k+1) with k distractors and 0.52 on the seeds mixture; here that
copy is worth at most 0.5, and documents without a distractor (the first and last formats of
analysis.FORMATS contain them, 9-10 values has only them) are held out."""
DISTRACT = {n: r._replace(mix=DISTRACT_MIX) for n, r in SEEDS.items()}
OTHERS = {**{f"{p}-s0": Run(p, 4, 128, 4, 256, 3e-3, 0, DISTRACT_MIX) for p in ("alibi", "kerple_log")},
          "window-s0": Run("nope", 4, 128, 4, 256, 3e-3, 0, DISTRACT_MIX, window=L)}
"""The study's other positions on the distract mixture, one seed each (issue 43 item 2): ALiBi,
KERPLE and NoPE under a window of L (nope_length's). They first ran in the distract grid, 8 runs
at once: at ~8 steps/s each (H100, 27 Nov) 6000 steps need ~780 s of training, more than one
session's 900 s of device time holds beside two starts; a later call on a cold machine starts over
(no checkpoint comes back). Hence two grids that each fit one session, the runs unchanged."""
DISTRACT_BOS = {n: r._replace(bos=True) for n, r in DISTRACT.items()}
"""The distract grid with BOS before every document (data.bos; written after the distract grid's
first call, before any run of its own). Why: NoPE has no position but what the causal mask gives
(Kazemnejad et al. 2023, Theorem 1: a first-layer head reads absolute position as the weight it
puts on a fixed first token, ~1/(t+1)). Without BOS the first token of a kv document is random
filler, so that code is noise; real models (TinyLlama, Llama) train with BOS. Its NoPE seed 0 on
the CPU (results/distract-bos-probe) still copied without matching the key at step 5384."""
WARM = Warm(2000, 48, ("values=2:4", "distractors=1:2"))
DISTRACT_WARM = {n: r._replace(warm=WARM) for n, r in DISTRACT.items()}
"""The distract grid after a first stage of short documents (written 28 Nov, before any run of its
own): 2000 steps on documents of 48 tokens with 2-4 values and 1-2 distractors (the key-blind copy
still worth <= 0.5), then 4000 on the distract mix at L = 96; same steps, sequences a step and LR
schedule. Why: picking the needle by its key needs the token two back (K in `key K is v1`); NoPE
reads offsets only through the causal mask, whose position signal (~1/t) is sharper at small t,
and a short document has less filler to dilute the match. Judged like the BOS probe: NoPE seed 0
on the CPU; it works if that run's last checkpoint scores >= 0.9 at L with 1, 2 and 3 distractors
(the gate's cells), and it is then a candidate for the device grid, not its verdict. It did not
(results/distract-warm-probe: 0.51 / 0.25 / 0.16, the key-blind copy)."""
DISTRACT_LONG = {n: r._replace(steps=2 * STEPS) for n, r in DISTRACT.items()}
"""The distract grid over twice the steps, 12000, the LR schedule stretched to them (written 28 Nov,
before any run of its own). Why: the one NoPE that matched keys (the seeds grid's seed 0) left the
key-blind copy late, at a decaying LR: its validation loss sat at 0.173 at step 4000, the copy's
floor on that mixture (E ln(k+1) over its 0-3 distractors / 5 values a document: 0.16), and fell to
0.007 by 5000. The runs that did not were at their floor when their schedule ended (the BOS probe
0.245 at 5000 against the distract mix's 0.21). A longer schedule gives the escape more steps at
each LR. Judged like the BOS and warm probes: NoPE seed 0 on the CPU (two sessions: ~4.7 h); it
works if that run's last checkpoint scores >= 0.9 at L with 1, 2 and 3 distractors (the gate's
cells), and it is then a candidate for the device (its NoPE seeds first: 6 runs of 12000 steps
do not fit one session at the ~11 steps/s each that 6 runs made; 3 at once: not measured), not its
verdict. It did not (results/distract-long-probe: 0.31 / 0.17 / 0.19)."""
DISTRACT_LM = {n: r._replace(lm=0.05) for n, r in DISTRACT.items()}
"""The distract grid with skip-bigram text (`skip_text`) at weight 0.05 in its training blend
(written 28 Nov, before any run of its own; same steps, sequences a step, LR schedule, kv
documents and validation set). Why: the split probes (features.py) show NoPE gathering tokens by
kind; no head of theirs reads the key one back at a later needle, which RoPE does at every one.
In the kv documents nothing but the answer rewards such a read (the filler is uniform, the loss on
answers only); a language model's text rewards it at every token. Here every text token's loss
needs it (3.47 nats without, 0.65 with). At 0.05 a step holds ~13 text samples of 96 loss tokens
and ~243 kv documents of 5 answer tokens (their mean): each about half the loss. Judged like the
BOS, warm and long probes: NoPE seed 0 on the CPU; it works if that run's last checkpoint scores
>= 0.9 at L with 1, 2 and 3 distractors, and it is then a candidate for the device grid, not its
verdict.
(Exploration beside the rule: whether the split probe's key@is at later needles rises.)
Not judged: its run (NoPE seed 0, 2 CPU cores) was lost with the machine's work folder at step
~4750. At step 4000, an exploration (64 documents): 0.31 / 0.08 / 0.06 with 1 / 2 / 3
distractors, the first value token right in 0.50 / 0.39 / 0.20 (the key-blind copy's 1/(k+1)),
its held-out text loss 0.71 nats (the read one back learned), validation loss 0.85 (the distract
grid's CPU probes: 0.43 at 4000)."""
DISTRACT_LM_ALL = {n: r._replace(lm_text="all") for n, r in DISTRACT_LM.items()}
"""The distract_lm grid with its text over all 99 words of the kv documents (filler, values, keys
and markers: SKIP_TEXTS["all"]) instead of the filler's 32 (written 28 Nov, before any run of its
own; the same weight 0.05, steps, sequences a step, LR schedule, kv documents and validation set).
Why: distract_lm's NoPE seed 0 learned its text's read one back (held-out text loss 0.71 nats at
step 4000; 0.65 with the read, 3.47 without) while its kv answers stayed the key-blind copy (0.31 /
0.08 / 0.06 with 1 / 2 / 3 distractors at step 4000, 64 documents, an exploration; its run was
lost with the machine's work folder at step ~4750). That text reads a filler syllable from a
filler syllable; the key match needs the key read at `is` and at the first value (key@is, key@v1:
a marker and a value reading a key), pairs of kinds its text never held, and the distract-long
probe's features show NoPE's reads are bound to kinds (the value one back at later needles 0.82,
the key one back at chance). Over every alphabet the read must serve every pair of kinds. Judged
like the earlier probes: NoPE seed 0 on the CPU; it works if that run's last checkpoint (6000)
scores >= 0.9 at L with 1, 2 and 3 distractors (`sweep.py score`, 128 documents each), and it is
then a candidate for the device grid, not its verdict.
(Exploration beside the rule: features.py's key@is and key@v1 at later needles.)
It works (results/distract-lm-all-probe): 1.00 / 1.00 / 1.00 at step 6000, every held-out format
at L 0.94-1.00; key@is and key@v1 at later needles 1.00 after layer 3. The device grid's
candidate, then OTHERS_LM_ALL."""
OTHERS_LM_ALL = {n: r._replace(lm=0.05, lm_text="all") for n, r in OTHERS.items()}
"""The others grid in distract_lm_all's regime (written 28 Nov, before any run of its own): the
study compares positions trained alike, so ALiBi, KERPLE and the windowed NoPE train on the same
text beside the same kv documents. For the device session after distract_lm_all's (6 runs and 3
do not fit one session together: see OTHERS)."""
DISTRACT_VARY = {n: r._replace(fill="vary") for n, r in DISTRACT_LM_ALL.items()}
"""The distract_lm_all grid over training filler whose statistics vary (`vary_filler`: half of its
records uniform, the others each from a unigram profile of its own, Dirichlet(1) over the 32
syllables, none as skewed as the held-out Zipf filler), written 29 Nov before any run of its own;
the same text, weights, steps, sequences a step, LR schedule and mixtures; the held-out filler and
analysis.FORMATS unchanged. Why: distract_lm_all fails its gate on one cell: its NoPE seed 2 scores
0.85 at L on skewed filler (baseline 0.01), every other format 1.00; the skewed filler is NoPE's
weakest format in every seed (0.94 / 0.98 / 0.85 at L, 0.39 / 0.62 / 0.18 at 2L), RoPE's seed 0
1.00. NoPE has no position but what the causal mask gives: a head averaging its past reads position
from how that average settles (~1/t), which depends on the filler's statistics, and uniform filler
alone lets the model calibrate to one. With profiles that vary within training, a key match that
leans on one calibration is no longer rewarded; skewed filler stays held out (more skewed than any
training profile: entropy 2.88 nats, every training profile's >= VARY_MIN_ENTROPY).
Judged like the earlier probes: NoPE seed 2 (the seed that failed) on the CPU; it works if that
run's last checkpoint (6000) passes every held-out format at L (analysis.passes: >= 0.9 and the
baseline + 0.1; `sweep.py score`, 128 documents each), and it is then the device grid's candidate
(all six seeds, then others_vary), not the gate's verdict."""
OTHERS_VARY = {n: r._replace(fill="vary") for n, r in OTHERS_LM_ALL.items()}
"""The others grid in distract_vary's regime (written with it)."""
GRIDS = {"pilot": PILOT, "seeds": SEEDS, "distract": DISTRACT, "others": OTHERS, "distract_bos": DISTRACT_BOS,
         "distract_warm": DISTRACT_WARM, "distract_long": DISTRACT_LONG, "distract_lm": DISTRACT_LM,
         "distract_lm_all": DISTRACT_LM_ALL, "others_lm_all": OTHERS_LM_ALL, "distract_vary": DISTRACT_VARY,
         "others_vary": OTHERS_VARY}


def kv_data() -> Path:
    """DATA, made by `lenext prep kv` (under a second, deterministic) where a checkout lacks it:
    CI's clean checkout, a device node the folder was not carried to."""
    if not (DATA / "kv.json").is_file():  # written last
        from lenext_dist.prep.kv_corpus import KVCorpus, build

        build(KVCorpus(str(DATA)))
    return DATA


SKIP = "skipgram"
"""The skip-bigram text's shard (`skip_text`, then shard.py --format jsonl); skip_name's."""
SKIP_P = 0.9
SKIP_TEXTS = {"filler": ("filler",), "all": ("filler", "values", "keys", "markers")}
"""The alphabets (kv_corpus.alphabet) a skip-bigram text draws its words from, by Run.lm_text:
the filler's 32 syllables, or all 99 words of the kv documents."""


def skip_name(text: str) -> str:
    """The shard of a skip-bigram text (the filler's keeps its first name)."""
    return SKIP if text == "filler" else f"{SKIP}_{text}"


def skip_text(folder: Path, kinds: tuple[str, ...] = ("filler",), files: int = 8, words: int = 250_000,
              seed: int = 5, p: float = SKIP_P) -> Path:
    """Text over the words of the alphabets `kinds` (V of them) in which each word is g(the word
    two before it) with probability p, else uniform (g: one fixed permutation; records of
    RECORD_WORDS words, each starting afresh). The word after token t is then a function of token
    t - 1 and nearly independent of token t: the loss on it falls from ln V (3.47 over the filler,
    4.60 over all 99 words) to its floor (0.65 / 0.78 nats at p = 0.9) only through a read of the
    token one back, which is what a kv needle's key match needs at `is`. Written once into
    `folder` (skip-NNN.jsonl); file i is the same whatever was written before it (a held-out
    file: an index past training's)."""
    import numpy as np

    from lenext_dist.prep.kv_corpus import alphabet

    vocab = np.array([w for k in kinds for w in alphabet()[k]])
    g = np.random.default_rng(seed).permutation(len(vocab))

    def record(rng, n: int):
        x = rng.integers(0, len(vocab), n)  # the draws where the chain resets
        keep = rng.random(n) < p
        for t in range(2, n):
            if keep[t]:
                x[t] = g[x[t - 2]]
        return x

    return _record_files(folder, "skip", files, words, seed, vocab, record)


def _record_files(folder: Path, stem: str, files: int, words: int, seed: int, vocab, record) -> Path:
    """folder/<stem>-NNN.jsonl: `files` files of `words` words of `vocab` in records of RECORD_WORDS,
    each record's word indices record(rng, its length). File i draws from its own generator
    ([seed, i]), so it is the same whatever was written before it; a file already there is kept
    (each is written whole)."""
    import numpy as np

    from lenext_dist.atomic import atomic_write
    from lenext_dist.prep.kv_corpus import RECORD_WORDS

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        path, rng = folder / f"{stem}-{i:03d}.jsonl", np.random.default_rng([seed, i])
        if not path.exists():
            lines = [json.dumps({"text": " ".join(vocab[record(rng, min(RECORD_WORDS, words - start))])})
                     for start in range(0, words, RECORD_WORDS)]
            atomic_write(path, "\n".join(lines) + "\n")
    return folder


VARY = "filler-vary"
"""The folder (under --shards) of the varying training filler."""
VARY_UNIFORM = 0.5
"""The share of vary_filler's records that are uniform (the other regimes' filler)."""
VARY_MIN_ENTROPY = 3.0
"""Nats: a profile of lower entropy is drawn again (uniform 3.47; the held-out Zipf filler 2.88)."""


def vary_filler(folder: Path, files: int = 8, words: int = 250_000, seed: int = 7) -> Path:
    """Training filler whose statistics vary: records of RECORD_WORDS syllables, each uniform with
    probability VARY_UNIFORM, else drawn from a profile of its own, Dirichlet(1) over the 32 filler
    syllables (drawn again until its entropy is >= VARY_MIN_ENTROPY). The same number of files and
    words as kv_data's train/ filler; file i is the same whatever was written before it."""
    import numpy as np

    from lenext_dist.prep.kv_corpus import alphabet

    vocab = np.array(alphabet()["filler"])

    def record(rng, n: int):
        p = None  # uniform
        if rng.random() >= VARY_UNIFORM:
            p = rng.dirichlet(np.ones(len(vocab)))
            while -(p * np.log(p)).sum() < VARY_MIN_ENTROPY:
                p = rng.dirichlet(np.ones(len(vocab)))
        return rng.choice(len(vocab), n, p=p)

    return _record_files(folder, "filler", files, words, seed, vocab, record)


def exported(models: Path) -> list[Path]:
    """The exported models under `models` (one folder each, <name>/config.json); none is an error."""
    found = sorted(p.parent for p in Path(models).glob("*/config.json"))
    if not found:
        raise SystemExit(f"error: {models} holds no exported model (<name>/config.json)")
    return found


def shard_name(mix: tuple[str, ...], bos: bool = False, length: int = L, fill: str = "uniform") -> str:
    """The shards of a mixture (the seeds grid's keep their first name); with BOS the documents
    are one token shorter (BOS is added when samples are built); `_l<n>` for documents of n != L;
    `_<fill>` over a filler other than the uniform one."""
    name = "kvmix" if mix == TRAIN_MIX else "kv_" + "_".join(
        p.replace("=", "").replace(":", "-") for p in mix)
    return (name + (f"_l{length}" if length != L else "") + ("_bos" if bos else "")
            + (f"_{fill}" if fill != "uniform" else ""))


def shard_sets(r: Run) -> list[tuple[tuple[str, ...], bool, int, str]]:
    """The shards a run reads: (mix, bos, document length, filler) of each stage."""
    return [(r.mix, r.bos, L, r.fill)] + ([(r.warm.mix, r.bos, r.warm.length, r.fill)] if r.warm else [])


def first_shards(r: Run) -> str:
    """The kv shard of a run's first stage (first_blend adds its text beside it)."""
    return shard_name(*shard_sets(r)[-1])


def blend(shard: str, r: Run) -> list[tuple[str, float]]:
    """A training blend of run r, (shard, weight) each: the kv shard, and the run's skip-bigram
    text at weight r.lm beside it."""
    kv = f"{shard}_train"
    return [(kv, round(1 - r.lm, 6)), (f"{skip_name(r.lm_text)}_train", r.lm)] if r.lm else [(kv, 1.0)]


def first_blend(r: Run) -> list[tuple[str, float]]:
    """The blend of a run's first stage: what its export records as its data."""
    return blend(first_shards(r), r)


def trained_on(pairs: list[tuple[str, float]]) -> str:
    """A training blend in words: its shards, each with its weight where there are several."""
    return " + ".join(n if len(pairs) == 1 else f"{n} ({w:g})" for n, w in pairs)


def blend_yaml(pairs: list[tuple[str, float]], shards: Path) -> str:
    return "[" + ", ".join(f"{{prefix: {shards}/{n}, weight: {w}}}" for n, w in pairs) + "]"


def config(name: str, spec: Run, shards: Path, work: Path, backend: str) -> str:
    pos, layers, hidden, heads, batch, lr, seed, mix, window, bos, warm, steps = spec[:12]
    shard, bos_line = shard_name(mix, bos, fill=spec.fill), "\n  bos: true" if bos else ""
    seq, stages = L, ""
    if warm:  # stage 0 on the short documents, then the run's own mix at L (one run: train.stages)
        seq = warm.length
        stages = (f"\n        stages: [{{start_step: {warm.steps}, seq_length: {L}, global_batch_size: {batch}, "
                  f"blend: {blend_yaml(blend(shard, spec), shards)}}}],")
    inc = ", ".join(str(REPO / "configs" / c) for c in ("model/kv-tiny.yaml", "data/kv.yaml", "train/kv.yaml"))
    return f"""include: [{inc}]
name: {name}
run_dir: {work / "runs" / name}
model: {{num_layers: {layers}, hidden_size: {hidden}, num_attention_heads: {heads},
         num_query_groups: {heads}, ffn_hidden_size: {int(2.75 * hidden)}, seq_length: {seq},
         train_length: {L}}}
attention: {{position: {pos}{f", window: {window}" if window else ""}}}
data:
  tokenizer: {DATA / "tokenizer.model"}
  blend: {blend_yaml(first_blend(spec), shards)}
  valid_blend: [{{prefix: {shards}/{shard}_valid, weight: 1.0}}]
  seed: {1234 + seed}{bos_line}
train: {{steps: {steps}, seed: {1234 + seed}, micro_batch_size: {batch}, global_batch_size: {batch},{stages}
        eval_interval: 1000, eval_iters: 2}}
optim: {{lr: {lr}, warmup_steps: 200}}
checkpoint: {{interval: 500, keep_last: 2}}
logging: {{interval: 250}}
parallel: {{backend: {backend}}}
"""


def shard_command(shards: Path, workers: int, mix: tuple[str, ...] = TRAIN_MIX,
                  bos: bool = False, length: int = L, fill: str = "uniform") -> list[str]:
    sets = [a for p in mix for a in ("--task-set", f"kv.{p}")]
    filler = kv_data() / "train" if fill == "uniform" else vary_filler(shards / VARY)
    return [sys.executable, str(REPO / "data_prep/shard.py"), "--format", "tasks", "--tasks", "kv",
            "--input", str(filler / "*.jsonl"), "--tokenizer", str(DATA / "tokenizer.model"),
            "--out", str(shards), "--name", shard_name(mix, bos, length, fill), "--task-passes", "32",
            "--valid-fraction", "0.01", "--workers", str(workers), *sets,
            "--task-set", f"kv.length={length - bos}", "--no-progress"]


def skip_command(shards: Path, workers: int, text: str = "filler") -> list[str]:
    """The skip-bigram text's shard: a text shard (every token trains), no validation part."""
    name = skip_name(text)
    return [sys.executable, str(REPO / "data_prep/shard.py"), "--format", "jsonl",
            "--input", str(skip_text(shards / f"{name}-text", SKIP_TEXTS[text]) / "*.jsonl"),
            "--tokenizer", str(kv_data() / "tokenizer.model"), "--out", str(shards),
            "--name", name, "--workers", str(workers), "--no-progress"]


def train(a) -> dict:
    grid = GRIDS[a.grid]
    only = [n for n in a.only.split(",") if n]
    if unknown := sorted(set(only) - set(grid)):
        raise SystemExit(f"error: --only {','.join(unknown)}: no such run in grid {a.grid} "
                         f"(its runs: {','.join(grid)})")
    names = [n for n in grid if not only or n in only]
    work, out, shards = Path(a.work), Path(a.out), Path(a.shards)
    (work / "cfg").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    for shard_set in sorted({s for n in names for s in shard_sets(grid[n])}):
        if not (shards / f"{shard_name(*shard_set)}.manifest.json").exists():
            subprocess.run(shard_command(shards, a.workers, *shard_set), check=True)
    for text in sorted({grid[n].lm_text for n in names if grid[n].lm}):
        if not (shards / f"{skip_name(text)}.manifest.json").exists():
            subprocess.run(skip_command(shards, a.workers, text), check=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "PYTHONUNBUFFERED": "1"}
    procs, logs, t0, cpus = {}, [], time.time(), os.cpu_count() or 1
    for i, n in enumerate(names):
        cfg = work / "cfg" / f"{n}.yaml"
        cfg.write_text(config(n, grid[n], shards, work, a.backend))
        pin = ["taskset", "-c", f"{(2 * i) % cpus},{(2 * i + 1) % cpus}"] if cpus >= 2 * len(names) else []
        logs.append(open(work / f"{n}.log", "a"))
        procs[n] = subprocess.Popen([*pin, sys.executable, "-m", "lenext_dist.train", "--config", str(cfg)],
                                    stdout=logs[-1], stderr=subprocess.STDOUT, env=env)
    deadline = min(t0 + a.seconds, a.until or float("inf"))
    while any(p.poll() is None for p in procs.values()) and time.time() < deadline:
        time.sleep(2)
    for p in procs.values():
        if p.poll() is None:
            p.terminate()  # the run saves a checkpoint at its next step and exits 0
    for p in procs.values():
        p.wait()
    logs += [open(work / f"{n}.convert.log", "w") for n in names]
    conv = {n: subprocess.Popen([sys.executable, "-m", "lenext_dist", "convert", "--overwrite",
                                 "--checkpoint", str(work / "runs" / n / "checkpoints"),
                                 "--out", str(work / "hf" / n)],
                                stdout=f, stderr=subprocess.STDOUT, env=env)
            for n, f in zip(names, logs[len(names):])}
    for p in conv.values():
        p.wait()
    for f in logs:
        f.close()
    summary = {"wall_s": round(time.time() - t0, 1), "runs": {}}
    for n in names:
        latest = work / "runs" / n / "checkpoints" / "latest"
        summary["runs"][n] = {"spec": grid[n], "rc": procs[n].returncode, "convert_rc": conv[n].returncode,
                              "latest": latest.read_text().strip() if latest.exists() else None}
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    _pack(work, out, names)
    return summary


def _pack(work: Path, out: Path, names: list[str]) -> None:
    with tarfile.open(out / "logs.tar.gz", "w:gz") as t:
        t.add(work / "summary.json", "summary.json")
        for n in names:
            for f in (work / f"{n}.log", work / f"{n}.convert.log", work / "runs" / n / "metrics.jsonl"):
                if f.exists():
                    t.add(f, f"{n}/{f.name}")
    packs, size = [[]], 0
    for n in names:
        if (work / "hf" / n / "config.json").exists():
            s = sum(f.stat().st_size for f in (work / "hf" / n).rglob("*") if f.is_file())
            if packs[-1] and size + s > 15e6:
                packs.append([])
                size = 0
            packs[-1].append(n)
            size += s
    for i, pk in enumerate(p for p in packs if p):
        with tarfile.open(out / f"hf{i}.tar.gz", "w:gz") as t:
            for n in pk:
                t.add(work / "hf" / n, n)


def collect(a) -> dict:
    """What the device calls brought back -> <into>/models, <into>/logs, <into>/train-summary.json.
    A later call resumed the runs of the one before and packed everything again: its models and
    logs are the runs' last; each call's summary.json (wall time, each run's last checkpoint)."""
    calls = [Path(c) for c in a.calls]
    for c in calls:
        if not (c / "logs.tar.gz").is_file():
            raise SystemExit(f"error: {c} has no logs.tar.gz: not the $OUT of a `sweep.py train` call")
    into = Path(a.into)
    if (into / "models").exists() or (into / "logs").exists():
        raise SystemExit(f"error: {into} already holds models/ or logs/: collect into a new folder")
    last = calls[-1]
    packs = sorted(last.glob("hf*.tar.gz"))
    if not packs:
        raise SystemExit(f"error: {last} (the last call) has no hf*.tar.gz: its exports failed "
                         "(see its logs.tar.gz: <run>/<run>.convert.log)")
    try:
        summaries = []
        for c in calls:
            with tarfile.open(c / "logs.tar.gz") as t:
                summaries.append(json.load(t.extractfile("summary.json")))
        with tarfile.open(last / "logs.tar.gz") as t:
            t.extractall(into / "logs", filter="data")
        for pack in packs:
            with tarfile.open(pack) as t:
                t.extractall(into / "models", filter="data")
    except (tarfile.TarError, KeyError, ValueError, OSError) as e:
        raise SystemExit(f"error: a damaged pack under {', '.join(map(str, calls))}: {e}") from None
    record = {"device": a.device, "calls": summaries}
    (into / "train-summary.json").write_text(json.dumps(record, indent=1))
    return record


# ----------------------------------------------------------------------------- scoring
def zipf_filler(path: Path, words: int = 50_000, seed: int = 11) -> Path:
    """Held-out filler of other statistics: the same syllables, drawn with p ~ 1/rank."""
    import numpy as np

    from lenext_dist.prep.kv_corpus import alphabet, write_filler

    if not path.exists():
        p = 1.0 / np.arange(1, len(alphabet()["filler"]) + 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_filler(path, words, np.random.default_rng(seed), p / p.sum())
    return path


def score(a) -> dict:
    from experiments.nope_length.study import TEST_SEED
    from lenext_dist.eval.jobs import TasksJob

    out = Path(a.out)
    filler = {"uniform": kv_data() / "heldout/filler.jsonl", "zipf": zipf_filler(out / "filler-zipf.jsonl")}
    models = exported(Path(a.models))
    scores, cells = {}, {}
    for m in models:
        for fname, params, fill in FORMATS:
            job = TasksJob(model=str(m), data=[str(filler[fill])], lengths=[L, 2 * L], tasks=["kv"],
                           docs=a.docs, seed=TEST_SEED, task_set=[f"kv.{p}" for p in params],
                           out=str(out / "eval" / m.name / fname.replace(" ", "_").replace(",", "")),
                           no_progress=True)
            if not job.done():
                job.run()
            res = json.loads(job.result_path.read_text())["cells"]
            cells.setdefault(m.name, {})[fname] = [
                {"length": c["length"], "accuracy": c["accuracy"], "baseline": c["baseline"]["accuracy"]}
                for c in res]
            scores.setdefault(m.name, {})[fname] = (res[0]["accuracy"], res[0]["baseline"]["accuracy"])
    record = {"L": L, "docs": a.docs, "test_seed": TEST_SEED, "formats": [list(f) for f in FORMATS],
              "cells": cells, "gate": gate(scores), "valid_loss": _valid_losses(a.logs, cells),
              "note": a.note}
    (out / "results.json").write_text(json.dumps(record, indent=1))
    (out / "REGIME.md").write_text(render(record))
    return record


def _valid_losses(logs, names) -> dict:
    """model -> [[step, validation loss], ...] from <logs>/<model>/metrics.jsonl (none without logs)."""
    out = {}
    for n in names if logs else ():
        f = Path(logs) / n / "metrics.jsonl"
        if f.exists():
            rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
            out[n] = [[r["step"], round(r["valid_loss"], 4)] for r in rows if "valid_loss" in r]
    return out


def render(r: dict) -> str:
    fm = [f[0] for f in r["formats"]]
    lines = ["# The kv regime: retrieval in held-out formats", "",
             f"Generated by experiments/kv_regime/sweep.py from results.json. Whole-answer accuracy at "
             f"L = {r['L']} / 2L of {r['docs']} test documents per format (held-out filler, test seed "
             f"{r['test_seed']}); in brackets the no-retrieval baseline at L; * = passes the gate at L "
             "(analysis.py).", ""]
    if r.get("note"):
        lines += [r["note"], ""]
    lines += ["| model | " + " | ".join(fm) + " |", "|---|" + "---|" * len(fm)]
    for m, row in sorted(r["cells"].items()):
        def cell(f):
            c = row[f]
            star = "*" if passes(c[0]["accuracy"], c[0]["baseline"]) else ""
            return f"{c[0]['accuracy']:.2f}{star} / {c[1]['accuracy']:.2f} ({c[0]['baseline']:.2f})"
        lines.append(f"| {m} | " + " | ".join(cell(f) for f in fm) + " |")
    lines += ["", "## Gate (every seed, every format; analysis.py)", ""]
    for pos, g in r["gate"].items():
        lines.append(f"- {pos}: **{g['verdict']}** (seeds {', '.join(g['seeds'])}; "
                     f"{len(g['failures'])} failing cell{'' if len(g['failures']) == 1 else 's'})")
    if r.get("valid_loss"):
        lines += ["", "## Validation loss on the training mixture (answer tokens), by step", "",
                  "| model | " + " | ".join(str(s) for s, _ in max(r["valid_loss"].values(), key=len)) + " |"]
        width = len(max(r["valid_loss"].values(), key=len))
        lines.append("|---|" + "---|" * width)
        for m, v in sorted(r["valid_loss"].items()):
            lines.append(f"| {m} | " + " | ".join(f"{x:.3f}" for _, x in v) + " |" + " |" * (width - len(v)))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = Parser(prog="python -m experiments.kv_regime.sweep", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--shards", required=True)
    t.add_argument("--work", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--grid", choices=sorted(GRIDS), default="seeds")
    t.add_argument("--only", default="", help="the grid's runs to train, comma-separated (default: all)")
    t.add_argument("--seconds", type=float, default=300, help="training time after the data are made")
    t.add_argument("--until", type=float, default=0,
                   help="also stop training by this Unix time (gpu.sh: its call's end less the export's)")
    t.add_argument("--backend", default="nccl")
    t.add_argument("--workers", type=int, default=8, help="data prep processes")
    t.add_argument("--threads", type=int, default=1, help="CPU threads per run (a CPU-only run: the cores)")
    c = sub.add_parser("collect")
    c.add_argument("calls", nargs="+", help="each device call's $OUT folder (files_at), in order")
    c.add_argument("--into", required=True, help="a new folder: models/, logs/, train-summary.json")
    c.add_argument("--device", required=True, help="the device, as its reply named it")
    s = sub.add_parser("score")
    s.add_argument("--models", required=True, help="folder of exported models (one folder each)")
    s.add_argument("--out", required=True)
    s.add_argument("--logs", help="folder of <model>/metrics.jsonl (the train step's logs.tar.gz)")
    s.add_argument("--docs", type=int, default=128)
    s.add_argument("--note", default="")
    a = ap.parse_args(argv)
    res = {"train": train, "collect": collect, "score": score}[a.cmd](a)
    print(json.dumps(res.get("gate", res.get("runs", res.get("calls"))), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
