"""lenext_dist/atomic.py: the one write-to-temp-and-rename helper."""
import os

import pytest

from lenext_dist.atomic import atomic_write


def test_replaces_the_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("old")
    atomic_write(p, "néw\n")
    atomic_write(tmp_path / "b.bin", b"\x00\x01", fsync=True)
    assert p.read_text(encoding="utf-8") == "néw\n" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.bin"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("old")
    with pytest.raises(TypeError):
        atomic_write(p, object())  # neither str nor bytes: fails inside the write
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["a.json"]


def test_the_temporary_carries_the_host_and_pool_sweeps_it(tmp_path):
    """`.tmp-<pid>` alone: two Slurm tasks (or two jobs sharing data.cache_dir) on other nodes
    with the same PID wrote one temporary; and data prep's sweep of a killed worker's files
    (pool.py: `*<temp_suffix(pid)>*`) missed it."""
    import glob

    from lenext_dist.atomic import atomic_file, temp_suffix

    with atomic_file(tmp_path / "plan.json") as f:
        f.write(b"{}")
        (tmp,) = [p for p in os.listdir(tmp_path) if p != "plan.json"]
        assert tmp == "plan.json" + temp_suffix()
        assert glob.glob(str(tmp_path / f"*{temp_suffix(os.getpid())}")) == [str(tmp_path / tmp)]
    assert os.listdir(tmp_path) == ["plan.json"]


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    """The temporary name is predictable (host tag, pid): in a shared folder (data.cache_dir, a
    group's prep --out) another user could plant a link there to a file of the writer's."""
    import os

    from lenext_dist.atomic import atomic_write, open_new, temp_suffix

    victim = tmp_path / "victim"
    victim.write_text("mine")
    target = tmp_path / "plan.json"
    os.symlink(victim, str(target) + temp_suffix())
    atomic_write(target, "{}")
    assert victim.read_text() == "mine" and target.read_text() == "{}" and not target.is_symlink()
    os.symlink(victim, tmp_path / "x.bin")
    with open_new(tmp_path / "x.bin") as f:  # what prep pre-creates before megatron's open("wb")
        f.write(b"data")
    assert victim.read_text() == "mine" and not (tmp_path / "x.bin").is_symlink()
