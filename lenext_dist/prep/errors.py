"""Error types and skip reasons shared by every stage of data preparation.

Bad input is never dropped silently: a reader reports every bad document as a
`Bad` record with a reason from `BAD_REASONS`; the worker either stops with a
`PrepError` (the default) or, under `--skip-bad`, counts it in the manifest.
"""

from __future__ import annotations

from typing import NamedTuple

from lenext_dist.errors import UserError

# Reasons a document (or a whole file) is bad. Keys appear verbatim in the manifest.
BAD_REASONS = {
    "bad_json": "a line is not valid JSON (or not a JSON object)",
    "too_deep": "a line's JSON is nested deeper than the parser can follow",
    "missing_text": "the text field is missing or null",
    "text_not_string": "the text field is not a string",
    "invalid_utf8": "the bytes are not valid UTF-8 (or the text holds lone surrogates)",
    "truncated_stream": "the .zst stream ends in the middle of a frame (file cut short?)",
    "corrupt_stream": "the .zst stream or a parquet page cannot be decompressed/decoded",
    "missing_column": "the parquet file has no such column",
    "column_not_string": "the parquet column is not a string/binary column",
    "missing_set_name": "meta.redpajama_set_name is missing but a set filter was given",
}

# Reasons that are not errors: counted as skipped, never fatal.
EMPTY = "empty"  # no non-whitespace character: carries no tokens worth training on
EXCLUDED_SET = "excluded_set"  # dropped on purpose by --exclude-sets / --include-sets
SHORT = "short"  # fewer tokens than --min-tokens: dropped on purpose (a long-document shard)
NOT_ERRORS = frozenset({EMPTY, EXCLUDED_SET, SHORT})

SKIP_BAD_HINT = "rerun with --skip-bad to skip and count such documents in the manifest"


class PrepError(UserError, RuntimeError):
    """A user-facing error: the message says what is wrong, where, and what to do."""


class Bad(NamedTuple):
    """A bad document (or file) found by a reader.

    `where` is "path:line N" / "path:row N" / "path"; `docs` is how many documents
    the problem covers when it is known (a parquet file without its column covers all
    its rows), else 1.
    """

    reason: str
    where: str
    detail: str
    docs: int = 1

    def error(self) -> PrepError:
        what = BAD_REASONS.get(self.reason, self.reason)
        detail = " ".join(str(self.detail).split())  # one line: a parser's message may hold several
        return PrepError(f"{self.where}: {what} [{self.reason}]: {detail}; fix the input, or "
                         f"{SKIP_BAD_HINT}")
