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

Also the one home of what every command's flags share: the number checks (int_, float_, pos_int,
..., port_number) and `Parser`, the parser class of every command (one-line errors, no flag
given twice).
"""
from __future__ import annotations

import argparse
import math
import sys
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


class Parser(argparse.ArgumentParser):
    """The parser of every lenext command: a user's mistake is one line, and a flag is given once.

    argparse prints its usage block (8-20 lines here) before the error line, which hides the one
    line that says what to mend; and a flag given twice silently takes its last value (`--lengths
    256 ... --lengths 512` measured one length). Here the error is `prog: error: message (see prog
    --help)` and a repeated flag is refused. Flags that collect (append, count, extend) may repeat.
    Subparsers inherit the class (argparse's add_subparsers defaults parser_class to type(self))."""

    _COLLECTS = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction,
                 argparse._HelpAction, argparse._VersionAction)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        self._refuse_repeats(args)
        return super().parse_known_args(args, namespace)

    def _action_of(self, token: str):
        """The action a command-line token names (exact, or a unique prefix as argparse allows),
        or None."""
        opt = token.split("=", 1)[0]
        acts = self._option_string_actions
        if opt in acts:
            return acts[opt]
        found = {id(a): a for o, a in acts.items() if o.startswith("--") and o.startswith(opt)}
        return next(iter(found.values())) if opt.startswith("--") and len(found) == 1 else None

    def _refuse_repeats(self, args: Sequence[str]) -> None:
        commands = set()
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction):
                commands |= set(a.choices)
        seen: dict[int, str] = {}
        for token in args:
            if token == "--" or token in commands:  # the rest is the subcommand's (or positional)
                return
            if not token.startswith(tuple(self.prefix_chars)) or len(token) < 2:
                continue
            action = self._action_of(token)
            if action is None or isinstance(action, self._COLLECTS):
                continue
            opt = token.split("=", 1)[0]
            if id(action) in seen:
                first = seen[id(action)]
                what = opt if first == opt else f"{first} and {opt}"
                self.error(f"argument {what}: given twice (the last would silently win); "
                           "give it once")
            seen[id(action)] = opt


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
