"""XPOS (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv:2212.10554; the torchscale
implementation): RoPE whose rotation pairs also decay exponentially with distance.

Pair k (k = 0..d/2-1, rotate_half layout: dims k and k + d/2) rotates by p theta_k as in RoPE and
the query at position i is scaled by xi_k^(i / scale_base), the key at position j by
xi_k^(-j / scale_base), so the logit of the pair carries xi_k^((i - j) / scale_base) (< 1 for
i > j: causal only):

    xi_k = (k / (d/2) + gamma) / (1 + gamma),  gamma = 0.4,  scale_base = 512

(torchscale: `(arange(0, d, 2) + 0.4 d) / (1.4 d)`). Blockwise causal attention (block = the
training length L, each query sees its own block and the previous one) is the option the paper
evaluates beyond L (`attention.xpos.blockwise`).

Numerical range: the scales are exp(+-i ln(xi_0) / scale_base) with ln(1/xi_0) = ln 3.5 = 1.25, so
fp32/bf16 (max ~3.4e38, ln = 88.7) hold positions up to ~36K with the defaults, fp16 (max 65504,
ln = 11.1) only up to ~4.5K, less the key's own size: past `max_position` (room for key entries
up to ~45: ~35K and ~2.8K) `rotate` raises rather than return inf keys and NaN logits (checked
when positions are given as a start, as in every full forward, not for a position tensor, which
would need a device sync). torchscale centers
the positions of each call (only i - j matters); we keep absolute positions so that keys cached
with a KV cache stay consistent.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor

from .cfg import cfg_get
from .rope import RoPE, apply_rotary


class XPOS(RoPE):
    name = "xpos"
    rope_scalings = False  # rotates with the plain RoPE frequencies; PI/NTK/YaRN are not defined here

    def __init__(self, head_dim: int, base: float = 10000.0, gamma: float = 0.4,
                 scale_base: float = 512.0, blockwise: bool = False, train_length: int = 2048):
        super().__init__(head_dim, base=base, train_length=train_length)
        self.gamma, self.scale_base, self.blockwise = gamma, scale_base, blockwise
        # on the CPU whatever the ambient device (build_model runs under torch.device(dev));
        # const() moves it to each call's device
        k = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu")
        self.xi = (k / head_dim + gamma) / (1 + gamma)  # [d/2] fp32, k = 2k': k'/(d/2), plain attr
        self.block = train_length if blockwise else None

    @classmethod
    def from_config(cls, attn_cfg, *, head_dim: int, train_length: int,
                    num_heads: Optional[int] = None) -> "XPOS":
        def opt(key, default):
            return cfg_get(attn_cfg, "xpos", key, default=default)

        return cls(head_dim, base=float(cfg_get(attn_cfg, "rope", "base", default=10000.0)),
                   gamma=float(opt("gamma", 0.4)), scale_base=float(opt("scale_base", 512.0)),
                   blockwise=bool(opt("blockwise", False)), train_length=train_length)

    def decay(self, positions: Union[Tensor, int], length: int, device) -> Tensor:
        """xi^(p / scale_base) [length, d] fp32 (pairs k and k + d/2 share xi_k); [b, 1, length, d]
        for positions [b, length]."""
        if isinstance(positions, int):
            pos = torch.arange(positions, positions + length, device=device)
        else:
            pos = positions.to(device)
        log_xi = torch.log(self.const("xi", device))
        e = pos.to(torch.float32)[..., None] / self.scale_base * log_xi  # [(b,) s, d/2]
        up = torch.exp(torch.cat((e, e), dim=-1))
        return up.unsqueeze(1) if up.dim() == 3 else up

    def max_position(self, dtype: torch.dtype, headroom: float = 64.0) -> int:
        """Largest position p whose key scale xi_0^(-p / scale_base) times `headroom` is finite in
        `dtype`: rotated keys with entries up to headroom / sqrt(2) (a rotation mixes two) stay finite
        (fp16: ~2.8K with the defaults; bf16/fp32: ~35K)."""
        room = math.log(torch.finfo(dtype).max / headroom)
        xi_min = self.gamma / (1 + self.gamma)  # xi at k = 0, in Python: no device sync per forward
        return int(room * self.scale_base / -math.log(xi_min))

    def rotate(self, q: Tensor, k: Tensor, positions: Union[Tensor, int]) -> tuple[Tensor, Tensor]:
        if isinstance(positions, int) and positions + q.shape[2] - 1 > self.max_position(q.dtype):
            raise ValueError(
                f"XPOS: position {positions + q.shape[2] - 1} overflows {q.dtype} (scaled keys stay finite "
                f"up to {self.max_position(q.dtype)} with scale_base {self.scale_base:g}); run in "
                f"bf16/fp32 or raise attention.xpos.scale_base")
        cos, sin = self.cos_sin(positions, q.shape[2], q.device, torch.float32)
        up = self.decay(positions, q.shape[2], q.device)  # [s, d] fp32
        return (apply_rotary(q, (cos * up).to(q.dtype), (sin * up).to(q.dtype)),
                apply_rotary(k, (cos / up).to(k.dtype), (sin / up).to(k.dtype)))

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, gamma={self.gamma}, scale_base={self.scale_base}, "
                f"blockwise={self.blockwise}")
