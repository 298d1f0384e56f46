"""HeadScale mode on 2 ranks: only the per-head scales change, they keep m_h >= 1, and the
clamped search is the same under ZeRO-2 and ZeRO-3."""
import json
import math

import pytest
import torch

from helpers import LAUNCHER, free_port, losses, pretrain_cmd, run, write_config
from lenext_dist.checkpoint.weights import read_weights

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def base(sample_shards, tmp_path_factory):
    """A pretrained checkpoint (4 steps, ZeRO-2) for the searches to start from."""
    tmp = tmp_path_factory.mktemp("hs_base")
    cfg = write_config(tmp, sample_shards, "base", train={"steps": 4, "eval_interval": 0},
                       checkpoint={"interval": 0})
    run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
    return tmp / "base" / "checkpoints"


def test_headscale_search_changes_only_head_scales(base, sample_shards, tmp_path):
    hs = write_config(
        tmp_path, sample_shards, "hs",
        model={"seq_length": 64},  # the search runs past the training length (2x here)
        train={"mode": "headscale", "steps": 4, "eval_interval": 0},
        attention={"scale_c": 1.2, "head_scale": {"enabled": True, "trainable": True, "min_value": 1.0}},
        optim={"lr": 0.1, "warmup_steps": 1, "weight_decay": 0.0},
        checkpoint={"init_from": str(base), "interval": 0},
        data={"seed": 4321},
        parallel={"zero_stage": 2})
    p = run(pretrain_cmd(hs, LAUNCHER, 2, free_port()))
    assert "head scales start at 1.2" in p.stdout and "m_h min" in p.stdout

    before = read_weights(str(base))
    after = read_weights(str(tmp_path / "hs" / "checkpoints"))
    scales = {k for k in after if k.endswith("head_scale")}
    assert len(scales) == 2  # one [heads] vector per layer
    assert set(after) - scales == set(before)
    for k in before:
        assert torch.equal(before[k], after[k]), f"{k} changed during the HeadScale search"
    m = torch.stack([after[k] for k in sorted(scales)])
    assert m.shape == (2, 4)
    assert (m >= 1.0).all()
    assert not torch.allclose(m, torch.full_like(m, 1.2)), "the head scales did not move"
    # the searched scales are also written for people: JSON + layer x head heatmap
    written = json.loads((tmp_path / "hs" / "head_scales.json").read_text())["head_scales"]
    assert torch.equal(torch.tensor(written), m)
    assert (tmp_path / "hs" / "head_scales.png").stat().st_size > 1000


def test_clamped_search_is_the_same_under_zero_1_2_3(base, sample_shards, tmp_path):
    """m_h starts on the bound (1.0) with lr 0.1, so the clamp binds from the first step. ZeRO-3 keeps
    parameters this small gathered and re-gathers them from their partition inside the step: the
    forward must still see the clamped values, i.e. give ZeRO-2's curve and scales. Every stage's
    checkpoint reads back whole (ZeRO-1 keeps the frozen weights in its module file only)."""
    curves, scales = {}, {}
    for stage in (1, 2, 3):
        cfg = write_config(
            tmp_path, sample_shards, f"z{stage}", model={"seq_length": 64},
            train={"mode": "headscale", "steps": 5, "eval_interval": 0},
            attention={"head_scale": {"enabled": True, "trainable": True, "min_value": 1.0, "init": 1.0}},
            optim={"lr": 0.1, "warmup_steps": 1, "weight_decay": 0.0},
            checkpoint={"init_from": str(base), "interval": 0}, data={"seed": 4321},
            parallel={"zero_stage": stage})
        run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
        curves[stage] = losses(tmp_path / f"z{stage}")
        record = json.loads((tmp_path / f"z{stage}" / "head_scales.json").read_text())
        scales[stage] = torch.tensor(record["head_scales"])
        weights = read_weights(str(tmp_path / f"z{stage}" / "checkpoints"))
        assert set(weights) == set(read_weights(str(base))) | {k for k in weights if k.endswith("head_scale")}
    m = scales[2]
    assert (m == 1.0).any() and (m > 1.0).any(), f"the clamp did not bind or nothing moved: {m}"
    for stage in (1, 3):
        torch.testing.assert_close(scales[stage], m, rtol=1e-5, atol=1e-6)
        assert sorted(curves[stage]) == sorted(curves[2]) == list(range(1, 6))
        for step in curves[2]:
            assert math.isclose(curves[stage][step], curves[2][step], rel_tol=2e-5), (stage, step)
