"""Attention math of every variant, in plain torch (no megatron, no lenext_dist.config import), so
the exported HF modeling code can carry a verbatim copy of this package.

Public API: `attend` (the whole variant), `causal_attention` (SDPA fast path),
`eager_causal_attention` / `iter_attention_probs` (explicit softmax reference, by query chunks),
`build_position` / `POSITIONS` (the registry), `layer_variants` / `layer_names` / `LAYOUTS`
(per-layer layouts, layout.py), `PositionVariant`, `NoPE`, `RoPE`, `ALiBi`, `KerpleLog`,
`KerplePower`, `Sandwich`, `XPOS`, `QK_NORMS` / `layer_qk_norms` (QK-norm per layer, qknorm.py),
`MaskSpec` (sliding window / blockwise causal), the bias/mask
kernels `BIAS_IMPLS` (paths.py), `Documents` / `document_ids` (document masking of packed
sequences, documents.py).
"""
from .alibi import ALiBi
from .core import (BIAS_IMPLS, IMPL_NAMES, attend, causal_attention, eager_causal_attention,
                   iter_attention_probs)
from .documents import Documents, document_ids
from .kerple import KerpleLog, KerplePower
from .layout import LAYOUTS, layer_names, layer_variants
from .mask import MaskSpec
from .names import HEAD_SCALE, HEAD_SCALE_KEY
from .position import NoPE, PositionVariant, alibi_slopes
from .qknorm import NORMS as QK_NORMS, layer_norms as layer_qk_norms
from .registry import POSITIONS, build_position
from .rope import SCALINGS, RoPE, apply_partial_rotary, apply_rotary, rotate_half
from .sandwich import Sandwich
from .xpos import XPOS

__all__ = ["attend", "causal_attention", "eager_causal_attention", "iter_attention_probs",
           "NoPE", "PositionVariant", "POSITIONS", "build_position", "SCALINGS", "RoPE",
           "apply_rotary", "rotate_half", "ALiBi", "KerpleLog", "KerplePower", "Sandwich", "XPOS",
           "MaskSpec", "alibi_slopes", "BIAS_IMPLS", "IMPL_NAMES", "Documents", "document_ids"]
__all__ += ["HEAD_SCALE", "HEAD_SCALE_KEY", "LAYOUTS", "layer_names", "layer_variants", "QK_NORMS",
            "layer_qk_norms", "apply_partial_rotary"]
