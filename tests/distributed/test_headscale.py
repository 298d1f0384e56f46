"""HeadScale mode on 2 ranks under ZeRO-2: only the per-head scales change, and they keep m_h >= 1."""
import json

import pytest
import torch

from helpers import free_port, pretrain_cmd, run, write_config
from lenext_dist.train.checkpoint import read_weights

pytestmark = pytest.mark.distributed


def test_headscale_search_changes_only_head_scales(sample_shards, tmp_path):
    base = write_config(tmp_path, sample_shards, "base", train={"steps": 4, "eval_interval": 0},
                        checkpoint={"interval": 0})
    run(pretrain_cmd(base, "deepspeed", 2, free_port()))

    hs = write_config(
        tmp_path, sample_shards, "hs",
        model={"seq_length": 64},  # the search runs past the training length (2x here)
        train={"mode": "headscale", "steps": 4, "eval_interval": 0},
        attention={"scale_c": 1.2, "head_scale": {"enabled": True, "trainable": True, "min_value": 1.0}},
        optim={"lr": 0.1, "warmup_steps": 1, "weight_decay": 0.0},
        checkpoint={"init_from": str(tmp_path / "base" / "checkpoints"), "interval": 0},
        data={"seed": 4321},
        parallel={"zero_stage": 2})
    p = run(pretrain_cmd(hs, "deepspeed", 2, free_port()))
    assert "head scales start at 1.2" in p.stdout and "m_h min" in p.stdout

    before = read_weights(str(tmp_path / "base" / "checkpoints"))
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
