"""The one write-to-a-temporary-name-and-rename helper for single files.

A reader (a resumed run, `lenext report`, a merge after a Slurm array) sees the old file or the
new one, never half of one: the text goes to `<path>.tmp-<host>-<pid>` (temp_suffix) beside the
target (same folder, so the rename stays on one file system) and `os.replace` (atomic on POSIX)
puts it in place. The suffix keeps concurrent writers apart, on other nodes too, and lets data
prep sweep a killed worker's leftovers (lenext_dist/prep/pool.py globs `*<temp_suffix(pid)>*`).
A failed write removes its temporary; a temporary is always a new file (open_new), never a link
planted at its name written through.
Folders of several files (an export) are staged differently: lenext_dist/convert/outdir.py.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temp_suffix(pid: Optional[int] = None) -> str:
    """`.tmp-<host>-<pid>`: what a process's temporaries end with. The host tag keeps writers on
    other nodes (or in containers of their own PID namespace) with the same PIDs off each other's
    files in a shared folder: the Slurm tasks of one data prep in its --out, two jobs sharing
    data.cache_dir."""
    return f".tmp-{_HOST}-{os.getpid() if pid is None else pid}"


def open_new(path: Union[str, Path]) -> BinaryIO:
    """`path` opened for writing as a new regular file of this process. An entry already there (a
    killed run's leftover, or a symbolic link another user planted under a predictable temporary
    name in a shared folder: data.cache_dir, a group's prep --out) is removed, never written
    through: the new file is made with O_EXCL | O_NOFOLLOW, so a link planted after the removal
    fails the open instead of redirecting the write."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags, 0o666), "wb")


@contextlib.contextmanager
def atomic_file(path: Union[str, Path], *, fsync: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write that appears at `path` whole when the block ends (and not at all
    if it raises). For writers that want a file object (numpy.save of megatron's cache)."""
    tmp = os.fspath(path) + temp_suffix()
    try:
        with open_new(tmp) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # disk full, a kill: leave nothing behind
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write(path: Union[str, Path], data: Union[str, bytes], *, fsync: bool = False) -> None:
    """Replace `path` by `data` (str as UTF-8) in one step. fsync=True also survives a power cut
    (the checkpoint's `latest` tag); without it the promise is safety against a killed process
    (the page cache survives kill -9), which is what data prep needs at its rate of writes."""
    with atomic_file(path, fsync=fsync) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
