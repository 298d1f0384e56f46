"""Train a Llama-style SentencePiece model on a sample of a corpus.

For users without a tokenizer: reads the inputs with the same readers (and the same
bad-input policy) as the shard step, takes a deterministic sample of documents (by a
stable hash of the text, so the sample does not depend on file order quirks), splits
them into lines and trains SentencePiece on those lines.

Llama-style means: BPE, byte_fallback (no unknown characters ever), digits split,
whitespace kept as is (identity normalization, no collapsing of runs), unk=0, bos=1,
eos=2, no pad piece. Training with one thread makes the model byte-identical across
runs and machines.
"""

from __future__ import annotations

import os
import sys
from typing import Iterator, Optional, Sequence

from .errors import EXCLUDED_SET, Bad, PrepError
from .readers import discover_inputs, open_reader
from .tokenizer import sha256_file, stable_fraction


def sample_lines(
    paths: Sequence[str],
    fmt: str,
    *,
    text_key: Optional[str] = None,
    exclude_sets: Sequence[str] = (),
    doc_fraction: float = 1.0,
    max_bytes: int = 100 << 20,
    skip_bad: bool = False,
    stats: Optional[dict] = None,
) -> Iterator[str]:
    """Non-empty lines of the sampled documents, up to about `max_bytes` of text."""
    stats = stats if stats is not None else {}
    stats.setdefault("docs", 0)
    stats.setdefault("bytes", 0)
    stats.setdefault("skipped", {})
    exclude = set(exclude_sets)
    for path in paths:
        for rec in open_reader(path, fmt, text_key):
            if isinstance(rec, Bad):
                if not skip_bad:
                    raise rec.error()
                stats["skipped"][rec.reason] = stats["skipped"].get(rec.reason, 0) + rec.docs
                continue
            if rec.set_name is not None and rec.set_name in exclude:
                stats["skipped"][EXCLUDED_SET] = stats["skipped"].get(EXCLUDED_SET, 0) + 1
                continue
            if doc_fraction < 1.0 and stable_fraction(rec.text, b"spm-sample") >= doc_fraction:
                continue
            stats["docs"] += 1
            for line in rec.text.split("\n"):
                if line.strip():
                    stats["bytes"] += len(line)
                    yield line
            if stats["bytes"] >= max_bytes:
                return


def train_sentencepiece(
    lines: Iterator[str],
    model_prefix: str,
    vocab_size: int = 32000,
    model_type: str = "bpe",
    threads: int = 1,
    character_coverage: float = 0.99995,
    quiet: bool = True,
) -> str:
    """Train and write `<model_prefix>.model` / `.vocab`; return the .model path."""
    import sentencepiece as spm

    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines,
            model_prefix=model_prefix,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=True,
            split_digits=True,
            allow_whitespace_only_pieces=True,
            remove_extra_whitespaces=False,
            normalization_rule_name="identity",
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            # lines are fed as they are: no random sentence sampling inside SentencePiece
            input_sentence_size=0,
            shuffle_input_sentence=False,
            max_sentence_length=1 << 14,
            num_threads=threads,
            minloglevel=2 if quiet else 0,
        )
    except RuntimeError as e:  # SentencePiece's own checks of the options and of the sample
        raise PrepError(f"{model_prefix}: SentencePiece cannot train this tokenizer "
                        f"({str(e).strip().splitlines()[-1]}); check --vocab-size (> 0, below the "
                        "sample's distinct pieces) and --threads, or give more text") from None
    # SentencePiece records the absolute output path in the model; keep only the base
    # name so the same corpus gives the same bytes wherever it was built.
    from sentencepiece import sentencepiece_model_pb2

    path = model_prefix + ".model"
    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    proto.trainer_spec.model_prefix = os.path.basename(model_prefix)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString(deterministic=True))
    return path


def run_train_tokenizer(
    inputs: Sequence[str],
    fmt: str,
    model_prefix: str,
    *,
    vocab_size: int = 32000,
    model_type: str = "bpe",
    text_key: Optional[str] = None,
    languages: Sequence[str] = (),
    exclude_sets: Sequence[str] = (),
    doc_fraction: float = 1.0,
    max_bytes: int = 100 << 20,
    skip_bad: bool = False,
    threads: int = 1,
) -> dict:
    """The train-tokenizer command: sample, train, report. An existing model is never replaced
    (shards made with it would no longer match it)."""
    for existing in (model_prefix + ".model", model_prefix + ".vocab"):
        if os.path.lexists(existing):
            raise PrepError(f"{existing}: already exists; choose another --model-prefix or "
                            "remove it")
    paths = discover_inputs(inputs, fmt, languages)
    stats: dict = {}
    lines = sample_lines(paths, fmt, text_key=text_key, exclude_sets=exclude_sets,
                         doc_fraction=doc_fraction, max_bytes=max_bytes, skip_bad=skip_bad,
                         stats=stats)
    model = train_sentencepiece(lines, model_prefix, vocab_size, model_type, threads)
    summary = {"model": model, "sha256": sha256_file(model), "inputs": len(paths), **stats}
    print(f"[train-tokenizer] {model}: vocab {vocab_size}, trained on {stats['docs']} documents "
          f"({stats['bytes'] / 1e6:.1f} MB), sha256 {summary['sha256'][:16]}", file=sys.stderr)
    return summary
