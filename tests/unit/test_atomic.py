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
