"""Checkpoint bookkeeping around DeepSpeed's save: markers, retention, resume compatibility.
(DeepSpeed's own save/load under every ZeRO stage, kill -9 and resume: tests/distributed.)"""
import pytest
import torch.distributed as dist

from lenext_dist.config import load_config, save_config
from lenext_dist.train import checkpoint
from lenext_dist.checkpoint.layout import COMPLETE, LATEST, latest_tag, resolve, tag_for
from lenext_dist.errors import CheckpointError
from lenext_dist.train.checkpoint import _prune


def complete_steps(root, steps):
    for s in steps:
        (root / tag_for(s)).mkdir(parents=True)
        (root / tag_for(s) / COMPLETE).write_text(f"{s}\n")


def test_retention_never_prunes_the_new_runs_checkpoint_for_an_earlier_runs_later_steps(tmp_path):
    complete_steps(tmp_path, [800, 900])  # an earlier run, kept by keep_last 2
    complete_steps(tmp_path, [100])  # this run (resume: false) just saved step 100
    _prune(tmp_path, 2, tag_for(100))
    assert sorted(p.name for p in tmp_path.iterdir()) == [tag_for(s) for s in (100, 800, 900)]
    complete_steps(tmp_path, [200, 300])
    _prune(tmp_path, 2, tag_for(300))
    assert sorted(p.name for p in tmp_path.iterdir()) == [tag_for(s) for s in (200, 300, 800, 900)]


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class CrashingEngine:
    """Dies inside DeepSpeed's save after writing part of the step (as kill -9 would)."""

    def save_checkpoint(self, root, tag, client_state, save_latest):
        (checkpoint.Path(root) / tag).mkdir(parents=True, exist_ok=True)  # as DeepSpeed makes it
        (checkpoint.Path(root) / tag / "mp_rank_00_model_states.pt").write_bytes(b"partial")
        raise KeyboardInterrupt


class SavingEngine:
    """Writes its step files and returns (DeepSpeed's save, done); the crash comes later, inside our
    marker writes. (The same with the real DeepSpeed engine: test_train_engine.py.)"""

    def save_checkpoint(self, root, tag, client_state, save_latest):
        assert not save_latest  # DeepSpeed must not write its own `latest` before COMPLETE
        (checkpoint.Path(root) / tag).mkdir(parents=True, exist_ok=True)
        (checkpoint.Path(root) / tag / "mp_rank_00_model_states.pt").write_bytes(b"whole")


@pytest.mark.parametrize("killed_at", [COMPLETE, LATEST])
def test_a_kill_during_the_marker_writes_never_leaves_latest_on_an_incomplete_step(
        tmp_path, one_rank, monkeypatch, killed_at):
    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    checkpoint.save(SavingEngine(), cfg, 100, 400)
    assert latest_tag(tmp_path) == tag_for(100)
    real_write, written = checkpoint._atomic_write, []

    def write(path, text):
        if path.name == killed_at:
            raise KeyboardInterrupt
        written.append(path.name)
        real_write(path, text)

    monkeypatch.setattr(checkpoint, "_atomic_write", write)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(SavingEngine(), cfg, 200, 800)
    assert latest_tag(tmp_path) == tag_for(100)  # never the step without COMPLETE
    if killed_at == LATEST:  # killed after COMPLETE: step 200 is whole, by name
        assert written == [COMPLETE]
        assert resolve(tmp_path / tag_for(200)) == tmp_path / tag_for(200)
    else:
        assert written == []
        with pytest.raises(CheckpointError, match="no COMPLETE marker"):
            resolve(tmp_path / tag_for(200))


def test_a_crash_while_overwriting_an_earlier_runs_step_leaves_it_incomplete(tmp_path, one_rank):
    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    complete_steps(tmp_path, [100])  # an earlier run's step 100 (latest points elsewhere)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(CrashingEngine(), cfg, 100, 400)
    with pytest.raises(CheckpointError, match="no COMPLETE marker"):
        resolve(tmp_path / tag_for(100))


def test_a_crash_while_overwriting_the_step_latest_names_moves_latest_back(tmp_path, one_rank):
    # resume: false, both runs saving only step 100: `latest` names the step being overwritten
    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    complete_steps(tmp_path, [50, 100])
    (tmp_path / "latest").write_text(tag_for(100) + "\n")
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(CrashingEngine(), cfg, 100, 400)
    assert latest_tag(tmp_path) == tag_for(50)
    (tmp_path / tag_for(50) / COMPLETE).unlink()  # no other complete step: no `latest` at all
    (tmp_path / "latest").write_text(tag_for(100) + "\n")
    (tmp_path / tag_for(100) / COMPLETE).write_text("100\n")
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(CrashingEngine(), cfg, 100, 400)
    assert latest_tag(tmp_path) is None


def test_a_step_saved_again_keeps_nothing_of_its_unfinished_earlier_save(tmp_path, one_rank):
    """A save of step 100 killed on 4 ranks left rank 3's partition; saved again by fewer ranks,
    the step must not keep it (reshard.saved_dp_size would count 4 and its resume fail)."""
    from lenext_dist.train.reshard import saved_dp_size

    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    stale = tmp_path / tag_for(100) / "zero_pp_rank_3_mp_rank_00_optim_states.pt"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"partial")
    assert saved_dp_size(stale.parent) == 1
    checkpoint.save(SavingEngine(), cfg, 100, 400)
    assert sorted(p.name for p in stale.parent.iterdir()) == [COMPLETE, "config.yaml", "mp_rank_00_model_states.pt"]
    assert saved_dp_size(stale.parent) == 0 and latest_tag(tmp_path) == tag_for(100)


def test_resume_refuses_another_model_and_reports_another_data_order(tmp_path):
    step = tmp_path / tag_for(10)
    step.mkdir()
    save_config(load_config(None, []), step / "config.yaml")
    kernels = ["attention.impl=eager", "attention.chunk_size=64", "attention.sdpa_backends=[flash]"]
    assert checkpoint.check_resume(load_config(None, kernels + ["optim.lr=0.1"]), step) == []
    headscale = ["train.mode=headscale", "checkpoint.init_from=x", "attention.head_scale.enabled=true",
                 "attention.head_scale.trainable=true"]
    for key, overrides in (("attention.position", ["attention.position=rope"]),
                           ("model.num_layers", ["model.num_layers=3"]),
                           ("model.train_length", ["model.seq_length=256"]),
                           ("train.mode", headscale),
                           ("attention.head_scale.enabled", headscale[2:3]),
                           ("parallel.zero_stage", ["parallel.zero_stage=3"]),
                           # other param groups: torch's load raised mid-load
                           ("optim.no_decay_embeddings", ["optim.no_decay_embeddings=true"])):
        with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
            checkpoint.check_resume(load_config(None, overrides), step)
    # applied on resume (optim.settings_kept), and reported
    assert checkpoint.optim_changes(load_config(None, ["optim.lr=0.1", "optim.weight_decay=0"]), step) == [
        "optim.lr: 0.001 -> 0.1", "optim.weight_decay: 0.1 -> 0.0"]
    notes = checkpoint.check_resume(load_config(None, ["data.seed=7", "train.steps=99",
                                                       "data.task_loss=answers"]), step)
    assert notes == ["data.seed: 1234 -> 7", "data.task_loss: 'all' -> 'answers'", "train.steps: 200 -> 99"]
    L = load_config(None, []).model.seq_length  # a longer continuation that keeps the pretrained L
    notes = checkpoint.check_resume(load_config(None, [f"model.seq_length={2 * L}",
                                                       f"model.train_length={L}"]), step)
    assert notes == [f"model.seq_length: {L} -> {2 * L}"]
