"""User errors, and the one wrapper every command runs under.

A `UserError` (ConfigError, CheckpointError, PrepError, eval's EvalError... derive from it) says
what is wrong, where (the file, line or flag) and what to do. `entry_point(main)` runs a command's
main: a UserError (or a missing/unreadable file the user named, or a file where a folder is
needed) prints `error: <message>` on one line and exits 2, with no traceback; `--debug` on the
command line or LENEXT_DEBUG=1 in the environment shows the traceback instead. Any other
exception is a bug and keeps its traceback. Used by every `lenext ...` command (prep, train,
convert, eval, report, extend), `python -m lenext_dist.train` / launch/pretrain.py,
data_prep/shard.py and `python -m lenext_dist.convert`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from typing import Callable, Iterator, Optional, Sequence

EXIT_USER_ERROR = 2
DEBUG_ENV = "LENEXT_DEBUG"


class UserError(Exception):
    """Bad input from the user: the message names the file/flag and what to do."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, partial or not ours (the message says which and what to do);
    lenext_dist.checkpoint, lenext_dist.train.checkpoint and reshard raise it."""


USER_ERRORS = (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
               FileExistsError)
"""What a user's input causes (the OSErrors: a path the user named that is missing, unreadable, a
file where a folder is needed or the reverse): one line. Anything else keeps its traceback."""


def _debug(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def entry_point(main: Callable[[Optional[Sequence[str]]], int]) -> Callable[..., int]:
    """Wrap `main(argv) -> exit code`: user errors -> one `error:` line and exit 2. `--debug` is
    taken out of argv before `main` sees it."""

    @functools.wraps(main)
    def wrapped(argv: Optional[Sequence[str]] = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        debug = _debug(argv)
        argv = [a for a in argv if a != "--debug"]
        if debug:
            os.environ[DEBUG_ENV] = "1"  # child commands (extend's launches) show theirs too
        if not (debug or os.environ.get(DEBUG_ENV) == "1"):
            from lenext_dist.quiet import install

            install()  # the warnings known to be harmless (lenext_dist/quiet.py)
        try:
            return main(argv)
        except USER_ERRORS as e:
            if debug:
                raise
            print(f"error: {message(e)}", file=sys.stderr, flush=True)
            return EXIT_USER_ERROR

    return wrapped


def message(e: BaseException) -> str:
    """The message; an OSError names its file."""
    if isinstance(e, FileExistsError) and e.filename and not os.path.isdir(e.filename):
        # os.makedirs("/a/file/x"): the file "/a/file" stands where a folder is needed
        text = f"{e.filename}: a file where a folder is needed; choose another path"
    elif isinstance(e, OSError) and not isinstance(e, UserError) and e.filename:
        text = f"{e.filename}: {e.strerror or e}"
    else:
        text = str(e) or type(e).__name__
    return text.strip()


@contextlib.contextmanager
def sigterm_unwinds(notice: str) -> Iterator[None]:
    """Within the block, SIGTERM (`kill PID`, Slurm) prints `notice` and raises SystemExit(143),
    so every `finally` and `with` on the way out runs as on Ctrl-C (workers stopped, staging
    folders and temporaries removed, locks released) instead of the process dying mid-write. The
    handler before is restored after; off the main thread (no signal handlers there) a no-op.
    Install it after forking workers: a forked child would inherit it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum, _frame):
        with contextlib.suppress(OSError):
            print(notice, file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
