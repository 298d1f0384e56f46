"""The config's error type and its one-line check (every section's validation uses them)."""
from __future__ import annotations

from lenext_dist.errors import UserError


class ConfigError(UserError, ValueError):
    """A config value is wrong. The message names the key (and the file, when loaded from YAML)."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")
