"""Reading attention options duck-typed: the `AttentionConfig` of lenext_dist.config, a
SimpleNamespace, or the plain dicts of an exported config.json (this package imports nothing from
config, so it can be copied next to an exported HF modeling file)."""
from __future__ import annotations


def cfg_get(cfg, *path: str, default=None):
    """cfg.a.b (attributes or dict keys: a dataclass, a SimpleNamespace or the plain dicts of an
    exported config.json all work); `default` when a level is missing or the value is None."""
    for key in path:
        if cfg is None:
            return default
        cfg = cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)
    return default if cfg is None else cfg
