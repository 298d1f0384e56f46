"""Streaming readers for the corpus layouts data prep accepts.

Formats (`--format`):
  slimpajama  SlimPajama's `chunk*/*.jsonl.zst`: one JSON object per line with `text`
              and `meta.redpajama_set_name` (used by --include-sets/--exclude-sets).
  jsonl       plain `.jsonl` or `.jsonl.zst`, one JSON object per line, text in --text-key.
  starcoder   Starcoderdata's `<language>/*.parquet` with a `content` column; the language
              is the parent directory's name (used by --languages).
  txt         `.txt` files, one document per file (read whole: a file is one document).
  tasks       generated task documents over the real text of any of the above files
              (task_source.py: the text is filler, the documents come from --tasks).

Memory stays flat however large a file is: `.zst` is decompressed chunk by chunk
(zstandard's decompressobj, which unlike stream_reader lets us notice a stream that ends
mid-frame), JSON lines are read one at a time, parquet is read batch by batch.

Every reader yields `Doc` for a good document and `errors.Bad` for a bad one, in file
order; the caller decides whether a Bad is fatal. Readers also expose `bytes_done`
(bytes of the input file consumed so far) for the progress bar.
"""

from __future__ import annotations

import glob
import io
import json
import os
from typing import Iterator, NamedTuple, Optional, Sequence, Union

from .errors import Bad, PrepError

FORMATS = ("slimpajama", "jsonl", "starcoder", "txt", "tasks")
_EXTENSIONS = {
    "slimpajama": (".jsonl.zst", ".jsonl"),
    "jsonl": (".jsonl.zst", ".jsonl"),
    "starcoder": (".parquet",),
    "txt": (".txt",),
    "tasks": (".jsonl.zst", ".jsonl", ".parquet", ".txt"),
}
DEFAULT_TEXT_KEY = {"slimpajama": "text", "jsonl": "text", "starcoder": "content", "txt": None,
                    "tasks": None}  # tasks: by extension, as the source format reads it
_READ_CHUNK = 1 << 20  # compressed bytes per read: big enough to amortize calls, small for memory
_PARQUET_BATCH_ROWS = 512


class Doc(NamedTuple):
    text: str
    set_name: Optional[str]
    answers: tuple = ()
    """(start, length) token spans of a generated task document's answers (task_source.py); the
    worker writes them as the shard's answer mask (manifest.answers_prefix)."""


Record = Union[Doc, Bad]


# ----------------------------------------------------------------------------- discovery
def discover_inputs(
    patterns: Sequence[str], fmt: str, languages: Optional[Sequence[str]] = None
) -> list[str]:
    """Expand globs/directories/files into a sorted, de-duplicated list of absolute paths.

    Sorted order is the order of documents in the merged output, so it must not depend on
    the file system's listing order or on how the list is split across workers. Symlinked
    files and directories are followed (each directory once, so a link cycle ends), and a
    file reached by several paths is read once, under its first path in sorted order.
    """
    if fmt not in FORMATS:
        raise PrepError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    exts = _EXTENSIONS[fmt]
    found: set[str] = set()
    for pat in patterns:
        if os.path.isdir(pat):
            matches = _walk(pat, exts)
        else:
            matches = [m for m in glob.glob(pat, recursive=True) if os.path.isfile(m)]
        if not matches:
            raise PrepError(
                f"--input {pat!r} matches no {'/'.join(exts)} file. Check the path "
                "(quote globs so the shell does not expand them) and --format."
            )
        found.update(os.path.abspath(m) for m in matches)
    real: dict = {}
    for p in sorted(found):
        real.setdefault(os.path.realpath(p), p)
    paths = sorted(real.values())
    bad_ext = [p for p in paths if not p.endswith(exts)]
    if bad_ext:
        raise PrepError(
            f"--format {fmt} reads {'/'.join(exts)} files, but the inputs include "
            f"{bad_ext[0]!r}" + (f" and {len(bad_ext) - 1} more" if len(bad_ext) > 1 else "")
        )
    if languages:
        if fmt != "starcoder":
            raise PrepError("--languages only applies to --format starcoder")
        wanted = {lang.strip().lower() for lang in languages if lang.strip()}
        paths = [p for p in paths if starcoder_language(p) in wanted]
        if not paths:
            raise PrepError(f"no input file is under a language directory in {sorted(wanted)}")
    return paths


def _walk(top: str, exts: tuple) -> list[str]:
    seen: set = set()
    out = []
    for root, dirs, files in os.walk(top, followlinks=True):
        if os.path.realpath(root) in seen:
            dirs[:] = []  # reached again through a link: already listed (or a cycle)
            continue
        seen.add(os.path.realpath(root))
        dirs.sort()
        out.extend(os.path.join(root, f) for f in files
                   if f.endswith(exts) and os.path.isfile(os.path.join(root, f)))
    return out


def starcoder_language(path: str) -> str:
    """Starcoderdata keeps one directory per language: `<language>/train-*.parquet`."""
    return os.path.basename(os.path.dirname(path)).lower()


# ----------------------------------------------------------------------------- zstd
class _ZstdRaw(io.RawIOBase):
    """Decompressed bytes of a (multi-frame) .zst file, raising on a cut-short stream."""

    def __init__(self, fileobj, path: str):
        import zstandard

        self._f = fileobj
        self._path = path
        self._dctx = zstandard.ZstdDecompressor()
        self._dobj = self._dctx.decompressobj()
        self._in_frame = False
        self._buf = b""
        self._pos = 0
        self._zstd_error = zstandard.ZstdError

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._pos >= len(self._buf):
            raw = self._f.read(_READ_CHUNK)
            if not raw:
                if self._in_frame:
                    raise _StreamError("truncated_stream", "the compressed data ends mid-frame")
                return 0
            self._buf, self._pos = self._feed(raw), 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def _feed(self, raw: bytes) -> bytes:
        out = []
        try:
            while raw:
                self._in_frame = True
                out.append(self._dobj.decompress(raw))
                if not self._dobj.eof:
                    break
                # A frame ended; any remaining bytes start the next frame.
                self._in_frame = False
                raw = self._dobj.unused_data
                self._dobj = self._dctx.decompressobj()
        except self._zstd_error as e:
            raise _StreamError("corrupt_stream", str(e)) from None
        return b"".join(out)


class _StreamError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# ----------------------------------------------------------------------------- readers
class JsonlReader:
    """`.jsonl` / `.jsonl.zst`: one JSON object per line, text under `text_key`.

    `start`/`end` (plain .jsonl only) select the lines that start in that byte range (see
    units.py); line numbers in messages are still counted from the top of the file.
    """

    def __init__(self, path: str, text_key: str = "text", want_set_name: bool = False,
                 start: int = 0, end: Optional[int] = None):
        self.path = path
        self.text_key = text_key
        self.want_set_name = want_set_name
        self.start, self.end = start, end
        self.bytes_done = 0
        self._first_line = None  # line number of the unit's first line, counted on demand

    def __iter__(self) -> Iterator[Record]:
        with open(self.path, "rb") as raw:
            stream = (
                io.BufferedReader(_ZstdRaw(raw, self.path), buffer_size=_READ_CHUNK)
                if self.path.endswith(".zst")
                else raw
            )
            pos = self.start
            if pos > 0:  # the line we land in belongs to the previous unit
                pos = self._next_line_start(raw)
                if pos is None:  # no line starts in this range (one long line spans it)
                    self.bytes_done = self.end - self.start
                    return
                raw.seek(pos)
            lineno = 0
            try:
                for lineno, line in enumerate(stream, 1):
                    if self.end is not None:
                        if pos >= self.end:
                            break
                        pos += len(line)
                    self.bytes_done = raw.tell() - self.start
                    if line.isspace():  # a blank line (JSON Lines writers end files with one): no record
                        continue
                    yield self._parse(line, lineno)
            except _StreamError as e:
                yield Bad(
                    e.reason,
                    self.path,
                    f"{e.detail} after {lineno} complete lines; the rest of the file is lost",
                )
            self.bytes_done = (self.end or raw.tell()) - self.start

    def _next_line_start(self, raw) -> Optional[int]:
        """The first line start in [start, end), found by chunks (a huge line is never read
        whole), or None."""
        p = self.start - 1
        raw.seek(p)
        while p < self.end - 1:
            b = raw.read(min(_READ_CHUNK, self.end - 1 - p))
            if not b:
                return None
            i = b.find(b"\n")
            if i >= 0:
                return p + i + 1
            p += len(b)
        return None

    def _where(self, lineno: int) -> str:
        if self.start and self._first_line is None:
            # Only on a bad line: count the newlines before this unit (memchr speed).
            n, left = 0, self.start
            with open(self.path, "rb") as f:
                while left > 0:
                    b = f.read(min(left, 1 << 24))
                    n, left = n + b.count(b"\n"), left - len(b)
                if self.start and f.seek(self.start - 1) >= 0 and f.read(1) != b"\n":
                    n += 1  # the unit starts after the line it landed in
            self._first_line = n
        return f"{self.path}:line {(self._first_line or 0) + lineno}"

    def _parse(self, line: bytes, lineno: int) -> Record:
        try:
            s = line.decode("utf-8")
        except UnicodeDecodeError as e:
            return Bad("invalid_utf8", self._where(lineno), str(e))
        try:
            obj = json.loads(s)
        except ValueError as e:
            return Bad("bad_json", self._where(lineno), f"{e}: {s[:80]!r}")
        except RecursionError:  # valid JSON nested deeper than Python's parser follows
            return Bad("too_deep", self._where(lineno), f"nested too deeply: {s[:40]!r}...")
        if not isinstance(obj, dict):
            return Bad("bad_json", self._where(lineno), f"expected a JSON object, got {type(obj).__name__}")
        text = obj.get(self.text_key)
        if text is None:
            return Bad("missing_text", self._where(lineno), f"no {self.text_key!r} field (keys: {list(obj)[:8]})")
        if not isinstance(text, str):
            return Bad("text_not_string", self._where(lineno), f"{self.text_key!r} is a {type(text).__name__}")
        # JSON escapes can smuggle lone surrogates (\ud800) that have no UTF-8 form and would
        # make the tokenizer fail later; only escaped text can hold them, so check only then.
        if "\\ud" in s or "\\uD" in s:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                return Bad("invalid_utf8", self._where(lineno), f"lone surrogate in JSON escape: {e}")
        set_name = None
        if self.want_set_name:
            meta = obj.get("meta")
            set_name = meta.get("redpajama_set_name") if isinstance(meta, dict) else None
            if not isinstance(set_name, str):  # a list or a number names no set: missing_set_name
                set_name = None
        return Doc(text, set_name)


class ParquetReader:
    """Parquet read by batches of rows; text in `column` (Starcoderdata: `content`).

    `row_groups` = [first, stop) reads only those row groups (one unit of work, units.py);
    rows in messages are counted from the top of the file.
    """

    def __init__(self, path: str, column: str = "content", row_groups: Optional[list] = None):
        self.path = path
        self.column = column
        self.row_groups = row_groups
        self.bytes_done = 0

    def __iter__(self) -> Iterator[Record]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        size = os.path.getsize(self.path)
        try:
            pf = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            yield Bad("corrupt_stream", self.path, f"cannot open as parquet: {e}")
            return
        md = pf.metadata
        groups = list(range(*self.row_groups)) if self.row_groups else list(range(md.num_row_groups))
        # the bytes progress counts for this unit: the plan's share of the file (units.py)
        size = size // md.num_row_groups * len(groups) if self.row_groups else size
        first_row = sum(md.row_group(g).num_rows for g in range(groups[0])) if groups else 0
        nrows = sum(md.row_group(g).num_rows for g in groups)
        schema = pf.schema_arrow
        if schema.get_field_index(self.column) < 0:
            yield Bad(
                "missing_column",
                self.path,
                f"no column {self.column!r} (columns: {schema.names}); all {nrows} rows skipped",
                docs=max(nrows, 1),
            )
            self.bytes_done = size
            return
        ftype = schema.field(self.column).type
        if pa.types.is_string(ftype) or pa.types.is_binary(ftype):
            as_bytes = pa.binary()
        elif pa.types.is_large_string(ftype) or pa.types.is_large_binary(ftype):
            as_bytes = pa.large_binary()
        else:
            yield Bad("column_not_string", self.path, f"column {self.column!r} is {ftype}",
                      docs=max(nrows, 1))
            self.bytes_done = size
            return
        row = 0  # rows of this unit consumed
        batches = pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[self.column],
                                  row_groups=groups)
        while True:
            try:
                batch = next(batches, None)
                values = None if batch is None else batch.column(0).cast(as_bytes).to_pylist()
            except (pa.ArrowException, OSError) as e:  # a corrupt page: the rest is lost
                yield Bad("corrupt_stream", f"{self.path}:row {first_row + row}",
                          f"{e}; rows {first_row + row}..{first_row + nrows - 1} not readable",
                          docs=max(nrows - row, 1))
                break
            if values is None:
                break
            # Read as bytes and decode here, so invalid UTF-8 is reported with its row.
            for value in values:
                where = f"{self.path}:row {first_row + row}"
                row += 1
                if value is None:
                    yield Bad("missing_text", where, f"{self.column!r} is null")
                    continue
                try:
                    yield Doc(value.decode("utf-8"), None)
                except UnicodeDecodeError as e:
                    yield Bad("invalid_utf8", where, str(e))
            self.bytes_done = size * row // max(nrows, 1)
        self.bytes_done = size


class TxtReader:
    """A `.txt` file is one document."""

    def __init__(self, path: str):
        self.path = path
        self.bytes_done = 0

    def __iter__(self) -> Iterator[Record]:
        with open(self.path, "rb") as f:
            data = f.read()
        self.bytes_done = len(data)
        try:
            yield Doc(data.decode("utf-8"), None)
        except UnicodeDecodeError as e:
            yield Bad("invalid_utf8", self.path, str(e))


def open_reader(path: str, fmt: str, text_key: Optional[str] = None, **unit):
    """The reader for one input file of format `fmt`; `unit` = a unit's reader arguments
    (start/end for .jsonl, row_groups for parquet; units.py). `--format tasks` generates
    documents over a file instead: task_source.TaskReader, chosen by the worker."""
    key = text_key or DEFAULT_TEXT_KEY[fmt]
    if fmt == "slimpajama":
        return JsonlReader(path, key, want_set_name=True, **unit)
    if fmt == "jsonl":
        return JsonlReader(path, key, **unit)
    if fmt == "starcoder":
        return ParquetReader(path, key, **unit)
    if fmt == "txt":
        return TxtReader(path)
    raise PrepError(f"unknown format {fmt!r}")
