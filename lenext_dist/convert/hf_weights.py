"""Hugging Face weights -> the megatron state dict, lazily (the second half of `lenext convert
--from-hf`, hf_import.py): safetensors only (a pickle can run code when loaded), read tensor by
tensor from their shards (model.safetensors.index.json) while the megatron state is built, so one
copy is held. What the key map cannot take is refused by the weight NAMES (never a tensor read):
qk-norm weights a config does not announce, biases, experts, a vision tower; our custom export's
head scales are folded into q_proj or q_norm (`fold_head_scales`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from lenext_dist.attention.names import HEAD_SCALE_KEY

from . import stock
from .export import qk_norm_keys
from .hf_readers import Reading, refuse
from .keymap import HF_HEAD_SCALE, HF_Q_PROJ, HF_QK_NORM, Shape, expected_shapes


class LazyWeights:
    """HF key -> tensor, read from its safetensors shard on lookup (the reader's names/layout
    applied); iteration gives the Llama-named keys without reading any tensor."""

    def __init__(self, folder: Path, reading: Reading):
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                files = dict(json.loads(index.read_bytes())["weight_map"])
            except (ValueError, KeyError, TypeError) as e:  # damaged, or not an index
                raise refuse(index, f"not a safetensors index ({type(e).__name__}: {e})") from None
            _check_shards(folder, index.name, files)
        elif (folder / "model.safetensors").is_file():
            with _opened(folder / "model.safetensors") as f:
                files = {k: "model.safetensors" for k in f.keys()}
        else:
            pickles = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
            raise refuse(folder, (f"{pickles[0]} is a pickle (loading it can run code): save the "
                                   "model as safetensors first" if pickles else
                                   "no model.safetensors or model.safetensors.index.json"))
        self.folder, self.reading = folder, reading
        # rotary_emb.inv_freq: a buffer older transformers saved, recomputed from the config
        self.names = {reading.key(k): (k, f) for k, f in files.items() if not k.endswith("rotary_emb.inv_freq")}

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def __contains__(self, k):
        return k in self.names

    def __getitem__(self, k):
        theirs, f = self.names[k]
        with _opened(self.folder / f) as h:  # one tensor, then the file is closed
            return self.reading.tensor(k, h.get_tensor(theirs))


def _check_shards(folder: Path, index: str, files: dict) -> None:
    """Every shard the index names is there and holds the tensors it puts there (headers only),
    before anything is written: a partial download is named as one; a name that is not a file of
    the folder ("../x", "/abs") is refused, never read."""
    bad = next((s for s in files.values() if not isinstance(s, str) or s in ("", "..")
                or Path(s).name != s), None)
    if bad is not None:
        raise refuse(folder / index, f"weight_map names {bad!r}, not a file of this folder")
    for shard in sorted(set(files.values())):
        if not (folder / shard).is_file():
            raise refuse(folder / shard, f"missing ({index} lists it): download it again")
        with _opened(folder / shard) as h:
            held = set(h.keys())
        lacking = sorted(k for k, s in files.items() if s == shard and k not in held)
        if lacking:
            more = f" and {len(lacking) - 1} more" if len(lacking) > 1 else ""
            raise refuse(folder / shard, f"lacks {lacking[0]}{more} ({index} puts them there): download it again")


def _opened(path: Path):
    """safe_open(path): a file that is not safetensors (damaged, cut short) -> ImportRefused."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), "pt")
    except SafetensorError as e:
        raise refuse(path, f"not a readable safetensors file ({e}); copy it again") from None


_HINTS = (("q_norm", "qk-norm weights its config does not announce"),
          ("k_norm", "qk-norm weights its config does not announce"), (".bias", "biases"),
          ("experts", "mixture-of-experts layers"),
          ("router", "mixture-of-experts layers"), ("vision", "a vision tower"))


def unknown_names(weights: LazyWeights, shape: Shape, learned_qk_norm: bool) -> Optional[str]:
    """What the weight names say the key map cannot take (by name), or None (a tied model's copy
    of its embeddings as lm_head is dropped)."""
    for part, what in _HINTS:
        if learned_qk_norm and part in ("q_norm", "k_norm"):
            continue
        hit = next((k for k in weights if part in k), None)
        if hit:
            return f"{hit}: {what}"
    if "lm_head.weight" in weights and shape.tie_embeddings:
        # a tied model saved with its lm_head as well: the same tensor twice, or a contradiction
        if not torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"]):
            return "lm_head.weight differs from the embeddings, with tie_word_embeddings=true"
        del weights.names["lm_head.weight"]
    return None



def lacking_qk_norm(weights: LazyWeights, cfg) -> Optional[str]:
    """The learned QK-norm weights the config gives its layers that the folder lacks (by name,
    before a scale is folded into them): training would start from norms of 1."""
    lacking = qk_norm_keys(cfg, weights, HF_QK_NORM)
    if not lacking:
        return None
    more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
    return (f"no weight for {lacking[0]}{more}: its config normalizes q and k with learned "
            "weights (attention.qk_norm 'rms')")


def misfit(state: dict, m) -> Optional[str]:
    """What in the converted weights does not fit the config read from config.json (a weight
    missing, or of another shape), or None: found here rather than when training starts."""
    for k, (want, keys) in expected_shapes(m).items():
        if k not in state:
            if HEAD_SCALE_KEY not in k:  # head scales are optional
                return (f"no weight for {k} (untied embeddings need lm_head.weight)" if k == "output_layer.weight"
                        else f"no weight for {k}")
        elif tuple(state[k].shape) != want:
            return f"{k} has shape {tuple(state[k].shape)}, but config.json gives {want} ({', '.join(keys)})"
    return None



def fold_head_scales(weights: LazyWeights, cfg) -> None:
    """Our custom export's per-head scales [h] per layer (none in the weights: config.json's
    scale_c, read into attention.scale_c, as the HF model's buffers start): a uniform c stays
    attention.scale_c (unless the config has a head scale, SSMax's m_h, which starts at 1 instead); anything else
    is folded as the stock export folds it (stock_weights): into q_norm.weight on a layer with a
    learned QK-norm whose heads share one scale (the norm would undo a scaled q_proj), else into
    q_proj's rows, with scale_c 1; what no weight can carry is refused."""
    from .stock_weights import fold_into_qk_norm

    m = cfg.model
    keys = [HF_HEAD_SCALE.format(i=i) for i in range(m.num_layers)]
    lacking = [k for k in keys if k not in weights]
    if lacking and len(lacking) < len(keys):  # the HF model would run those layers at scale_c
        raise refuse(weights.folder, f"no {lacking[0]} ({len(keys) - len(lacking)} of {len(keys)} "
                                      "layers have head scales): export it again")
    scales = (torch.full((m.num_layers, m.num_attention_heads), float(cfg.attention.scale_c))
              if lacking else torch.stack([weights[k].float() for k in keys]))  # [layers, heads]
    for k in keys:
        weights.names.pop(k, None)
    if not cfg.attention.head_scale.enabled and bool((scales == scales.flatten()[0]).all()):
        cfg.attention.scale_c = float(scales.flatten()[0])
        return
    cfg.attention.scale_c = 1.0
    norms = {k: weights[k] for i in range(m.num_layers) if (k := HF_QK_NORM.format(i=i, qk="q")) in weights}
    try:
        norms, scales = fold_into_qk_norm(cfg, norms, scales)  # [d] each; scales: 1 on the normed layers
    except ValueError as e:
        raise refuse(weights.folder, str(e)) from None
    rows = {HF_Q_PROJ.format(i=i): r for i, r in enumerate(scales)}
    inner = weights.reading.tensor

    def tensor(k, w):
        if k in norms:  # already read (and mapped) above, then scaled
            return norms[k]
        w = inner(k, w)
        return stock.fold_head_scales({HF_Q_PROJ.format(i=0): w}, rows[k].view(1, -1), m.num_attention_heads,
                                      m.head_dim)[HF_Q_PROJ.format(i=0)] if k in rows else w

    weights.reading.tensor = tensor

