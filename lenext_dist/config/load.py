"""YAML -> RunConfig, strictly.

A config file is a YAML mapping that mirrors `RunConfig`. It may start with
`include: [path, ...]` (relative to the file): those files are merged first, in order, and the
including file's keys win. Dotted CLI overrides (`optim.lr=3e-4`, `--train.steps 10`) are applied
last. Every key is checked against the dataclasses: an unknown key, a wrong type or a failed
validation raises ConfigError naming the key and the file it came from. Includes nest at most
MAX_INCLUDE_DEPTH deep and read at most MAX_INCLUDES files; a document nests at most MAX_NESTING deep.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from lenext_dist.atomic import atomic_write

from .schema import ConfigError, RunConfig

_MISSING = object()
MAX_CONFIG_BYTES = 1 << 20
"""A config file is a few kB; anything near this is not one."""
MAX_EXPANDED_NODES = 100_000
"""Nodes of a YAML document with every alias expanded (the walks below see that many): an
890-byte nest of anchors ("billion laughs") expands to billions and would fill memory."""
MAX_NESTING = 100
"""Depth of nested mappings/lists in a document: a config is a few levels deep, and the walks
below recurse (`[[[...]]]` 50,000 deep would end in a RecursionError)."""
MAX_INCLUDE_DEPTH = 16
"""Includes within includes."""
MAX_INCLUDES = 256
"""Files read for one config, every include counted (a file including the next twice, 25 deep,
would read 2^24 files)."""


def _expanded_size(node, memo: dict, busy: set) -> int:
    """Nodes of `node` with aliases expanded, memoized on the shared nodes (O(distinct nodes))."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in busy:  # `&a [*a]`: a node that contains itself never ends
        return MAX_EXPANDED_NODES + 1
    busy.add(key)
    if isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded_size(k, memo, busy) + _expanded_size(v, memo, busy) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_size(c, memo, busy) for c in node.value)
    else:
        n = 1
    busy.discard(key)
    memo[key] = n = min(n, MAX_EXPANDED_NODES + 1)
    return n


def _duplicate_key(node) -> yaml.Node | None:
    """The first (in the text) key node repeating an earlier key of its mapping: PyYAML keeps the
    last silently, so a second `train:` section would drop the first. `<<` merge keys are not keys."""
    dups, seen, todo = [], set(), [node]
    while todo:
        n = todo.pop()
        if id(n) in seen:  # an alias: its node is walked once
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            keys = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if (k.tag, k.value) in keys:
                        dups.append(k)
                    keys.add((k.tag, k.value))
                todo += [k, v]
        elif isinstance(n, yaml.SequenceNode):
            todo += n.value
    return min(dups, key=lambda k: k.start_mark.index, default=None)


def safe_yaml(text: str, where: str) -> Any:
    """yaml.safe_load, refusing documents over MAX_CONFIG_BYTES or whose aliases expand past
    MAX_EXPANDED_NODES, before anything walks them, and mappings that repeat a key."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: {len(text):,} bytes, over the {MAX_CONFIG_BYTES:,}-byte limit "
                          "for a config (is this a config file?)")
    try:
        depth = 0  # the parser is iterative; the composer (and our walks) recurse: check first
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    raise ConfigError(f"{where}: mappings/lists nested more than {MAX_NESTING} deep "
                                      f"(line {event.start_mark.line + 1}); a config is a few levels deep")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_size(node, {}, set()) > MAX_EXPANDED_NODES:
            raise ConfigError(f"{where}: its anchors and aliases (&name / *name) expand to more than "
                              f"{MAX_EXPANDED_NODES:,} values (a YAML alias bomb?); write the values out")
        dup = None if node is None else _duplicate_key(node)
        if dup is not None:
            raise ConfigError(f"{where}: line {dup.start_mark.line + 1}: key {dup.value!r} given twice in one "
                              "mapping (the first would be dropped); merge them into one")
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(e)}") from None


def _yaml_problem(e: Exception) -> str:
    """PyYAML's several-line message (context, caret drawings) as one line: line:column: problem."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or not problem:
        return " ".join(str(e).split())
    context = getattr(e, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")


def _read_yaml(path: Path, stack: tuple[Path, ...] = (), reads: list | None = None) -> tuple[dict, dict]:
    """Return (merged mapping, origin map dotted-key -> file) with includes resolved; `reads`
    counts the files read so far for this config (MAX_INCLUDES)."""
    path = path.resolve()
    reads = [0] if reads is None else reads
    if path in stack:
        raise ConfigError(f"{path}: include cycle: {' -> '.join(map(str, stack + (path,)))}")
    if len(stack) > MAX_INCLUDE_DEPTH:
        raise ConfigError(f"{stack[-1]}: includes nested more than {MAX_INCLUDE_DEPTH} deep "
                          f"(from {stack[0]}); flatten them")
    reads[0] += 1
    if reads[0] > MAX_INCLUDES:
        raise ConfigError(f"{stack[0] if stack else path}: more than {MAX_INCLUDES} config files read "
                          f"through its includes (at {path}; files including each other repeatedly?)")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {path.stat().st_size:,} bytes, over the {MAX_CONFIG_BYTES:,}-byte "
                          "limit for a config (is this a config file?)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as text ({e})") from None
    data = safe_yaml(text, str(path))
    if data is None:  # an empty file (or only comments) is not "the defaults": a wrong file?
        raise ConfigError(f"{path}: empty; a config is a YAML mapping of sections (e.g. `train: {{steps: 100}}`)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__} "
                          f"{data!r:.40}")
    merged: dict = {}
    origin: dict = {}
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: include: expected a file name or a list of file names, "
                          f"got {includes!r}")
    for inc in includes:
        sub, sub_origin = _read_yaml(path.parent / inc, stack + (path,), reads)
        deep_merge(merged, sub)
        origin.update(sub_origin)
    deep_merge(merged, data)
    origin.update({k: str(path) for k in _dotted_keys(data)})
    return merged, origin


def deep_merge(dst: dict, src: dict) -> dict:
    """Merge mapping `src` into `dst` in place (nested mappings merge, everything else replaces)."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def _dotted_keys(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        yield key
        if isinstance(v, dict):
            yield from _dotted_keys(v, key + ".")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, key: str) -> Any:
    """Check `value` against annotation `tp`, building nested dataclasses. Ints widen to float."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, key + ".")
    if tp is float:
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads `3e-4` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # an int of 400 digits: refused with the other infinities (_build)
            return math.inf
    if tp in (int, bool, str):
        if type(value) is not tp:
            raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r} ({type(value).__name__})")
        return value
    raise ConfigError(f"{key}: unsupported annotation {tp}")


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else f" (known: {', '.join(names)})"
            raise ConfigError(f"{prefix}{k}: unknown key{hint}")
        kwargs[k] = _coerce(v, hints[k], prefix + k)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:  # else the dataclass raises a TypeError that names neither the section nor the file
        raise ConfigError(f"{prefix}{missing[0]}: required key missing")
    try:
        obj = cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(str(e)) from None
    # every float of the config, in one place: no key has a use for NaN or inf (.nan, `inf`,
    # 1e999), which pass `> 0` checks and surface as a diverged run (after the section's own
    # checks, whose messages say more where they have one)
    for k, v in kwargs.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{prefix}{k}: must be a finite number, got {v}")
    return obj


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", value parsed as YAML, so 3e-4, true, null and [1, 2] work)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    value = safe_yaml(raw, f"override {key}") if raw.strip() else ""
    return key, value


def apply_override(data: dict, key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {key}: {p} is not a section")
        node = nxt
    node[parts[-1]] = value


def _migrate(data: dict) -> dict:
    """Keys of earlier versions, rewritten to today's (the config.yaml of older checkpoints):
    attention.log_scale_a A -> attention.temperature {kind: log_fit, a: A, layers: all}."""
    attn = data.get("attention")
    if isinstance(attn, dict) and "log_scale_a" in attn:
        a = attn.pop("log_scale_a")
        if a is not None:
            if attn.get("temperature"):
                raise ConfigError("attention.log_scale_a: give attention.temperature only")
            attn["temperature"] = {"kind": "log_fit", "a": a, "layers": "all"}
    return data


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Load a YAML config (or the defaults when path is None) and apply dotted overrides."""
    if path is not None and not str(path).strip():  # `--config ""` (an unset shell variable)
        raise ConfigError("--config '': no file named; give a YAML config, or leave --config out "
                          "for the built-in defaults")
    data, origin = _read_yaml(Path(path)) if path is not None else ({}, {})
    for text in overrides:
        key, value = parse_override(text)
        apply_override(data, key, value)
        origin[key] = "command line"
    try:
        return _build(RunConfig, _migrate(data))
    except ConfigError as e:
        key = str(e).split(":", 1)[0].split("[")[0]
        where = origin.get(key) or _nearest_origin(key, origin) or (str(path) if path is not None else "defaults")
        if where != "command line" and overrides:
            # a check across keys (e.g. a batch size against another) may fail through an
            # override of another key than the one named: the file alone is not to blame
            where += f" with the command line's {', '.join(map(str, overrides))}"
        raise ConfigError(f"{where}: {e}") from None


def _nearest_origin(key: str, origin: dict) -> str | None:
    while "." in key:
        key = key.rsplit(".", 1)[0]
        if key in origin:
            return origin[key]
    return None


def split_cli_overrides(argv: list[str]) -> list[str]:
    """Turn `--a.b=1`, `--a.b 1` and `a.b=1` tokens of a command line into `a.b=1` strings; a key
    given twice is refused (on a command line the last would silently win: a typo'd rerun, or a
    script's value and a user's). Code that composes overrides for load_config may override its
    own: load_config applies them in order."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--") and "=" not in tok and i + 1 < len(argv):
            out.append(f"{tok[2:]}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok[2:] if tok.startswith("--") else tok)
        i += 1
    given: dict[str, str] = {}
    for text in out:
        key = text.split("=", 1)[0].strip()
        if key in given:
            raise ConfigError(f"command line: {key} given twice ({given[key]!r}, then {text!r}); "
                              "give it once")
        given[key] = text
    return out


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again by load_config)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
