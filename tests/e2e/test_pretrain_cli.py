"""launch/pretrain.py as a user runs it: the dry run and config errors, before any training."""
import subprocess
import sys

import pytest

from helpers import REPO, env, free_port, pretrain_cmd, run, write_config

pytestmark = pytest.mark.e2e
PRETRAIN = str(REPO / "launch" / "pretrain.py")


def _cli(*args):
    return subprocess.run([sys.executable, PRETRAIN, *args], cwd=REPO, env=env(2), capture_output=True,
                          text=True, timeout=300)


def test_tinyllama_dry_run_reports_1_1b_and_704_head_scales():
    p = _cli("--config", "configs/exp/tinyllama-1.1b-nope.yaml", "--dry-run",
             "--attention.head_scale.enabled=true")
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "parameters: 1,100,049,088 total (1.100B)" in out  # TinyLlama's 1,100,048,384 + 704 scales
    assert "attention heads: 704 (22 layers x 32 heads)" in out and "here 704 parameters" in out
    assert "FLOPs/token:" in out and "memory estimate per rank" in out
    assert "position: nope" in out  # the resolved config is printed


@pytest.mark.parametrize("override,key", [
    ("--train.micro_batch_sise=3", "train.micro_batch_sise: unknown key (did you mean train.micro_batch_size?)"),
    ("--optim.lr=fast", "optim.lr: expected a number"),
])
def test_bad_config_fails_before_training_naming_the_key(override, key):
    p = _cli("--config", "configs/exp/tiny-cpu-nope.yaml", override)
    assert p.returncode == 2
    assert key in p.stderr and "command line" in p.stderr
    assert "step " not in p.stdout


def test_batch_that_does_not_divide_the_world_fails_on_every_rank(sample_shards, tmp_path):
    """global 6 = micro 2 x accum ? x 2 ranks has no integer accum: both ranks stop with exit 2."""
    cfg = write_config(tmp_path, sample_shards, "bad", train={"global_batch_size": 6})
    p = run(pretrain_cmd(cfg, "deepspeed", 2, free_port()), check=False)
    assert p.returncode != 0
    assert "train.global_batch_size: 6 is not divisible by micro_batch_size x data-parallel size = 2 x 2" \
        in p.stderr
    assert "step 1/" not in p.stdout


def test_missing_shard_fails_before_the_model_is_built(sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, "noshard",
                       data={"blend": [{"prefix": str(tmp_path / "nope_train"), "weight": 1.0}]})
    p = run(pretrain_cmd(cfg, "deepspeed", 1, free_port()), check=False)
    assert p.returncode != 0
    assert f"data.blend: shard {tmp_path / 'nope_train'}.bin not found" in p.stderr
    assert "[lenext] model" not in p.stdout
