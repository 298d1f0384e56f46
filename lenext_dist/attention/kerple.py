"""KERPLE (Chi, Fan, Ramadge, Rudnicky 2022, "KERPLE: Kernelized Relative Positional Embedding
for Length Extrapolation", NeurIPS 2022, arXiv:2205.09921): a learned, conditionally positive
definite kernel of the distance as an additive logit bias, per head (and per layer):

    power:  q.k - r1 |i - j|^r2          r1 > 0, 0 < r2 <= 2
    log:    q.k - r1 log(1 + r2 |i - j|)  r1, r2 > 0

Parametrization keeping the constraints without clamping the weights after each step (which
their code does: `.data.clamp(min=1e-2)` in every forward): r = eps + softplus(raw) for r1 and the
log form's r2, r2 = 2 sigmoid(raw) for the power form's exponent. Init as the released code
(github.com/chijames/KERPLE, `ParallelKerpleLog` / `ParallelKerplePower`): r1 ~ U(0, 2) and
r2 ~ U(0, 1) per head (clamped up to eps), here `r1_init_max` / `r2_init_max`.

State-dict keys of the variant module: `r1_raw` [h], `r2_raw` [h] (fp32 when created; a bf16
engine casts them like every parameter, and they are read through `precision.fp32_value`, the
exact fp32 value the training loop keeps beside them). They get no weight decay (1-D parameters).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .alibi import _need_heads
from .precision import fp32_value
from .cfg import cfg_get
from .position import PositionVariant


def _softplus_inv(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))  # inverse of softplus, y > 0


class _Kerple(PositionVariant):
    needs_num_heads = True
    learned = True

    def __init__(self, num_heads: int, r1_init_max: float = 2.0, r2_init_max: float = 1.0,
                 eps: float = 1e-2):
        super().__init__()
        self.num_heads, self.eps = num_heads, eps
        self.r1_init_max, self.r2_init_max = r1_init_max, r2_init_max
        self.r1_raw = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32))
        self.r2_raw = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32))
        self.reset_parameters()

    @classmethod
    def from_config(cls, attn_cfg, *, head_dim: int, train_length: int,
                    num_heads: Optional[int] = None) -> "_Kerple":
        return cls(_need_heads(cls, num_heads),
                   r1_init_max=float(cfg_get(attn_cfg, "kerple", "r1_init_max", default=2.0)),
                   r2_init_max=float(cfg_get(attn_cfg, "kerple", "r2_init_max", default=1.0)),
                   eps=float(cfg_get(attn_cfg, "kerple", "eps", default=1e-2)))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.r1_raw.device.type == "meta":
            return
        # draw in fp32 on CPU (same numbers on every device), then copy
        h = self.num_heads
        r1 = (torch.rand(h, device="cpu") * self.r1_init_max).clamp(min=2 * self.eps)
        r2 = (torch.rand(h, device="cpu") * self.r2_init_max).clamp(min=2 * self.eps)
        self.r1_raw.copy_(self._r1_inverse(r1))
        self.r2_raw.copy_(self._r2_inverse(r2))

    def _r1_inverse(self, r1: Tensor) -> Tensor:
        return _softplus_inv(r1 - self.eps)

    def r1(self) -> Tensor:
        """[h] fp32, > eps."""
        return self.eps + F.softplus(fp32_value(self.r1_raw))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_heads={self.num_heads}, eps={self.eps}"


class KerpleLog(_Kerple):
    """-r1 log(1 + r2 |i - j|); the form the KERPLE paper recommends (best extrapolation)."""

    name = "kerple_log"

    def _r2_inverse(self, r2: Tensor) -> Tensor:
        return _softplus_inv(r2 - self.eps)

    def r2(self) -> Tensor:
        """[h] fp32, > eps."""
        return self.eps + F.softplus(fp32_value(self.r2_raw))

    def distance_bias(self, n: int, device: Optional[torch.device] = None) -> Tensor:
        dist = torch.arange(n, device=device, dtype=torch.float32)
        return -self.r1()[:, None] * torch.log1p(self.r2()[:, None] * dist[None, :])


class KerplePower(_Kerple):
    """-r1 |i - j|^r2 with 0 < r2 < 2."""

    name = "kerple_power"

    def _r2_inverse(self, r2: Tensor) -> Tensor:
        return torch.logit(r2 / 2.0)

    def r2(self) -> Tensor:
        """[h] fp32 in (0, 2)."""
        return 2.0 * torch.sigmoid(fp32_value(self.r2_raw))

    def distance_bias(self, n: int, device: Optional[torch.device] = None) -> Tensor:
        dist = torch.arange(n, device=device, dtype=torch.float32)
        # dist^r2 with d(0^r2)/dr2 = 0 (torch.pow gives nan there: log(0) * 0)
        safe = dist.clamp(min=1.0)
        powed = torch.where(dist[None, :] > 0, safe[None, :] ** self.r2()[:, None],
                            torch.zeros((), device=device))
        return -self.r1()[:, None] * powed
