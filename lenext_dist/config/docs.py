"""The configuration reference (docs/configuration.md), generated from schema.py, attention.py,
stages.py and blend.py (field docstrings and defaults).

    python -m lenext_dist.config.docs                  # print the markdown
    python -m lenext_dist.config.docs --write [PAGE]   # replace the block between the markers in
                                                       # PAGE (default docs/configuration.md, from
                                                       # the root of a checkout)

A unit test fails when the page's block differs from what this prints, so the reference cannot
drift from the code.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import typing
from pathlib import Path

from . import schema

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
PAGE = Path("docs") / "configuration.md"
"""The manual page that holds the generated table between START and END, relative to the root of
a checkout (the package holds no path into one)."""


def _field_docs(cls) -> dict[str, str]:
    """Field name -> the string literal right under it in the class body."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _type(tp) -> str:
    s = str(tp).replace("typing.", "")
    for module in ("schema", "attention", "stages", "blend"):
        s = s.replace(f"lenext_dist.config.{module}.", "")
    return getattr(tp, "__name__", s) if typing.get_origin(tp) is None else s


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return "null" if f.default is None else repr(f.default).replace("'", "")
    if f.default_factory is not dataclasses.MISSING and f.default_factory is list:
        return "[]"
    return ""


def _rows(cls, prefix: str, out: list[str]) -> None:
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = prefix + f.name
        if dataclasses.is_dataclass(tp):
            _rows(tp, key + ".", out)
            continue
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        out.append(f"| `{key}` | {_type(tp)} | {_default(f)} | {docs.get(f.name, '')} |")
        if item is not None and dataclasses.is_dataclass(item):
            _rows(item, key + "[].", out)


def reference() -> str:
    lines = [START, "| key | type | default | meaning |", "|---|---|---|---|"]
    _rows(schema.RunConfig, "", lines)
    lines.append(END)
    return "\n".join(lines)


def readme_block(readme: Path) -> str:
    text = readme.read_text()
    return text[text.index(START): text.index(END) + len(END)]


def write(page: Path) -> None:
    """Replace the block between START and END in `page` by `reference()`."""
    text = page.read_text()
    page.write_text(text.replace(readme_block(page), reference()))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--write" in argv:
        rest = argv[argv.index("--write") + 1:]
        write(Path(rest[0]) if rest else PAGE)
    else:
        print(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
