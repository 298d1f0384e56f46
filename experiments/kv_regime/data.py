"""The kv regime's texts: the kv corpus (tokenizer, training and held-out filler), the
skip-bigram text beside the kv documents (Run.lm), the training filler of varying statistics
(Run.fill) and the held-out Zipf filler that sweep.py scores on."""
from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data" / "kv"
"""The regime's tokenizer, training filler and held-out filler (`lenext prep kv`; ignored by git)."""


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


def zipf_filler(path: Path, words: int = 50_000, seed: int = 11) -> Path:
    """Held-out filler of other statistics: the same syllables, drawn with p ~ 1/rank."""
    import numpy as np

    from lenext_dist.prep.kv_corpus import alphabet, write_filler

    if not path.exists():
        p = 1.0 / np.arange(1, len(alphabet()["filler"]) + 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_filler(path, words, np.random.default_rng(seed), p / p.sum())
    return path


