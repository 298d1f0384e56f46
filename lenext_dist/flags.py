"""Options declared once: a dataclass field that carries its command-line flag.

`lenext extend` and `lenext eval` keep their options as fields of a dataclass (extend/workflow.py,
eval/jobs.py), which callers also build in code. Each field made by `option` holds what its flag
needs (help, check, default, choices, flag name, argument group); `add_flags` writes the argparse
arguments from the fields, `from_args` builds the object back from the parsed flags and
`check_fields` runs the same checks on a value given in code. So the parser and the class cannot
drift apart: there is nothing to keep equal by hand.

A check is an argparse `type=` (a value or its string -> the value, or ArgumentTypeError), so a
bad flag exits 2 with argparse's "argument --flag: ..." and a bad value in code gets that text;
a required option left unset in code gets argparse's "the following arguments are required: ...".
"""
from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, Field, field, fields
from numbers import Integral, Real
from typing import Any, Callable, Optional, Sequence

_KEY = "flag"


def choice(options: Sequence[str]) -> Callable[[str], str]:
    """The check of a flag with `choices`, in argparse's words."""
    def check(s) -> str:
        if s not in options:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {s!r} (choose from {', '.join(map(repr, options))})")
        return s
    return check


# ----- numbers: finite (nan passes every range check unnoticed; inf overflows int())
def int_(s) -> int:
    if isinstance(s, Integral) and not isinstance(s, bool):
        return int(s)
    try:
        return int(s) if isinstance(s, str) else _bad()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None


def _bad():
    raise ValueError


def float_(s) -> float:
    try:
        if isinstance(s, bool):
            raise ValueError
        v = float(s) if isinstance(s, (str, Real)) else _bad()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be finite, got {s!r}")
    return v


def pos_int(s) -> int:
    v = int_(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def nonneg_int(s) -> int:
    v = int_(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def pos_float(s) -> float:
    v = float_(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v:g}")
    return v


PORTS = (1, 65535)
"""The TCP ports a rendezvous can listen on (0 would be 'any port': the ranks could not agree on it)."""


def port_number(s) -> int:
    """The check of a rendezvous port flag (`lenext train --port`, `lenext extend --port`), and of
    $MASTER_PORT (lenext_dist/cluster): an integer in PORTS, refused before any rank starts
    (torch's store would refuse it once per rank)."""
    lo, hi = PORTS
    try:
        v = int(s) if isinstance(s, (str, int)) and not isinstance(s, bool) else None
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"expected a port number {lo}-{hi}, got {s!r}")
    return v


def option(default: Any = MISSING, check: Optional[Callable] = None, help: Optional[str] = None, *,
           default_factory: Any = MISSING, flag: Optional[str] = None, required: bool = False,
           choices=None, group: Optional[str] = None, **argparse_kw) -> Any:
    """A dataclass field with a flag. `check`: its argparse type (with `choices`, argparse checks
    them and the field gets `choice`); `required`: the flag must be given (the field may still
    default to None: check_fields refuses it unset); `group`: the argument group's title (None:
    the parser's own options); `argparse_kw`: anything else add_argument takes (action, nargs,
    metavar; type=None when the check takes what nargs collects, not each item)."""
    check = choice(choices) if check is None and choices is not None else check
    spec = dict(check=check, help=help, flag=flag, required=required, choices=choices, group=group,
                kw=argparse_kw)
    return field(default=default, default_factory=default_factory, metadata={_KEY: spec})


def _spec(f: Field) -> Optional[dict]:
    return f.metadata.get(_KEY)


def flag_name(f: Field) -> str:
    return (_spec(f) or {}).get("flag") or "--" + f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, cls: type,
              groups: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One argument per option of `cls`, in field order; returns the argument groups by title
    (pass them back to add a second class's options to the same groups)."""
    groups = {} if groups is None else groups
    for f in fields(cls):
        spec = _spec(f)
        if spec is None:
            continue
        title = spec["group"]
        if title is not None and title not in groups:
            groups[title] = parser.add_argument_group(title)
        kw = dict(spec["kw"])
        if spec["required"]:
            kw["required"] = True
        elif f.default is not MISSING:
            kw["default"] = f.default
        elif f.default_factory is not MISSING:
            kw["default"] = f.default_factory()
        if spec["choices"] is not None:
            kw["choices"] = spec["choices"]
        elif spec["check"] is not None and "action" not in kw:
            kw.setdefault("type", spec["check"])
        if spec["help"] is not None:
            kw["help"] = spec["help"]
        (parser if title is None else groups[title]).add_argument(flag_name(f), dest=f.name, **kw)
    return groups


def from_args(cls: type, args: argparse.Namespace):
    """The object the parsed flags describe (argparse dests are its field names)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if f.init and hasattr(args, f.name)})


def _unset(v) -> bool:
    return v is None or isinstance(v, (str, list, tuple)) and len(v) == 0


def check_fields(obj, error: Callable[[str], Exception]) -> None:
    """Each option's check on its value, which the checked value replaces (None: unset, not
    checked); a bad one raises error("argument --flag: <what is wrong>"), required ones unset
    error("the following arguments are required: --a, --b")."""
    missing = [flag_name(f) for f in fields(obj) if (_spec(f) or {}).get("required") and _unset(getattr(obj, f.name))]
    if missing:
        raise error(f"the following arguments are required: {', '.join(missing)}")
    for f in fields(obj):
        check, v = (_spec(f) or {}).get("check"), getattr(obj, f.name)
        if check is None or v is None:
            continue
        try:
            setattr(obj, f.name, check(v))
        except argparse.ArgumentTypeError as e:
            raise error(f"argument {flag_name(f)}: {e}") from None
