"""Hugging Face folder -> training checkpoint (`lenext convert --from-hf DIR --out RUN`).

The inverse of the exports, read from the same tables: the config by hf_readers.py (config.json ->
the run config's sections, every refusal of the config), the weights by hf_weights.py (lazily,
safetensors only, refused by name, head scales folded), through `keymap.KEYMAP` (hf_to_megatron)
and `stock.LLAMA4_MLP` / `stock.llama4_rope_rows` (Llama 4's names and Meta's RoPE pair layout,
undone). Nothing is written before every refusal has had its say; then the run folder is staged
and renamed into place (outdir.staged).

Output (a run folder `lenext extend --base` and `checkpoint.init_from` read):
    config.yaml                          the run config (checkpoint.init_from = the step below)
    checkpoints/latest, checkpoints/step_0000000/   mp_rank_00_model_states.pt (ZeRO-0 layout),
                                         config.yaml, COMPLETE
    tokenizer.model / tokenizer.json / tokenizer_config.json / special_tokens_map.json (copied)
    import.json                          source folder, architecture, what was mapped
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import torch
import yaml

from lenext_dist.checkpoint.layout import COMPLETE, CONFIG, LATEST, tag_for

from .hf_readers import ImportRefused, Reading, read_config, refuse
from .hf_weights import LazyWeights, fold_head_scales, lacking_qk_norm, misfit, unknown_names
from .keymap import Shape, hf_to_megatron
from .outdir import check_out, inside, staged

TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json")


def _tokenizer_adds_bos(folder: Path) -> bool:
    """`add_bos_token` of folder/tokenizer_config.json (False without one); a damaged file is
    refused by name (import_hf reads the source's before anything is written)."""
    tc = folder / "tokenizer_config.json"
    if not tc.is_file():
        return False
    try:
        return bool(json.loads(tc.read_bytes()).get("add_bos_token", False))
    except (ValueError, AttributeError) as e:  # not JSON, or not an object
        raise refuse(tc, f"not a JSON object ({type(e).__name__}: {str(e)[:120]})") from None


def _tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files to copy. One linking outside the folder is refused (copyfile follows
    links: tokenizer.json -> ~/.cache/huggingface/token would copy a secret into the run), but
    the hub cache's snapshots/<rev>/file -> ../../blobs/<hash>."""
    root = folder.resolve()
    roots = [root] + ([root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [])
    found = [folder / t for t in TOKENIZER_FILES if (folder / t).is_file()]
    outside = next((t for t in found if not any(inside(t.resolve(), r) for r in roots)), None)
    if outside:
        raise refuse(outside, f"links to {outside.resolve()}, outside {folder}: put the file itself there")
    return found


def run_config(c: dict, reading: Reading, out: Path, name: str, overrides: list[str], source: Path):
    """The RunConfig written with the import (strict loader, so a bad override is one line)."""
    from lenext_dist.config import ConfigError, load_config

    tok = (out / "tokenizer.model").resolve() if (out / "tokenizer.model").is_file() else ""
    bos = c.get("bos_at_document_start")
    if bos is None:
        bos = _tokenizer_adds_bos(out)
    # L stays the pretrained length when a model.seq_length override trains longer (YaRN's
    # original length, the temperature schedules, lenext extend's base L)
    tree = {"name": name, "model": {"name": name, **reading.model,
                                    "train_length": reading.model["seq_length"]},
            "attention": reading.attention,
            "data": {"tokenizer": str(tok), "bos": bool(bos)},  # "": no SentencePiece model
            "checkpoint": {"init_from": str((out / "checkpoints").resolve())}}
    f = out / CONFIG
    f.write_text(yaml.safe_dump(tree, sort_keys=False))
    try:
        return load_config(f, list(overrides))
    except ConfigError as e:  # it names the staged copy, deleted on the way out: name the source
        raise ConfigError(str(e).replace(str(f), str(source / "config.json"))) from None


def import_hf(folder, out, *, overrides: list[str] = (), name: Optional[str] = None) -> dict:
    """Import the HF model folder `folder` into the run folder `out` (see the module docstring);
    returns a summary. ImportRefused (one line) before any weight is read, for what we cannot
    express; OutputError for an --out that exists."""
    from lenext_dist.config import save_config, to_dict

    folder, final = Path(folder), Path(out)
    c, reading, arch = read_config(folder, overrides)
    tokenizer = _tokenizer_files(folder)  # before any is read
    _tokenizer_adds_bos(folder)
    if (folder / "tokenizer.model").is_file():  # the run's data.tokenizer: checked before copying
        from lenext_dist.errors import UserError
        from lenext_dist.prep.tokenizer import load_sentencepiece

        try:
            load_sentencepiece(str(folder / "tokenizer.model"))
        except UserError as e:
            raise refuse(folder, f"{e}") from None
    replaces = check_out(final, None, [folder])  # no --overwrite: nothing replaced
    weights = LazyWeights(folder, reading)
    with staged(final, replaces) as tmp:
        for t in tokenizer:
            shutil.copyfile(t, tmp / t.name)
        cfg = run_config(c, reading, tmp, name or folder.resolve().name, overrides, folder)
        m = cfg.model
        shape = Shape.from_run_config(cfg)
        why = (unknown_names(weights, shape, cfg.attention.qk_norm.kind == "rms")
               or lacking_qk_norm(weights, cfg))
        if why:
            raise refuse(folder, why)
        if arch == "LenextForCausalLM":  # learned/uniform scales: fold, keep scale_c = 1
            fold_head_scales(weights, cfg)
        try:
            state = hf_to_megatron(weights, shape)
        except KeyError as e:
            raise refuse(folder, e.args[0]) from None
        why = misfit(state, cfg.model)
        if why:
            raise refuse(folder, why)
        step = tmp / "checkpoints" / tag_for(0)
        step.mkdir(parents=True)
        torch.save({"module": state}, step / "mp_rank_00_model_states.pt")
        del state
        final_cfg = _relocated(cfg, tmp, final)
        save_config(final_cfg, step / CONFIG)  # resolved, as train writes a step's
        tree = to_dict(final_cfg)  # to train from: run_dir / checkpoint.dir follow `name`
        tree["run_dir"] = tree["checkpoint"]["dir"] = None
        (tmp / CONFIG).write_text(yaml.safe_dump(tree, sort_keys=False))
        (step / COMPLETE).write_text("1\n")
        (tmp / "checkpoints" / LATEST).write_text(tag_for(0) + "\n")
        summary = {"source": str(folder.resolve()), "architecture": arch, "out": str(final),
                   "layers": cfg.layer_positions, "windows": cfg.layer_windows,
                   "chunks": cfg.layer_chunks, "temperature": cfg.attention.temperature.kind,
                   "rope": cfg.attention.rope.scaling, "train_length": m.train_length,
                   "tokenizer": [t for t in TOKENIZER_FILES if (tmp / t).is_file()]}
        (tmp / "import.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary



def _relocated(cfg, tmp: Path, final: Path):
    """The config with the staging folder's paths replaced by the final ones."""
    import dataclasses

    fix = lambda p: p.replace(str(tmp.resolve()), str(final.resolve())) if p else p  # noqa: E731
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, tokenizer=fix(cfg.data.tokenizer)),
        checkpoint=dataclasses.replace(cfg.checkpoint, init_from=fix(cfg.checkpoint.init_from)))



__all__ = ["import_hf", "read_config", "ImportRefused", "LazyWeights"]
