"""Dense peak TFLOP/s per device for MFU, by the name torch reports for the device.

MFU divides achieved model FLOP/s by the device's peak in the training dtype. A fixed number in a
config is wrong as soon as the job lands on another GPU (TinyLlama's 312 is the A100's: an H100
would read ~3x too high), so the peak comes from this table when the device is in it, and is
measured otherwise (`metrics.measure_matmul_tflops`; `logging.peak_tflops` overrides both).

Numbers: vendor datasheets, dense (without 2:4 sparsity), tensor-core bf16/fp16; fp32 is the
plain fp32 rate, since torch leaves TF32 off for matmuls by default
(torch.backends.cuda.matmul.allow_tf32 = False). Rows are tried in order, first match wins, so
specific names (H100 PCIe, H100 NVL, L40S) come before generic ones (H100, L40).
"""
from __future__ import annotations

import re
from typing import Optional

import torch

# (pattern searched in the device name, case-insensitive; {dtype: dense TFLOP/s})
PEAK_TABLE: list[tuple[str, dict[str, float]]] = [
    (r"GB200", {"bf16": 2500.0, "fp16": 2500.0, "fp32": 80.0}),
    (r"B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 75.0}),     # HGX B200
    (r"H100.*PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    (r"H100.*NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    (r"H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),      # SXM5 ("H100 80GB HBM3")
    (r"H800", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),      # H100 SXM's compute
    (r"H20\b", {"bf16": 148.0, "fp16": 148.0, "fp32": 44.0}),
    (r"H200.*NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    (r"H200|GH200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),      # SXM4 and PCIe, 40/80 GB
    (r"A800", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    (r"L40\b", {"bf16": 181.0, "fp16": 181.0, "fp32": 90.5}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    (r"A10G?\b", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    (r"A40\b", {"bf16": 149.7, "fp16": 149.7, "fp32": 37.4}),
    (r"V100.*SXM", {"fp16": 125.0, "fp32": 15.7}),                # no bf16 tensor cores
    (r"V100", {"fp16": 112.0, "fp32": 14.0}),
    (r"MI300X", {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4}),
    (r"MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7}),
]

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def table_peak(device_name: str, dtype: torch.dtype) -> Optional[float]:
    """Dense peak TFLOP/s of `device_name` in `dtype` from PEAK_TABLE, None when not listed."""
    key = DTYPE_NAMES.get(dtype)
    for pattern, peaks in PEAK_TABLE:
        if re.search(pattern, device_name, re.IGNORECASE):
            return peaks.get(key)
    return None


def device_name(device: str) -> str:
    """torch's name of the accelerator `device` ('cpu' on CPU)."""
    if device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(torch.device(device))


def peak_tflops(device: str, dtype: torch.dtype, override: Optional[float] = None) -> tuple[float, str]:
    """(peak TFLOP/s per device, where it came from): the override, the table, or a measurement
    of a dense matmul sized to fill the device (n = 8192 on an accelerator, 1024 on CPU)."""
    if override:
        return override, "logging.peak_tflops"
    name = device_name(device)
    peak = table_peak(name, dtype) if name != "cpu" else None
    if peak:
        return peak, f"table ({name}, {DTYPE_NAMES.get(dtype, dtype)} dense)"
    from lenext_dist.train.metrics import measure_matmul_tflops

    n = 1024 if device == "cpu" else 8192
    return measure_matmul_tflops(device, dtype, n=n), f"measured ({n}^3 matmul on {name})"
