"""The one write-to-a-temporary-name-and-rename helper for single files.

A reader (a resumed run, `lenext report`, a merge after a Slurm array) sees the old file or the
new one, never half of one: the text goes to `<path>.tmp-<pid>` beside the target (same folder,
so the rename stays on one file system) and `os.replace` (atomic on POSIX) puts it in place.
The pid suffix keeps concurrent writers apart and lets data prep sweep a killed worker's
leftovers (lenext_dist/prep/pool.py globs `*.tmp-<pid>*`). A failed write removes its temporary.
Folders of several files (an export) are staged differently: lenext_dist/convert/outdir.py.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO, Iterator, Union


@contextlib.contextmanager
def atomic_file(path: Union[str, Path], *, fsync: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write that appears at `path` whole when the block ends (and not at all
    if it raises). For writers that want a file object (numpy.save of megatron's cache)."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
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
