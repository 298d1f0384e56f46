"""Each attention variant of project issue 7 trains under ZeRO-2 on 2 gloo ranks on real text
(launch/pretrain.py under the deepspeed launcher, the tiny model of tests/helpers.py, 4 steps)."""
import math

import pytest

from helpers import free_port, losses, pretrain_cmd, run, write_config

pytestmark = pytest.mark.distributed

CASES = {
    "alibi": {"position": "alibi"},
    "kerple_log": {"position": "kerple_log"},
    "sandwich": {"position": "sandwich"},
    "xpos": {"position": "xpos", "xpos": {"blockwise": True}},
    "window": {"position": "nope", "window": 8},  # sliding window W = 8 < L = 32
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_variant_trains_under_zero2(case, sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, case, attention=CASES[case],
                       train={"steps": 4, "eval_interval": 0},
                       parallel={"zero_stage": 2}, checkpoint={"interval": 0})
    p = run(pretrain_cmd(cfg, "deepspeed", 2, free_port()), timeout=240)
    curve = losses(tmp_path / case)
    assert sorted(curve) == [1, 2, 3, 4], curve
    assert all(math.isfinite(x) for x in curve.values()), curve
    assert len({round(x, 6) for x in curve.values()}) > 1, curve  # the model is learning something
    assert curve[4] < curve[1], curve
    assert "world 2, ZeRO-2" in p.stdout
    assert f"attention {CASES[case]['position']}" in p.stdout
