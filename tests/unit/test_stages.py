"""train.stages at the config edge (one-line errors naming the stage) and the dry run of every
shipped staged config (docs/recipe.md); the training behaviour: tests/distributed/test_stages_train.py."""
import re

import pytest
import yaml

from lenext_dist.config import ConfigError, load_config, stages


def _load(tmp_path, train_stages, **train):
    """A RoPE model (a stage's rope_base needs RoPE layers) with these stages."""
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"attention": {"position": "rope"},
                                 "train": {"steps": 10, "micro_batch_size": 2, "global_batch_size": 8,
                                           **train, "stages": train_stages}}))
    return load_config(p)


def test_stage_settings_carry_over_and_tokens_per_step_are_kept(tmp_path):
    cfg = _load(tmp_path, [{"start_step": 4, "seq_length": 256, "rope_base": 1.0e5},
                           {"start_step": 7, "seq_length": 512, "micro_batch_size": 1}])
    assert stages.bounds(cfg) == [(0, 4), (4, 7), (7, 10)]
    assert [stages.index_at(cfg, s) for s in range(11)] == [0] * 4 + [1] * 3 + [2] * 4
    s1, s2 = stages.stage_config(cfg, 1), stages.stage_config(cfg, 2)
    assert (s1.model.seq_length, s1.attention.rope.base, s1.train.global_batch_size) == (256, 1.0e5, 4)
    # stage 2 keeps stage 1's theta, sets its own micro batch; L stays stage 0's length
    assert (s2.model.seq_length, s2.attention.rope.base, s2.train.micro_batch_size) == (512, 1.0e5, 1)
    assert s2.train.global_batch_size * 512 == cfg.train.global_batch_size * cfg.model.seq_length
    assert s2.model.train_length == cfg.model.seq_length and s2.train.stages == []
    # tokens count through the stages' own tokens per step
    assert stages.tokens_offset(cfg, 2) + 7 * 2 * 512 == 7 * 8 * 128


def test_a_stage_can_start_at_a_token_count(tmp_path):
    # 1,024 tokens per step: 4,000 tokens are trained by step 4 (4,096); stage 2 starts once
    # 4 x 1,024 + n x 1,024 (kept) >= 7,168 -> step 7
    cfg = _load(tmp_path, [{"start_tokens": 4000, "seq_length": 256},
                           {"start_tokens": 7168, "seq_length": 512, "micro_batch_size": 1}])
    assert [st.start_step for st in cfg.train.stages] == [4, 7]
    with pytest.raises(ConfigError, match=r"train\.stages\[0\]\.start_step: 5 contradicts start_tokens"):
        _load(tmp_path, [{"start_tokens": 4000, "start_step": 5, "seq_length": 256}])


def test_a_stage_that_changes_tokens_per_step_says_so(tmp_path):
    cfg = _load(tmp_path, [{"start_step": 4, "seq_length": 256, "global_batch_size": 8}])
    assert "NOT kept" in stages.describe(cfg, 1) and "NOT kept" not in stages.describe(cfg, 0)


@pytest.mark.parametrize("bad, key", [
    ([{"start_step": 5}, {"start_step": 5}], r"train\.stages\[1\]\.start_step: .*must be >"),
    ([{"start_step": 10}], r"train\.stages\[0\]\.start_step: .*< train\.steps 10"),
    ([{"start_step": 0}], r"train\.stages\[\]\.start_step"),
    ([{"seq_length": 64}], r"train\.stages\[\]: needs start_step or start_tokens"),
    ([{"start_tokens": 10**9}], r"train\.stages\[0\]\.start_step: .*< train\.steps 10"),
    ([{"start_step": 3, "seq_length": -4}], r"train\.stages\[\]\.seq_length: must be > 0"),
    ([{"start_step": 3, "seq_length": 3000}], r"train\.stages\[0\]\.global_batch_size: .*whole sequences"),
    ([{"start_step": 3, "seq_length": 1024}], r"train\.stages\[0\]\.global_batch_size: .*micro_batch_size"),
])
def test_bad_stages_are_one_line_errors(tmp_path, bad, key):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, bad)
    assert re.search(key, str(e.value)) and "\n" not in str(e.value), str(e.value)


def test_a_stage_theta_needs_a_layer_that_rotates_with_it(tmp_path):
    """A stage's rope_base on a model whose layers have no RoPE was accepted and ignored (its
    rope_scaling was refused); XPOS rotates with RoPE's theta and keeps it."""
    _load(tmp_path, [{"start_step": 4, "rope_base": 1.0e5}])
    path = tmp_path / "s.yaml"
    assert stages.stage_config(load_config(path, ["attention.position=xpos"]), 1).attention.rope.base == 1.0e5
    with pytest.raises(ConfigError, match=r"train\.stages\[0\]\.rope_base: sets RoPE.s theta, but no layer "
                                          r"\(nope x\d+\) rotates"):
        load_config(path, ["attention.position=nope"])


@pytest.mark.parametrize("name, world", [("smollm3-stages", 32), ("llama3-stages", 64)])
def test_dry_run_of_each_shipped_staged_config_estimates_every_stage(megatron_1rank, repo, capsys, name, world):
    from lenext_dist.train.dryrun import dry_run

    cfg = load_config(repo / "configs" / "exp" / f"{name}.yaml")
    out = dry_run(cfg, world=world)
    text = capsys.readouterr().out
    n = len(cfg.train.stages) + 1
    assert len(out["stages"]) == n and all(f"stage {k}: steps" in text for k in range(n))
    tokens = {s["seq_length"] * s["global_batch_size"] for s in out["stages"]}
    assert len(tokens) == 1 and "NOT kept" not in text  # the recipes keep their tokens per step
    mem = [s["memory"]["total"] for s in out["stages"]]
    assert mem[-1] > mem[0]  # the longest stage needs the most memory


def test_the_stage_rope_base_and_length_reach_the_built_model(megatron_1rank, tmp_path):
    from lenext_dist.attention import RoPE
    from lenext_dist.model import build_model

    cfg = _load(tmp_path, [{"start_step": 4, "seq_length": 256, "rope_base": 1.0e5}])
    bases = {k: {m.base for m in build_model(stages.stage_config(cfg, k), device="meta").modules()
                 if isinstance(m, RoPE)} for k in (0, 1)}
    assert bases == {0: {cfg.attention.rope.base}, 1: {1.0e5}}


def test_a_checkpoint_reads_back_as_the_stage_its_weights_were_trained_in(tmp_path):
    """Export and extend read run_config: the stage of the checkpoint's last trained step (a
    boundary checkpoint is its earlier stage's); a resume compares the saved, whole config."""
    from lenext_dist.checkpoint.layout import run_config, saved_config, tag_for
    from lenext_dist.config import save_config

    cfg = _load(tmp_path, [{"start_step": 4, "seq_length": 256, "rope_base": 1.0e5}])
    for step, (seq, base) in ((4, (128, cfg.attention.rope.base)), (5, (256, 1.0e5)), (10, (256, 1.0e5))):
        d = tmp_path / tag_for(step)
        d.mkdir()
        save_config(cfg, d / "config.yaml")
        got = run_config(d)
        assert (got.model.seq_length, got.attention.rope.base) == (seq, base), step
        assert saved_config(d).train.stages == cfg.train.stages


@pytest.mark.parametrize("stage, world, key", [
    ({"start_step": 4, "seq_length": 256, "global_batch_size": 6}, 2,
     r"^train\.stages\[0\]: train\.global_batch_size: 6 is not divisible by micro_batch_size x "
     r"data-parallel size = 2 x 2$"),
    ({"start_step": 4, "blend": [{"prefix": "/no/such/shard", "weight": 1.0}]}, 1,
     r"^train\.stages\[0\]\.blend: shard /no/such/shard\.bin not found"),
])
def test_a_later_stage_that_cannot_run_is_refused_before_stage_0_trains(tmp_path, stage, world, key):
    """What only a later stage's boundary would find (its batch over this world's data-parallel
    ranks, its own shards) fails before the run trains, naming the stage."""
    from lenext_dist.train.loop import _check_later_stages

    cfg = _load(tmp_path, [stage])
    _check_later_stages(cfg, 1, world)  # resumed inside that stage: nothing later to check
    with pytest.raises(ConfigError) as e:
        _check_later_stages(cfg, 0, world)
    assert re.search(key, str(e.value)) and "\n" not in str(e.value), str(e.value)


def test_a_later_stage_shard_without_its_answer_mask_is_refused_before_stage_0_trains(tmp_path):
    """data.task_loss 'answers': a stage's shard that has no answer mask and no manifest saying it
    is text (a task shard copied without its mask) is named before the run trains, as data.blend's
    is (data/gpt_data.py check_shards), not at the boundary."""
    from helpers import tiny_shard
    from lenext_dist.train.loop import _check_later_stages

    bare = tiny_shard(str(tmp_path / "bare"))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"data": {"task_loss": "answers"},
                                 "train": {"steps": 10, "micro_batch_size": 2, "global_batch_size": 8,
                                           "stages": [{"start_step": 4, "blend": [{"prefix": bare}]}]}}))
    with pytest.raises(ConfigError, match=rf"^train\.stages\[0\]\.blend: {bare} has no answer mask"):
        _check_later_stages(load_config(p), 0, 1)


def test_a_resume_compares_the_model_of_the_stage_its_weights_and_its_next_step_are_in(tmp_path):
    """train.stages was neither compared nor reported on resume: a stage's RoPE base edited, or its
    start moved past the checkpoint (stage 0's base on weights trained at stage 1's), resumed as
    another model in silence. Later stages may change: a note, as for the data order."""
    from lenext_dist.checkpoint.layout import tag_for
    from lenext_dist.config import save_config
    from lenext_dist.errors import CheckpointError
    from lenext_dist.train.checkpoint import check_resume

    plan = [{"start_step": 4, "seq_length": 256, "rope_base": 1.0e5}, {"start_step": 7, "seq_length": 512}]
    rope = {"attention": {"position": "rope"}}
    step = tmp_path / "ck" / tag_for(5)  # weights of steps 0..4: stage 1's
    step.mkdir(parents=True)
    save_config(_staged(tmp_path, plan, rope), step / "config.yaml")
    assert check_resume(_staged(tmp_path, plan, rope), step) == []
    edited = [{**plan[0], "rope_base": 2.0e5}, plan[1]]
    with pytest.raises(CheckpointError, match=r"attention\.rope\.base: 100000\.0 -> 200000\.0 \(at step 4\)"):
        check_resume(_staged(tmp_path, edited, rope), step)
    moved = [{**plan[0], "start_step": 6}, plan[1]]  # step 5 back in stage 0: its base, 10000
    with pytest.raises(CheckpointError, match=r"attention\.rope\.base: 100000\.0 -> 10000\.0 \(at step 4\)"):
        check_resume(_staged(tmp_path, moved, rope), step)
    later = [plan[0], {**plan[1], "seq_length": 128}]  # a stage yet to come: the plan changed
    notes = check_resume(_staged(tmp_path, later, rope), step)
    assert len(notes) == 1 and notes[0].startswith("train.stages: ")


def _staged(tmp_path, train_stages, extra):
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"train": {"steps": 10, "micro_batch_size": 2, "global_batch_size": 8,
                                           "stages": train_stages}, **extra}))
    return load_config(p)
