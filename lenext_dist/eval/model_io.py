"""Loading an HF model directory for evaluation, the model's record in every result JSON, and the
JSON writer (numpy values as plain numbers; written to a temp file, then renamed)."""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from typing import Optional

import numpy as np

from lenext_dist.atomic import atomic_write
from lenext_dist.dtypes import torch_dtype


def default_device(device: Optional[str] = None) -> str:
    """`device`, else cuda where torch sees one, else cpu."""
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: Optional[str] = None) -> str:
    """The evaluation dtype when none is given: bfloat16 on CUDA (what the model trained in;
    fp32 there ran without TF32 at several times the cost), float32 elsewhere (CPU bf16 matmuls
    are slow and the CPU results stay comparable with earlier ones)."""
    return "bfloat16" if default_device(device).startswith("cuda") else "float32"


def load_model(path: str, dtype: Optional[str] = None, device: Optional[str] = None,
               progress: bool = True):
    """The model of HF folder `path` in eval mode (dtype None: `default_dtype`). No code from the
    folder runs: a custom export (model_type lenext) loads with this package's own classes
    (lenext_dist/hf, of which its modeling files are copies that anyone who had the folder could
    have changed), anything else as plain transformers (a model type it does not know, with code of
    its own in auto_map, is refused). progress False: without transformers' "Loading weights" bar
    (--no-progress)."""
    import json

    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from lenext_dist.errors import UserError

    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise FileNotFoundError(f"{path}: no config.json (not an HF model directory)")
    try:
        with open(config) as f:
            data = json.load(f)
    except ValueError as e:
        raise UserError(f"{config}: not valid JSON ({e}); export the model again") from None
    if isinstance(data, dict) and data.get("model_type") == "lenext":
        from lenext_dist.hf.modeling_lenext import LenextForCausalLM  # not the folder's copy

        load = LenextForCausalLM.from_pretrained
    else:  # transformers' own class, whatever auto_map names
        load = functools.partial(AutoModelForCausalLM.from_pretrained, trust_remote_code=False)
    dev = checked_device(default_device(device))
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        model = load(path, dtype=torch_dtype(dtype or default_dtype(dev)))
    except (OSError, ValueError) as e:  # no weights file, an unknown architecture: transformers' words
        _check_readable(path)  # safetensors calls an unreadable file "No such file or directory"
        raise UserError(f"{path}: cannot load the model ({_first_line(e)}); export it again with "
                        "`lenext convert`") from None
    except SafetensorError as e:
        raise UserError(f"{path}: a weights file is damaged or cut short ({_first_line(e)}); copy "
                        "or export the model again") from None
    finally:
        if bars and not progress:  # transformers' switch is global: leave it as it was
            hf_logging.enable_progress_bar()
    return model.to(dev).eval()


def _check_readable(path: str) -> None:
    """A UserError naming the first file of model folder `path` that from_pretrained reads
    (weights, JSON, modeling code) and the user cannot open; nothing if all open."""
    from lenext_dist.errors import UserError

    for name in sorted(os.listdir(path)):
        f = os.path.join(path, name)
        if os.path.isfile(f) and name.endswith((".safetensors", ".bin", ".json", ".py")):
            try:
                open(f, "rb").close()
            except OSError as e:
                raise UserError(f"{f}: cannot read ({e.strerror or e}); make it readable "
                                "(chmod) or copy the model") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def checked_device(device: str) -> str:
    """`device` if torch knows it and it is here; else a UserError naming --device."""
    import torch

    from lenext_dist.errors import UserError

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise UserError(f"--device {device!r}: not a device ({_first_line(e)}); pass cpu, cuda or "
                        "cuda:N") from None
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s) "
                        "here; pass another --device (or cpu)")
    return device


def _git_commit() -> Optional[str]:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def model_info(model, path: str, job) -> dict:
    import torch
    import transformers

    from .adapter import head_scales, layout

    info = {"path": os.path.abspath(path), "class": type(model).__name__,
            "config": model.config.to_dict(), "dtype": job.dtype,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "scale_c": job.scale_c, "train_length": None}
    try:
        info["attention_layout"] = layout(model)
        m = head_scales(model)
        info["head_scale"] = {"min": float(m.min()), "max": float(m.max()),
                              "mean": float(m.mean())}
        pos = getattr(model.model.layers[0].self_attn, "position", None)
        if pos is not None:
            info["position"] = repr(pos)
            every = [repr(getattr(layer.self_attn, "position", None)) for layer in model.model.layers]
            if len(set(every)) > 1:  # attention.layout: the variant of each layer
                info["layer_positions"] = every
    except (TypeError, AttributeError) as e:
        info["attention_layout"] = f"unknown ({e})"
    info["software"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                        "python": platform.python_version(), "lenext_git": _git_commit()}
    return info


def write_json(obj: dict, path: str) -> str:
    import json

    def default(o):
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(type(o).__name__)

    atomic_write(path, json.dumps(obj, indent=1, default=default))
    return path
