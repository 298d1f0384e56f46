"""tokenizer.json for stock exports: a `tokenizers` model that encodes exactly as the run's
SentencePiece model, so `AutoTokenizer.from_pretrained` (no remote code) tokenizes as training did;
checked on probe texts at export, else only tokenizer.model ships (and the provenance says so)."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

PROBE_TEXTS = (
    "Hello world", "a  b   c\t\td\n\n\ne", "  leading and trailing   ", " ", "",
    "12345 678.9 x=3", "naïve café 日本語 🙂 Ωmega", "def f(x):\n    return x  # two\n\n\tTab",
    "\n\nstart with newlines", "mixed \u00a0nbsp and\u2003emspace", "end with spaces    ",
)
"""Texts every shipped tokenizer.json is checked on against SentencePiece (whitespace runs at
the start, inside and at the end, tabs, newlines, digits, byte fallback)."""


def _spm_support(proto) -> Optional[str]:
    """Why tokenizer.json cannot reproduce this SentencePiece model exactly, or None."""
    ns, ts = proto.normalizer_spec, proto.trainer_spec
    if ts.model_type != ts.BPE:
        return "the SentencePiece model is not BPE"
    if ns.name not in ("identity", "") or len(ns.precompiled_charsmap):
        return f"SentencePiece normalization {ns.name!r} (only 'identity' is reproduced)"
    if ns.remove_extra_whitespaces or not ns.add_dummy_prefix or not ns.escape_whitespaces:
        return "SentencePiece whitespace options other than lenext's (dummy prefix, no collapsing)"
    if ts.treat_whitespace_as_suffix or not ts.split_by_whitespace:
        return "SentencePiece whitespace-as-suffix / no split by whitespace"
    return None


def _score_ordered_merges(bt, proto):
    """The converted tokenizer with its BPE merges ranked as SentencePiece applies them: SP's BPE
    merges, at each step, the adjacent pair whose concatenation is the vocabulary piece with the
    HIGHEST score (bpe_model.cc); transformers' conversion ranks merges by piece id, which differs
    where scores do not follow ids (Llama-2-style vocabularies give whitespace pieces such as
    "▁▁" the score -1e9 at low ids: "a  b" then became ▁a ▁▁ b instead of ▁a ▁ ▁b)."""
    from tokenizers import Tokenizer

    normal = proto.SentencePiece.NORMAL
    piece_id = {p.piece: i for i, p in enumerate(proto.pieces)}
    ranked = []
    for i, p in enumerate(proto.pieces):
        if p.type != normal or len(p.piece) < 2:
            continue
        for k in range(1, len(p.piece)):
            a, b = p.piece[:k], p.piece[k:]
            if a in piece_id and b in piece_id:
                ranked.append((-p.score, i, k, a, b))
    ranked.sort()
    j = json.loads(bt.to_str())
    j["model"]["merges"] = [[a, b] for *_, a, b in ranked]
    return Tokenizer.from_str(json.dumps(j))


def stock_tokenizer_json(spm_path: Path, texts=PROBE_TEXTS):
    """A `tokenizers.Tokenizer` that encodes exactly as SentencePiece's `encode` (no BOS/EOS),
    or (None, reason).

    transformers' own conversion (LlamaTokenizer from tokenizer.model) keeps the BPE vocabulary,
    merges and byte fallback but disagrees on leading whitespace runs ("  x" loses a space:
    tokenizers' Metaspace adds the dummy prefix only when the text does not already start with
    one) and splits words at every space, where SentencePiece with allow_whitespace_only_pieces
    keeps a run of spaces together with the word that follows (model_interface.cc
    SplitIntoWords). So: normalizer = Prepend("▁") + Replace(" ", "▁") (SentencePiece's dummy
    prefix and escaping), pre-tokenizer = Split on "▁+[^▁]*" (a whitespace run and its word;
    "▁[^▁]*" when whitespace-only pieces are off). Checked on `texts`; a mismatch -> None.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import Regex, normalizers, pre_tokenizers
    from transformers import AutoTokenizer

    proto = pb.ModelProto()
    proto.ParseFromString(Path(spm_path).read_bytes())
    why = _spm_support(proto)
    if why:
        return None, why
    with tempfile.TemporaryDirectory() as tmp:  # transformers' conversion reads a folder
        shutil.copyfile(spm_path, Path(tmp) / "tokenizer.model")
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False, "add_eos_token": False}))
        bt = AutoTokenizer.from_pretrained(tmp).backend_tokenizer
    bt = _score_ordered_merges(bt, proto)
    ws = "\u2581"
    bt.normalizer = normalizers.Sequence([normalizers.Prepend(ws), normalizers.Replace(" ", ws)])
    word = f"{ws}+[^{ws}]*" if proto.trainer_spec.allow_whitespace_only_pieces else f"{ws}[^{ws}]*"
    bt.pre_tokenizer = pre_tokenizers.Split(Regex(f"{word}|[^{ws}]+"), behavior="isolated")
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    for t in texts:
        if bt.encode(t, add_special_tokens=False).ids != sp.encode(t):
            return None, f"tokenizer.json disagrees with SentencePiece on {t[:40]!r}"
    return bt, None


def write_stock_tokenizer(out: Path, spm_path: Path, bos: bool = False) -> tuple[dict, str]:
    """tokenizer.model (for `lenext eval`, which tokenizes with SentencePiece) + tokenizer.json /
    tokenizer_config.json / special_tokens_map.json for `AutoTokenizer.from_pretrained(out)`
    without remote code, when tokenizer.json reproduces SentencePiece; returns (ids, note).
    `bos`: the run trained with BOS at each document start (data.bos), so the tokenizer adds it."""
    from tokenizers import processors

    from lenext_dist.prep.tokenizer import load_sentencepiece

    sp = load_sentencepiece(str(spm_path), "tokenizer")
    shutil.copyfile(spm_path, out / "tokenizer.model")
    ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id(), "unk": sp.unk_id()}
    info = {"size": sp.get_piece_size(), **{k: (v if v >= 0 else None) for k, v in ids.items()}}
    bt, why = stock_tokenizer_json(spm_path)
    if bt is None:
        return info, f"tokenizer.model only (no stock tokenizer matches: {why})"
    if bos:  # as training read the shards: [bos] + sp.encode(text) + [eos]
        piece = sp.id_to_piece(sp.bos_id())
        bt.post_processor = processors.TemplateProcessing(
            single=f"{piece} $A", special_tokens=[(piece, sp.bos_id())])
    bt.save(str(out / "tokenizer.json"))
    special = {f"{k}_token": sp.id_to_piece(v) for k, v in ids.items() if v >= 0}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast",  # loads tokenizer.json as written
           "add_bos_token": bool(bos), "add_eos_token": False,  # as data_prep (+ data.bos)
           "model_max_length": 1_000_000_000, "clean_up_tokenization_spaces": False, **special}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return info, f"tokenizer.json equals SentencePiece on {len(PROBE_TEXTS)} probe texts"


__all__ = ["PROBE_TEXTS", "stock_tokenizer_json", "write_stock_tokenizer"]
