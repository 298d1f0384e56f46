"""Rotary position embedding (Su et al. 2021, arXiv:2104.09864) and its length-extension scalings.

Convention: the "rotate_half" (GPT-NeoX / HF Llama / megatron `rotary_interleaved=False`) layout:
the head dim d splits into halves (x1, x2) = (x[..., :d/2], x[..., d/2:]), pair i = (x1_i, x2_i)
rotates by angle p * theta_i with theta_i = base^(-2i/d), i = 0..d/2-1:

    rope(x, p) = x * cos(p theta) + rotate_half(x) * sin(p theta),  rotate_half(x) = (-x2, x1)

with cos/sin of width d (the d/2 angles repeated twice). Scalings (s = attention.rope.factor):

- `pi`   Position Interpolation (Chen et al. 2023, arXiv:2306.15595): p -> p / s, implemented as
         theta_i / s (HF "linear" rope_type, identical up to fp32 rounding).
- `ntk`  NTK-aware (bloc97, reddit r/LocalLLaMA 2023): base -> base * s^(d / (d - 2)).
- `yarn` YaRN (Peng et al. 2023, arXiv:2309.00071 sec. 3.2-3.4): by-parts interpolation between
         theta_i (high-frequency dims, beta_fast=32 rotations within L) and theta_i / s (low-
         frequency dims, beta_slow=1 rotation), linear ramp between; attention temperature
         sqrt(1/t) = 0.1 ln s + 1 multiplies cos and sin, i.e. the logits by (0.1 ln s + 1)^2.
         Same formulas and defaults as transformers' `_compute_yarn_parameters` (truncate=True),
         with original_max_position_embeddings = the training length L.

Partial RoPE (`attention.rope.fraction` f, megatron's rotary_percent, transformers'
partial_rotary_factor): only the first r = int(f d) dims of each head rotate, as above with d
replaced by r (theta_i = base^(-2i/r), pairs (i, i + r/2), i < r/2); dims r..d-1 pass unchanged
(GPT-NeoX / megatron `apply_rotary_pos_emb_bshd`: t[..., :rot_dim] rotated, t[..., rot_dim:]
concatenated back). The scalings below then see r as their dim (as transformers' rope functions
do: dim = int(head_dim * partial_rotary_factor)).

Scalings are entries of `SCALINGS` (name -> function returning (inv_freq [d/2] fp32, mscale)).
cos/sin are computed in fp32 and cast to the input dtype before the multiply (as HF Llama does).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from .cfg import cfg_get
from .position import PositionVariant


def _base_inv_freq(dim: int, base: float) -> Tensor:
    # theta_i = base^(-2i/d), i = 0..d/2-1; [d/2] fp32 (same expression as HF's default rope)
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / dim))


def _none(dim: int, base: float, factor: float, train_length: int) -> tuple[Tensor, float]:
    return _base_inv_freq(dim, base), 1.0


def _pi(dim: int, base: float, factor: float, train_length: int) -> tuple[Tensor, float]:
    return _base_inv_freq(dim, base) / factor, 1.0


def _ntk(dim: int, base: float, factor: float, train_length: int) -> tuple[Tensor, float]:
    if dim < 4:  # the exponent r / (r - 2)
        raise ValueError(f"attention.rope.scaling 'ntk' rescales the base by factor^(r/(r-2)): it "
                         f"needs >= 4 rotated dims r, got {dim} (raise attention.rope.fraction)")
    return _base_inv_freq(dim, base * factor ** (dim / (dim - 2))), 1.0


def _yarn(dim: int, base: float, factor: float, train_length: int,
          beta_fast: float = 32.0, beta_slow: float = 1.0) -> tuple[Tensor, float]:
    mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

    def correction_dim(num_rotations: float) -> float:
        # the dim index whose wavelength fits `num_rotations` times into the training length
        return dim * math.log(train_length / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid 0/0 in the ramp (as HF)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    extrapolate = 1.0 - ramp  # 1: keep theta_i (high frequency), 0: interpolate theta_i / s
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, mscale


SCALINGS: dict[str, Callable[..., tuple[Tensor, float]]] = {
    "none": _none,
    "pi": _pi,
    "ntk": _ntk,
    "yarn": _yarn,
}


def rotate_half(x: Tensor) -> Tensor:
    """[..., d] -> [..., d]: (x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [b, h, s, d]; cos, sin [s, d] in x.dtype -> rotated x [b, h, s, d]."""
    return x * cos + rotate_half(x) * sin


def apply_partial_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [b, h, s, d]; cos, sin [s, r] (r < d) -> x with its first r dims rotated, the rest as is."""
    r = cos.shape[-1]
    return torch.cat((apply_rotary(x[..., :r], cos, sin), x[..., r:]), dim=-1)


def rotary_dims(head_dim: int, fraction: float = 1.0) -> int:
    """r = int(fraction * head_dim), the dims a (partial) RoPE rotates (transformers'
    `int(head_dim * partial_rotary_factor)`); ValueError naming attention.rope.fraction unless r is
    even and >= 2."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"attention.rope.fraction must be in (0, 1], got {fraction}")
    r = int(head_dim * fraction)
    if r < 2 or r % 2:
        raise ValueError(f"attention.rope.fraction {fraction} of head dim {head_dim} rotates {r} "
                         "dims; RoPE rotates pairs: pick a fraction giving an even count >= 2")
    return r


class RoPE(PositionVariant):
    """RoPE on q and k inside core attention (megatron's own RotaryEmbedding stays off)."""

    name = "rope"
    rope_scalings = True

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: str = "none",
                 factor: float = 1.0, train_length: int = 2048, fraction: float = 1.0):
        super().__init__()
        rotary_dim = rotary_dims(head_dim, fraction)
        if scaling not in SCALINGS:
            raise ValueError(f"unknown rope scaling {scaling!r}; known: {sorted(SCALINGS)}")
        self.head_dim, self.base, self.scaling, self.factor = head_dim, base, scaling, factor
        self.fraction, self.rotary_dim = fraction, rotary_dim
        self.train_length = train_length
        inv_freq, self.mscale = SCALINGS[scaling](rotary_dim, base, factor, train_length)
        self.inv_freq = inv_freq  # [r/2] fp32, on CPU; moved lazily with the cos/sin cache
        self._cache: tuple | None = None  # (key, cos [s, r], sin [s, r])

    @classmethod
    def from_config(cls, attn_cfg, *, head_dim: int, train_length: int,
                    num_heads: Optional[int] = None) -> "RoPE":
        r = attn_cfg.rope
        return cls(head_dim, base=r.base, scaling=r.scaling, factor=r.factor,
                   train_length=train_length,
                   fraction=float(cfg_get(attn_cfg, "rope", "fraction", default=1.0)))

    def cos_sin(self, positions: Union[Tensor, int], length: int, device: torch.device,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(cos, sin), each [length, r] in `dtype` on `device` (r = rotary_dim: d unless partial),
        for `positions`: a tensor [length] (any values, fractional allowed) or an int start
        (positions start..start+length-1); positions [b, length] (inside packed documents) give
        [b, 1, length, r].

        The int form is cached for the last (start, length, device, dtype): every layer of a
        forward pass asks for the same range, so the [s, d/2] fp32 outer product is paid once per
        step, without comparing tensors (no device sync). Tensors made under torch.inference_mode
        (the evaluations) are kept apart: a later training forward cannot save them for backward.
        """
        if isinstance(positions, int):
            key = (positions, length, device, dtype, torch.is_inference_mode_enabled())
            if self._cache is not None and self._cache[0] == key:
                return self._cache[1], self._cache[2]
            pos = torch.arange(positions, positions + length, device=device)
        else:
            key, pos = None, positions.to(device)
        angles = pos.to(torch.float32)[..., None] * self.const("inv_freq", device)  # [(b,) s, r/2]
        emb = torch.cat((angles, angles), dim=-1)  # [(b,) s, r] fp32
        if emb.dim() == 3:
            emb = emb.unsqueeze(1)  # [b, 1, s, r]: broadcast over heads
        cos = (emb.cos() * self.mscale).to(dtype)
        sin = (emb.sin() * self.mscale).to(dtype)
        if key is not None:
            self._cache = (key, cos, sin)
        return cos, sin

    def rotate(self, q: Tensor, k: Tensor, positions: Union[Tensor, int]) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(positions, q.shape[2], q.device, q.dtype)
        if self.rotary_dim == self.head_dim:
            return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return apply_partial_rotary(q, cos, sin), apply_partial_rotary(k, cos, sin)

    def extra_repr(self) -> str:
        partial = "" if self.fraction == 1.0 else f", fraction={self.fraction} ({self.rotary_dim} dims)"
        return (f"{super().extra_repr()}, head_dim={self.head_dim}, base={self.base}, "
                f"scaling={self.scaling}, factor={self.factor}, train_length={self.train_length}"
                + partial)
