"""The position-variant interface, and NoPE.

A position variant is everything about *where* tokens are that enters attention. It is an
`nn.Module` so that a variant with learned parameters (KERPLE) is a submodule of the attention
that holds it, with the same relative state-dict keys on the megatron side
(`...core_attention.position.<param>`) and the HF side (`...self_attn.position.<param>`).
Parameter-free variants (NoPE, RoPE, ALiBi, Sandwich, XPOS) have no parameters and no buffers,
so they add no state-dict keys and can be shared by all layers.

The core function (`core.attend`) asks a variant for exactly these hooks, so a new variant is a new
class plus one line in `registry.POSITIONS`, never a branch in core code:

- `rotate(q, k, positions)`: a rotation of queries and keys (RoPE and its PI/NTK/YaRN scalings,
  XPOS). Identity by default. `positions` is a tensor [s] or an int start (positions
  start..start+s-1, the common case, which variants may cache on without a device sync).
- `query_scale(positions)`: an optional per-position multiplier t[s] of the logits, folded into q
  so the SDPA fast path still applies. The base class returns the temperature schedule of
  `attention.temperature` (temperature.py: uniform c, log fit, Llama 4, Qwen log-n, SSMax) when
  it applies to this layer's variant (by default NoPE layers), None otherwise.
- `distance_bias(n, device)`: an optional additive bias of the logits that depends on the head and
  the distance i - j only (ALiBi, KERPLE, Sandwich): a table [h, n] fp32 for distances 0..n-1.
  Differentiable (KERPLE's parameters get gradients through it). None by default.
- `mask`: a `MaskSpec` restricting causal attention further: a sliding window (`window`, any
  variant, training or evaluation) and/or blockwise causal attention (`block`, XPOS's option).
- `score_mod(scores, q_pos, k_pos)`: derived from the two above for the explicit-softmax reference
  (`iter_attention_probs`, attention entropy): adds the bias and masks what the window/blocks hide.
  None when the variant has neither (then plain causal SDPA runs).

Generic options every variant carries (set by `configure`, from `AttentionConfig`; all settable
on a built variant at evaluation time): `window`, `chunked`, `block`, `temperature` (the section,
or None where it does not apply to this variant), `train_length`, `impl`
(which kernel runs a variant with a bias or mask, see `core.BIAS_IMPLS`), `chunk_size`.

Variants are built by `from_config(attn_cfg, head_dim=..., train_length=..., num_heads=...)`, where
`attn_cfg` is the `AttentionConfig` of lenext_dist.config (duck-typed: this package imports nothing
from config, so it can be copied next to an exported HF modeling file; missing attributes take
their defaults).
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from .core import IMPL_NAMES, attend
from .temperature import applies, check, describe, multiplier
from .cfg import cfg_get
from .mask import MaskSpec


class PositionVariant(nn.Module):
    """Base class: no position information at all (all hooks are identities)."""

    name: str = "base"
    needs_num_heads: bool = False  # from_config needs num_heads (a per-head bias or parameter)
    rope_scalings: bool = False  # honours rope.scaling (PI/NTK/YaRN) and rope.fraction; others refuse them
    learned: bool = False  # has trained parameters (one set per layer, `for_layer`)

    def __init__(self):
        super().__init__()
        self.window: Optional[int] = None
        self.block: Optional[int] = None
        self.chunked: Optional[int] = None
        self.temperature = None
        self.train_length: Optional[int] = None
        self.impl: str = "auto"
        self.chunk_size: int = 256
        # Ulysses sequence parallelism (lenext_dist/model/ulysses.py): this rank computes query
        # heads [lo, hi) only, so `bias_table` returns those rows of the per-head bias
        self.heads: Optional[tuple[int, int]] = None

    @classmethod
    def from_config(cls, attn_cfg, *, head_dim: int, train_length: int,
                    num_heads: Optional[int] = None) -> "PositionVariant":
        return cls()

    def configure(self, attn_cfg, *, train_length: int) -> "PositionVariant":
        """Read the generic options of `attn_cfg` (duck-typed; missing ones keep the defaults)."""
        self.train_length = train_length
        self.window = cfg_get(attn_cfg, "window")
        self.chunked = cfg_get(attn_cfg, "chunked")
        section = cfg_get(attn_cfg, "temperature")
        if section is not None:
            check(section)
        self.temperature = section if applies(section, self.name) else None
        self.impl = cfg_get(attn_cfg, "impl", default="auto")
        self.chunk_size = int(cfg_get(attn_cfg, "chunk_size", default=256))
        if self.impl not in IMPL_NAMES:  # HF set_position / an export's attention options
            raise ValueError(f"impl {self.impl!r}: known {', '.join(IMPL_NAMES)}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.chunked is not None and self.chunked < 1:
            raise ValueError(f"chunked must be >= 1, got {self.chunked}")
        return self

    def forward(self, q: Tensor, k: Tensor, v: Tensor, m: Tensor,
                positions: Union[Tensor, int, None] = None, *, eager: bool = False,
                documents=None) -> Tensor:
        """`core.attend(q, k, v, m, self, positions, eager=, documents=)` through
        `nn.Module.__call__`, so
        that module hooks see the call (DeepSpeed ZeRO-3 gathers a learned variant's partitioned
        parameters in its pre-forward hook). Callers holding a variant should call it this way."""
        return attend(q, k, v, m, self, positions, eager=eager, documents=documents)

    # ---- hooks ---------------------------------------------------------------------------------

    def rotate(self, q: Tensor, k: Tensor, positions: Union[Tensor, int]) -> tuple[Tensor, Tensor]:
        """q [b, h, s, d], k [b, g, s, d], positions [s], [b, s] (positions inside packed
        documents, one row each) or int start -> rotated (q, k)."""
        return q, k

    def query_scale(self, positions: Tensor) -> Optional[Tensor]:
        """Per-position logit multiplier t [s] or [b, s] (fp32), or None for none: the schedule
        of `self.temperature` (temperature.py) at positions + 1, with L = train_length; the logits
        of query i are then m_h t_i / sqrt(d) q.k."""
        if self.temperature is None:
            return None
        return multiplier(self.temperature, positions, self.train_length)

    def distance_bias(self, n: int, device: Optional[torch.device] = None) -> Optional[Tensor]:
        """Additive logit bias [h, n] fp32 for query-key distances 0..n-1, or None."""
        return None

    def bias_table(self, n: int, device: Optional[torch.device] = None) -> Tensor:
        """`distance_bias` [h, n], restricted to the rows of `self.heads` [hi - lo, n] when set
        (indexing keeps autograd: KERPLE's gradients reach the sliced heads' parameters only)."""
        table = self.distance_bias(n, device)
        return table if self.heads is None else table[self.heads[0]:self.heads[1]]

    @property
    def has_bias(self) -> bool:
        return type(self).distance_bias is not PositionVariant.distance_bias

    @property
    def mask(self) -> MaskSpec:
        return MaskSpec(window=self.window, block=self.block, chunked=self.chunked)

    @property
    def score_mod(self) -> Optional[Callable[[Tensor, Tensor, Tensor], Tensor]]:
        """(scores [b, h, c, sk] fp32, q_pos [c], k_pos [sk]) -> scores with the bias added and
        window/block-hidden keys at -inf; None when the variant has neither (plain causal)."""
        if not self.has_bias and self.mask.causal_only:
            return None
        return self._score_mod

    def _score_mod(self, scores: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if self.has_bias:
            n = int(k_pos.shape[-1])  # distances of causal pairs are < sk
            table = self.bias_table(n, scores.device)  # [h, n] (this rank's heads under SP)
            # q_pos [c] / k_pos [sk], or [b, c] / [b, sk] (positions inside packed documents)
            dist = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(0, n - 1)
            scores = scores + table[:, dist].movedim(0, -3)  # [h, c, sk] or [b, h, c, sk]
        mask = self.mask
        if not mask.causal_only:
            scores = scores.masked_fill(~mask.visible(q_pos, k_pos).unsqueeze(-3), float("-inf"))
        return scores

    # ---- layers --------------------------------------------------------------------------------

    def for_layer(self) -> "PositionVariant":
        """The variant a layer should hold: `self` when parameter-free (shared by all layers), else
        an independent copy with freshly initialized parameters (one set per layer)."""
        if next(self.parameters(), None) is None:
            return self
        twin = copy.deepcopy(self)
        twin.reset_parameters()
        return twin

    def reset_parameters(self) -> None:
        """(Re)initialize learned parameters (variants with parameters override)."""

    def const(self, name: str, device) -> Tensor:
        """The fp32 constant tensor attribute `name` (kept on CPU, e.g. ALiBi's slopes) on `device`,
        copied there once per device and cached: every layer of every step would otherwise pay a
        host-to-device copy (a sync point on CUDA). Not a registered buffer, so a model-wide
        `.to(bfloat16)` (HF) cannot round it and state dicts stay free of it."""
        cache = self.__dict__.setdefault("_const_cache", {})
        # inference-mode copies apart: autograd cannot save them (an evaluation, then training)
        key = (name, None if device is None else torch.device(device), torch.is_inference_mode_enabled())
        if key not in cache:
            cache[key] = getattr(self, name).to(device)
        return cache[key]

    def extra_repr(self) -> str:
        parts = [f"name={self.name}"]
        for k in ("window", "chunked", "block"):
            if getattr(self, k) is not None:
                parts.append(f"{k}={getattr(self, k)}")
        if self.temperature is not None:
            parts.append(f"temperature={describe(self.temperature)}")
        return ", ".join(parts)


class NoPE(PositionVariant):
    """No positional encoding: causal attention alone carries order (Kazemnejad et al. 2023)."""

    name = "nope"


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi head slopes (Press et al. 2022, arXiv:2108.12409, and their released code).

    H a power of 2: m_h = 2^(-8h/H), h = 1..H (a geometric sequence starting at 2^(-8/H)).
    Otherwise, with P the largest power of 2 below H: the P slopes of P heads, then every other
    slope of 2P heads (odd h of the 2P sequence) for the remaining H - P heads.
    """
    def power_of_2(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    p = 2 ** math.floor(math.log2(num_heads))
    return power_of_2(p) + alibi_slopes(2 * p)[0::2][: num_heads - p]
