"""The LR schedule at its landmarks (warmup start and end, cosine middle and end, the floor)."""
import math

import pytest

from lenext_dist.config import OptimConfig
from lenext_dist.train.optim import cosine_lr


@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1, 0.3])
def test_cosine_lr_landmarks(min_lr_ratio):
    opt = OptimConfig(lr=2e-3, warmup_steps=4, min_lr_ratio=min_lr_ratio)
    T, lr, floor = 20, 2e-3, 2e-3 * min_lr_ratio
    # warmup: optimizer step 0 already takes a step, at lr/W (never 0); step W-1 reaches lr
    assert cosine_lr(0, opt, T) == pytest.approx(lr / 4)
    assert cosine_lr(1, opt, T) == pytest.approx(2 * lr / 4)
    assert cosine_lr(3, opt, T) == pytest.approx(lr)
    assert cosine_lr(4, opt, T) == pytest.approx(lr)  # the cosine starts at its top
    # the middle of the cosine span [W, T] is halfway between lr and the floor
    assert cosine_lr(12, opt, T) == pytest.approx((lr + floor) / 2)
    # the last optimizer step (T - 1) is one step short of the floor: cos(pi * 15/16)
    last = floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * 15 / 16))
    assert cosine_lr(T - 1, opt, T) == pytest.approx(last)
    assert floor < cosine_lr(T - 1, opt, T) < floor + 0.01 * lr
    # the floor itself at T and after (a run extended past its schedule stays there)
    assert cosine_lr(T, opt, T) == pytest.approx(floor, abs=1e-12)
    assert cosine_lr(T + 5, opt, T) == pytest.approx(floor, abs=1e-12)
    after = [cosine_lr(s, opt, T) for s in range(4, T + 1)]
    assert all(b <= a for a, b in zip(after, after[1:]))


def test_cosine_lr_without_warmup_starts_at_lr():
    opt = OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=0.1)
    assert cosine_lr(0, opt, 10) == pytest.approx(1e-3)
    assert cosine_lr(10, opt, 10) == pytest.approx(1e-4)
