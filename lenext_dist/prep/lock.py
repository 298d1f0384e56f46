"""A lock on one run's directory (`<out>/<name>.parts/lock`), so two runs never interleave.

A run clears temporary files left by killed runs and renames partials into place: a second
run on the same --out/--name at the same time would delete the first's temporary files or
merge half of its output. flock (released by the kernel when the process dies, so a kill -9
leaves no stale lock) makes the second run fail at once with a clear message:

  single run / merge      exclusive lock on the run
  Slurm array task i/n    shared lock on the run (tasks run side by side on disjoint units)
                          + exclusive lock on `lock.task-i-of-n` (the same task twice is refused)
  each unit of work       exclusive lock on `lock.unit-<key>` while it is tokenized (worker.py):
                          tasks submitted with other task counts (units[3::8], units[3::16])
                          share units, and each would delete the other's temporary files

On NFS, Linux maps flock to byte-range locks, which NFSv4 supports. `try_lock` is the one
primitive, also used by training on its run_dir (lenext_dist/train/run_dir.py).
"""

from __future__ import annotations

import fcntl
import os

from .errors import PrepError


def try_lock(path: str, shared: bool = False) -> int | None:
    """Open (creating) `path` and flock it without waiting: the descriptor that holds the lock
    (closing it releases it), or None when another process holds it. A symbolic link at `path`
    raises OSError ELOOP (O_NOFOLLOW): its target, not the folder, would be truncated by the
    holder's note."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class RunLock:
    def __init__(self, parts: str, what: str, task: tuple[int, int] | None = None,
                 unit: str | None = None):
        """Lock run directory `parts` for `what` ("shard" or "merge"); `task` = (index, count)
        of a Slurm array task, else the whole run is locked exclusively. `unit` (its key): only
        that unit's lock, and `what` says where the unit is."""
        self.fds: list[int] = []
        if unit is not None:
            path = os.path.join(parts, f"lock.unit-{unit}")
            self._take(path, False, what, busy=(
                f"another `lenext prep` task is tokenizing {what} ({path} is locked): a submission "
                "of this run with another task count (--num-tasks, $SLURM_ARRAY_TASK_COUNT) is still "
                "running. Let it finish (or cancel it), then rerun this task."))
            return
        shared = task is not None and task[1] > 1
        self._take(os.path.join(parts, "lock"), shared, what)
        if shared:
            self._take(os.path.join(parts, f"lock.task-{task[0]}-of-{task[1]}"), False,
                       f"task {task[0]} of {task[1]}")

    def _take(self, path: str, shared: bool, what: str, busy: str = "") -> None:
        try:
            fd = try_lock(path, shared)
        except OSError as e:
            self.release()
            link = "; it is a symbolic link: remove it" if os.path.islink(path) else ""
            raise PrepError(f"cannot lock {path} ({e.strerror or e}{link})") from None
        if fd is None:
            self.release()
            raise PrepError(busy or (
                f"another `lenext prep` run is using {os.path.dirname(path)!r} ({what} refused: "
                f"{path} is locked). Wait for it to finish (or stop it), or use another "
                "--out/--name."
            )) from None
        self.fds.append(fd)

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)  # closing the descriptor drops the flock
        self.fds = []

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
