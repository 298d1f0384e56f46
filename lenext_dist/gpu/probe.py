"""Is an NVIDIA device here, and can this torch use it? Plus the machine facts every result carries.

A check that prints SKIPPED and exits 0 on a GPU host (a `+cpu` torch wheel, a driver older than
the wheel's CUDA) would pass without measuring anything. So the device is looked for with the
driver's own traces, independently of torch: /proc/driver/nvidia/version (the kernel module),
/dev/nvidia0 (the device node) and, on the real root, `nvidia-smi`. SKIPPED is reserved for hosts
with none of them.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time
import warnings
from pathlib import Path
from typing import Optional

import torch

DRIVER_FILE = "proc/driver/nvidia/version"
DEVICE_NODE = "dev/nvidia0"


def driver_version(root: str = "/") -> Optional[str]:
    """The kernel module's version from <root>/proc/driver/nvidia/version ("NVRM version: NVIDIA
    UNIX x86_64 Kernel Module  550.54.15  ..."), or None when the file is absent."""
    path = Path(root, DRIVER_FILE)
    if not path.is_file():
        return None
    text = path.read_text(errors="replace")
    m = re.search(r"Kernel Module\s+(\d+(?:\.\d+)+)", text) or re.search(r"\b(\d{3}\.\d+(?:\.\d+)?)\b", text)
    return m.group(1) if m else text.splitlines()[0].strip() if text.strip() else "unknown"


def nvidia_evidence(root: str = "/") -> Optional[str]:
    """What shows an NVIDIA device on this host (None: nothing does). `root` stands for / (tests
    point it at a folder holding a fake proc/driver/nvidia/version); nvidia-smi is asked only on
    the real root."""
    version = driver_version(root)
    if version is not None:
        return f"driver {version} (/{DRIVER_FILE})"
    if Path(root, DEVICE_NODE).exists():
        return f"driver unknown (/{DEVICE_NODE} exists)"
    if os.path.realpath(root) == "/" and shutil.which("nvidia-smi"):
        try:
            p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if p.returncode == 0 and p.stdout.strip():
            name, _, ver = p.stdout.splitlines()[0].rpartition(",")
            return f"driver {ver.strip()} (nvidia-smi: {name.strip()})"
    return None


def cuda_usable() -> tuple[bool, str]:
    """(torch.cuda.is_available(), torch's own warning when it is not: e.g. "The NVIDIA driver on
    your system is too old")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = torch.cuda.is_available()
    why = "; ".join(str(w.message).splitlines()[0] for w in caught)[:300]
    return ok, why


def wheel_cuda() -> str:
    return torch.version.cuda or "none (a CPU-only wheel)"


def unusable_line(root: str = "/") -> Optional[str]:
    """The one-line failure when an NVIDIA device is here but torch cannot use it; None when torch
    can, or when no NVIDIA device is here (then the caller skips)."""
    ok, why = cuda_usable()
    if ok:
        return None
    evidence = nvidia_evidence(root)
    if evidence is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = " CUDA_VISIBLE_DEVICES is empty;" if visible is not None and not visible.strip() else ""
    return (f"gpu-check: FAILED: an NVIDIA device is here, {evidence}, but torch {torch.__version__} "
            f"(wheel CUDA {wheel_cuda()}) cannot use it:{hidden} {why or 'torch.cuda.is_available() is False'}"
            " -> install the torch wheel built for this driver's CUDA (or a newer driver), then rerun")


def machine() -> dict:
    """Host, device and versions, written into every result file (its date included)."""
    import importlib.metadata as md

    def version(name: str) -> Optional[str]:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "host": platform.node(),
           "python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "driver": driver_version("/")}
    for name in ("deepspeed", "megatron-core", "transformers", "lenext_dist"):
        out[name] = version(name)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(device=p.name, gpus=torch.cuda.device_count(), memory_gib=round(p.total_memory / 2**30, 1),
                   capability=f"{p.major}.{p.minor}")
    else:
        out.update(device=platform.processor() or platform.machine(), gpus=0)
    return out
