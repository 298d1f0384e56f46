"""train.stages on 2 gloo ranks (tiny model, 32 -> 64 tokens at step 4 of 10, tokens per step kept:
global batch 8 -> 4 sequences).

What is compared, exactly: the staged run against the same run done by hand, which is what the
rule of config/stages.py promises it is: a plain run at 32 tokens (same train.steps, so the same LR
schedule and data sizes) stopped at the boundary (its step_4 checkpoint; later ones removed, as a
stop there leaves it), then resumed from that checkpoint (weights, AdamW moments, RNG: a full
resume, not init_from's weights only) with model.seq_length=64 and global_batch_size=4. The staged
run itself is killed with -9 inside stage 1 and resumed; then resumed again at 1 rank from a
checkpoint inside stage 1."""
import pytest

from helpers import free_port, kill9, losses, pretrain_cmd, run, start, wait_for, write_config
from test_resume import _rewind

pytestmark = pytest.mark.distributed

STEPS, BOUNDARY = 10, 4
COMMON = dict(train={"steps": STEPS, "eval_interval": 0, "global_batch_size": 8, "micro_batch_size": 2},
              parallel={"zero_stage": 2})


def test_two_stages_equal_stop_and_resume_at_the_new_length_and_survive_kill9(sample_shards, tmp_path):
    # by hand: plain 32-token run, its checkpoint at the boundary, resumed at 64 tokens
    hand = write_config(tmp_path, sample_shards, "hand", checkpoint={"interval": BOUNDARY, "keep_last": 0},
                        **COMMON)
    run(pretrain_cmd(hand, "deepspeed", 2, free_port()))
    _rewind(tmp_path / "hand" / "checkpoints", f"step_{BOUNDARY:07d}")
    p = run(pretrain_cmd(hand, "deepspeed", 2, free_port(), "--model.seq_length=64",
                         "--model.train_length=32", "--train.global_batch_size=4"))
    assert f"resumed from {tmp_path}/hand/checkpoints/step_{BOUNDARY:07d}" in p.stdout
    expected = losses(tmp_path / "hand")
    assert sorted(expected) == list(range(1, STEPS + 1))

    # staged, killed inside stage 1 (checkpoints every step), resumed
    staged = write_config(tmp_path, sample_shards, "staged", checkpoint={"interval": 1, "keep_last": 0},
                          **{**COMMON, "train": {**COMMON["train"],
                                                 "stages": [{"start_step": BOUNDARY, "seq_length": 64}]}})
    proc = start(pretrain_cmd(staged, "deepspeed", 2, free_port()), tmp_path / "staged.log")
    metrics = tmp_path / "staged" / "metrics.jsonl"
    assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= BOUNDARY + 2,
                    timeout=300), (tmp_path / "staged.log").read_text()[-3000:]
    kill9(proc)
    log = (tmp_path / "staged.log").read_text()
    assert "stage 1: steps [4, 10), seq_length 64" in log and "global 4 = 256 tokens/step" in log
    p = run(pretrain_cmd(staged, "deepspeed", 2, free_port()))
    resumed_at = int(p.stdout.split("resumed from ")[1].split(": step ")[1].split(",")[0])
    assert BOUNDARY < resumed_at < STEPS, p.stdout[-3000:]  # inside stage 1
    got = losses(tmp_path / "staged")
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], abs=1e-6), (step, got, expected)
    stage_of = losses(tmp_path / "staged", "stage")
    assert [stage_of[s] for s in sorted(stage_of)] == [0] * BOUNDARY + [1] * (STEPS - BOUNDARY)
    tokens = losses(tmp_path / "staged", "tokens")
    assert tokens[STEPS] == STEPS * 8 * 32  # tokens per step kept across the boundary

    # at 1 rank from a checkpoint inside stage 1 (ZeRO-2 partitions cut again; float tolerance:
    # one rank sums the global batch in another order)
    _rewind(tmp_path / "staged" / "checkpoints", f"step_{BOUNDARY + 1:07d}")
    p = run(pretrain_cmd(staged, "deepspeed", 1, free_port()))
    assert "resharded to 1" in p.stdout
    one = losses(tmp_path / "staged")
    assert one == pytest.approx(expected, rel=1e-5)
