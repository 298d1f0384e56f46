"""train.stages on 2 gloo ranks (tiny model, 32 -> 64 tokens at step 4 of 10, tokens per step kept:
global batch 8 -> 4 sequences).

What is compared, exactly: the staged run straight through (it crosses the boundary in its own
process: the next stage's model, data and engine built from the checkpoint it saved there) against
the same run resumed from its boundary checkpoint by a new process (weights, AdamW moments, RNG: a
full resume, not init_from's weights only), then killed with -9 inside stage 1 and resumed; then
resumed again at 1 rank from a checkpoint inside stage 1. Which samples a stage reads is
tests/unit/test_stages_data.py's."""
import pytest

from helpers import LAUNCHER, free_port, kill9, losses, pretrain_cmd, run, start, wait_for, write_config
from test_resume import _rewind

pytestmark = pytest.mark.distributed

STEPS, BOUNDARY = 10, 4
COMMON = dict(train={"steps": STEPS, "eval_interval": 0, "global_batch_size": 8, "micro_batch_size": 2,
                     "stages": [{"start_step": BOUNDARY, "seq_length": 64}]},
              parallel={"zero_stage": 2}, checkpoint={"interval": 1, "keep_last": 0})


def test_a_boundary_crossed_in_process_equals_a_resume_there_and_survives_kill9(sample_shards, tmp_path):
    staged = write_config(tmp_path, sample_shards, "staged", **COMMON)
    p = run(pretrain_cmd(staged, LAUNCHER, 2, free_port()))
    assert "stage 1: steps [4, 10), seq_length 64" in p.stdout and "global 4 = 256 tokens/step" in p.stdout
    expected = losses(tmp_path / "staged")
    assert sorted(expected) == list(range(1, STEPS + 1))
    stage_of = losses(tmp_path / "staged", "stage")
    assert [stage_of[s] for s in sorted(stage_of)] == [0] * BOUNDARY + [1] * (STEPS - BOUNDARY)
    tokens = losses(tmp_path / "staged", "tokens")
    assert tokens[STEPS] == STEPS * 8 * 32  # tokens per step kept across the boundary

    # a new process from the boundary's checkpoint, killed inside stage 1 (checkpoints every step)
    ckpt = tmp_path / "staged" / "checkpoints"
    _rewind(ckpt, f"step_{BOUNDARY:07d}")
    proc = start(pretrain_cmd(staged, LAUNCHER, 2, free_port()), tmp_path / "staged.log")
    assert wait_for(lambda: (ckpt / f"step_{BOUNDARY + 2:07d}").is_dir(), timeout=300), \
        (tmp_path / "staged.log").read_text()[-3000:]
    kill9(proc)
    log = (tmp_path / "staged.log").read_text()
    assert f"resumed from {ckpt}/step_{BOUNDARY:07d}" in log, log[-3000:]
    p = run(pretrain_cmd(staged, LAUNCHER, 2, free_port()))
    resumed_at = int(p.stdout.split("resumed from ")[1].split(": step ")[1].split(",")[0])
    assert BOUNDARY < resumed_at < STEPS, p.stdout[-3000:]  # inside stage 1
    got = losses(tmp_path / "staged")
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], abs=1e-6), (step, got, expected)

    # at 1 rank from a checkpoint inside stage 1 (ZeRO-2 partitions cut again; float tolerance:
    # one rank sums the global batch in another order)
    _rewind(tmp_path / "staged" / "checkpoints", f"step_{BOUNDARY + 1:07d}")
    p = run(pretrain_cmd(staged, LAUNCHER, 1, free_port()))
    assert "resharded to 1" in p.stdout
    one = losses(tmp_path / "staged")
    assert one == pytest.approx(expected, rel=1e-5)
