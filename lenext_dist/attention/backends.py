"""Which attention implementation and which SDPA kernel ran, and a preference for the latter.

- `note_impl(name, reason)`: every attention call tells which implementation it took (`sdpa`:
  the causal fast path; `chunked` / `sdpa_mask` / `flex` / `eager`: paths.py), logged once per
  (name, reason) at INFO on the `lenext_dist.attention` logger (a fallback, e.g. flex -> chunked
  under autograd on CPU or past FLEX_MAX_SHAPES, says why); `last_impl()` returns the latest.
- `record_sdpa_backends()`: a context that records the kernels SDPA dispatched to inside it
  (torch.profiler op names, CPU-side events only: cheap, works on every device), as
  `BACKEND_OPS` names: flash / efficient / cudnn / math / flash_cpu / overrideable, plus `flex`
  for FlexAttention. `last_backend()` returns what the latest recording saw.
- `prefer_sdpa_backends(names)`: torch.nn.attention.sdpa_kernel with those of `names` this torch
  knows, in that order, math always kept last as the fallback (cuDNN / FA3-class kernels where
  available, a clean no-op preference on CPU).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional, Sequence

log = logging.getLogger("lenext_dist.attention")

BACKEND_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_cpu",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
"""Our names -> torch.nn.attention.SDPBackend members (those this torch has are used)."""

_noted: set = set()
_last: dict = {"impl": None, "backends": None}


def note_impl(name: str, reason: str = "") -> None:
    """Record the implementation an attention call took; log it once per (name, reason)."""
    _last["impl"] = name
    if (name, reason) not in _noted:
        _noted.add((name, reason))
        log.info("attention implementation: %s%s", name, f" ({reason})" if reason else "")


def last_impl() -> Optional[str]:
    return _last["impl"]


def last_backend() -> Optional[list[str]]:
    """Kernels seen by the latest `record_sdpa_backends()` (None before any recording)."""
    return _last["backends"]


@contextlib.contextmanager
def record_sdpa_backends() -> Iterator[list[str]]:
    """with record_sdpa_backends() as seen: ...  -> seen: sorted kernel names (after the block)."""
    from torch.profiler import ProfilerActivity, profile

    seen: list[str] = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield seen
    names = {e.name for e in prof.events()}
    found = {BACKEND_OPS[n] for n in names if n in BACKEND_OPS}
    if any("flex_attention" in n for n in names):
        found.add("flex")
    seen.extend(sorted(found))
    _last["backends"] = list(seen)


def prefer_sdpa_backends(names: Sequence[str]):
    """A context making SDPA try `names` (flash / efficient / cudnn / math) in that order."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    unknown = [n for n in names if n not in SDPA_BACKENDS]
    if unknown:
        raise ValueError(f"unknown SDPA backend(s) {unknown}: use {', '.join(SDPA_BACKENDS)}")
    order = [getattr(SDPBackend, SDPA_BACKENDS[n]) for n in (*names, "math")
             if hasattr(SDPBackend, SDPA_BACKENDS[n])]
    order = list(dict.fromkeys(order))  # math once, last unless named
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # a torch without set_priority: the set, in torch's own order
        return sdpa_kernel(order)
