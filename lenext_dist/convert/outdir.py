"""The export's output folder: written beside the target, renamed at the end, and never replacing
anything the exporter did not write.

`--overwrite` replaces only a previous export, recognized by its marker file (MARKER, which lists
the files that export wrote) or, for exports made before the marker existed, by a config.json
with `lenext_source` and nothing but the file names an export writes. It refuses:
- an `--out` that is or contains the checkpoint folder, the step folder or the run folder, or lies
  inside the checkpoint folder (replacing it would delete checkpoints);
- an `--out` holding any file an export did not write (a user's documents, a half-copied export
  with notes added, a home folder): the message names them;
- an `--out` that is a symbolic link (the rename would replace the link, not its target).
What a replacement deletes is printed before it happens; the previous export is renamed aside
and deleted only once the new one is in its place.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Iterable, Iterator, Optional

from lenext_dist.errors import CheckpointError

MARKER = "lenext_export.json"
# names a pre-marker export may hold (see export.py's module docstring)
_LEGACY = re.compile(r"(model\.safetensors|config\.json|generation_config\.json|"
                     r"(configuration|modeling|tokenization)_lenext\.py|lenext_attention(_\w+)?\.py|"
                     r"tokenizer\.model|tokenizer_config\.json|special_tokens_map\.json|"
                     r"lenext_run_config\.yaml)")


class OutputError(CheckpointError):
    """--out cannot be written or replaced safely (the message says why and what to do)."""


def inside(p: Path, root: Path) -> bool:
    return p == root or root in p.parents


def _foreign(folder: Path) -> list[str]:
    """Entries of `folder` that no export wrote ([] for a previous export of ours)."""
    entries = sorted(e.name for e in folder.iterdir())
    marker = folder / MARKER
    if marker.is_file():
        try:
            ours = set(json.loads(marker.read_text())["files"]) | {MARKER}
        except (ValueError, KeyError, TypeError):
            ours = set()
        return [e for e in entries if e not in ours or (folder / e).is_dir()]
    try:
        legacy = "lenext_source" in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        legacy = False
    if not legacy:
        return entries
    return [e for e in entries if not _LEGACY.fullmatch(e) or (folder / e).is_dir()]


def check_out(out: Path, overwrite: Optional[bool], protected: Iterable[Path]) -> list[Path]:
    """Raise OutputError unless `out` may be (re)written; return what writing it would delete.
    overwrite None: the command has no --overwrite (an import writes only a new folder)."""
    if out.is_symlink():
        raise OutputError(f"--out {out} is a symbolic link; name the folder it points to "
                          f"({os.path.realpath(out)}) or another path")
    real = out.resolve()
    for p in protected:
        p = Path(p).resolve()
        if inside(p, real):
            raise OutputError(f"--out {out} contains {p}, which this export reads; "
                              "choose an output folder outside the run")
    if not out.exists():
        return []
    if not out.is_dir():
        raise OutputError(f"--out {out} is a file, not a folder; choose another path")
    entries = sorted(out.iterdir())
    if not entries:
        return []
    if overwrite is None:
        raise OutputError(f"--out {out} exists and is not empty; an import writes a new folder: "
                          "choose another path")
    if not overwrite:
        raise OutputError(f"--out {out} exists and is not empty (pass --overwrite to replace a "
                          "previous export there, or choose another folder)")
    foreign = _foreign(out)
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise OutputError(f"--out {out} holds files that are not from an export "
                          f"({', '.join(foreign[:5])}{more}); --overwrite replaces only a previous "
                          "export: move them away or choose another folder")
    return entries


@contextlib.contextmanager
def staged(out: Path, replaces: list[Path]) -> Iterator[Path]:
    """Yield `.{name}.partial` beside `out` to write into; on success it becomes `out` (see
    _swap), on any error it is removed, `out` untouched."""
    tmp = out.with_name(f".{out.name}.partial")
    try:
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        elif tmp.exists():  # a killed export's leftover (our own name)
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    except OSError as e:
        raise OutputError(f"cannot create {tmp}: {e.strerror or e}; choose a writable --out") from None
    try:
        yield tmp
        files = sorted(p.name for p in tmp.iterdir())
        (tmp / MARKER).write_text(json.dumps({"files": files}, indent=1) + "\n")
    except BaseException as e:
        failed = _write_failure(e)
        free = _free(tmp) if failed else ""
        shutil.rmtree(tmp, ignore_errors=True)
        if failed:
            raise OutputError(f"writing {out} failed: {failed} ({free} free there when it failed); "
                              "nothing was written; free space or choose a writable --out") from None
        raise
    _swap(tmp, out, replaces)


def _swap(tmp: Path, out: Path, replaces: list[Path]) -> None:
    """The finished `tmp` becomes `out`. A previous export is renamed aside (`.{name}.old`) and
    deleted only once `tmp` is in its place, so an rmtree failing halfway (EBUSY on NFS) or a kill
    always leaves one whole export. `tmp` is deleted only while `out` is untouched."""
    old = out.with_name(f".{out.name}.old")
    try:
        if replaces:
            print(f"[lenext.convert] --overwrite: replacing the previous export {out} "
                  f"({len(replaces)} files: {', '.join(p.name for p in replaces[:8])}"
                  f"{' ...' if len(replaces) > 8 else ''})", file=sys.stderr)
            if old.exists():  # a killed swap's leftover, older than `out`
                shutil.rmtree(old)
            os.replace(out, old)
        elif out.exists():
            out.rmdir()  # empty
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"cannot replace {out}: {_write_failure(e)}; {out} is unchanged, nothing "
                          "was written; choose another --out") from None
    try:
        os.replace(tmp, out)
    except OSError as e:
        why = e.strerror or e
        if not replaces:
            shutil.rmtree(tmp, ignore_errors=True)
            raise OutputError(f"cannot rename {tmp} to {out}: {why}; nothing was written; choose "
                              "another --out") from None
        try:
            os.replace(old, out)
        except OSError:
            raise OutputError(f"cannot rename {tmp} to {out}: {why}, nor the previous export {old} "
                              f"back: the new export is in {tmp}, the previous one in {old}; move "
                              f"one of them to {out} by hand") from None
        raise OutputError(f"cannot rename {tmp} to {out}: {why}; the previous export is back in "
                          f"{out}, the new one left in {tmp}") from None
    if replaces:
        try:
            shutil.rmtree(old)
        except OSError as e:  # the export is done: what is left is a hidden copy of the old one
            print(f"[lenext.convert] warning: could not delete the previous export, moved to {old} "
                  f"({e.strerror or e}); delete it by hand", file=sys.stderr)


def _write_failure(e: BaseException) -> str:
    """Why a library's writer did not get its bytes to disk ('' for any other error): an OSError;
    safetensors' SafetensorError on an I/O error ("... No space left on device (os error 28)");
    torch.save's zip writer on a short write (RuntimeError "... unexpected pos 3520 vs 3414": the
    disk filled mid-file, without an errno). Seen on a full tmpfs (tests/e2e/test_safety_cli.py)."""
    if isinstance(e, OSError):
        return f"{e.strerror or e} ({e.filename})" if e.filename else str(e.strerror or e)
    text = str(e)
    if isinstance(e, Exception) and any(s in text for s in ("os error", "unexpected pos",
                                                            "file write failed")):
        if "unexpected pos" in text:
            return "torch.save wrote fewer bytes than it meant to (a short write: is the disk full?)"
        return text.splitlines()[0][:200]
    return ""


def _free(path: Path) -> str:
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.1f} MiB"
    except OSError:
        return "unknown"
