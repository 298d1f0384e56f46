"""A real DeepSpeed engine's checkpoint.save on a full filesystem (a small tmpfs) and
checkpoint.init_from of a model of another shape: one CheckpointError line each, no raw
`basic_ios::clear: iostream error` or state_dict error, and the last complete checkpoint intact."""
import os
import subprocess

import pytest

from lenext_dist.config import load_config
from lenext_dist.train import checkpoint, optim
from lenext_dist.checkpoint.layout import COMPLETE, latest_tag, tag_for
from lenext_dist.errors import CheckpointError

os.environ.setdefault("DS_ACCELERATOR", "cpu")
TINY = ["model.num_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
        "model.ffn_hidden_size=64", "model.vocab_size=256", "model.seq_length=16",
        "train.precision=fp32", "parallel.zero_stage=1", "train.micro_batch_size=1",
        "train.global_batch_size=1"]


def engine_of(cfg):
    from lenext_dist.model import build_model
    from lenext_dist.train.loop import skip_deepspeed_shm_op

    skip_deepspeed_shm_op()
    return optim.build_engine(build_model(cfg, device="cpu"), cfg, 1)


@pytest.fixture(autouse=True)
def local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")  # DeepSpeed's engine asks for it


@pytest.fixture
def small_disk(tmp_path):
    """Mounts a tmpfs of the given size on a fresh folder (root only, else the test skips)."""
    mounted = []

    def mount(size: int):
        d = tmp_path / f"disk{len(mounted)}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if p.returncode:
            pytest.skip(f"cannot mount a small tmpfs here ({p.stderr.strip()[:200]})")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_full_disk_during_save_says_how_much_space_and_keeps_the_last_checkpoint(
        megatron_1rank, small_disk, tmp_path):
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", *TINY])
    engine = engine_of(cfg)
    cfg.checkpoint.dir = str(tmp_path / "measure")
    checkpoint.save(engine, cfg, 1, 1)
    size = sum(f.stat().st_size for f in (tmp_path / "measure").rglob("*") if f.is_file())
    disk = small_disk((size * 3 // 2 + 4095) // 4096 * 4096)  # one checkpoint fits, not two
    cfg.checkpoint.dir = str(disk)
    checkpoint.save(engine, cfg, 1, 1)
    first = {p.name: p.read_bytes() for p in (disk / tag_for(1)).iterdir() if p.is_file()}
    with pytest.raises(CheckpointError) as e:
        checkpoint.save(engine, cfg, 2, 2)
    msg = str(e.value)
    assert msg.startswith(f"no space left on {disk}: a checkpoint needs about ")
    assert " free (the unfinished step_0000002 holds " in msg and "\n" not in msg and "iostream" not in msg
    assert f"{tag_for(2)} was not saved and `latest` still names {tag_for(1)} (intact)" in msg
    assert latest_tag(disk) == tag_for(1)
    assert not (disk / tag_for(2) / COMPLETE).exists()
    assert {p.name: p.read_bytes() for p in (disk / tag_for(1)).iterdir() if p.is_file()} == first


def test_init_from_a_model_of_another_shape_names_the_key(megatron_1rank, tmp_path):
    from lenext_dist.model import build_model

    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", *TINY])
    cfg.checkpoint.dir = str(tmp_path / "src")
    checkpoint.save(engine_of(cfg), cfg, 3, 3)
    other = load_config(None, [*TINY, "model.vocab_size=320"])
    with pytest.raises(CheckpointError) as e:
        checkpoint.load_weights(build_model(other, device="cpu"), cfg.checkpoint.dir,
                                keep=optim.is_head_scale)
    msg = str(e.value)
    assert "embedding.word_embeddings.weight is [256, 32] there, [320, 32] here" in msg
    assert "size mismatch" not in msg and "\n" not in msg
