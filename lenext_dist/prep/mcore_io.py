"""megatron-core's own .bin/.idx writer, without importing the `megatron.core` package.

`import megatron.core.datasets.indexed_dataset` runs `megatron/core/__init__.py` (the model
stack, torch.compile set-up, Transformer Engine probes) and imports torch: 5-10 s of a
data-prep run whose tokenizing takes seconds. The writer itself (`IndexedDatasetBuilder`,
`_IndexWriter`, `_IndexReader` for `add_index`, `DType`) needs only numpy and the standard
library, so we execute exactly those definitions from megatron's installed source file
(not a copy: the bytes on disk are megatron's, whatever its version) and skip the rest:
the torch-based `IndexedDataset` reader, the S3/MSC readers and the package __init__.

If megatron is already imported in this process (training, tests), its module is used as is.
`_LOAD` failing on a future megatron whose file no longer defines these names falls back to
the normal import (slow, still correct).
"""

from __future__ import annotations

import __future__
import ast
import importlib.util
import logging
import os
import sys
import types

import numpy as np

# megatron's .idx (megatron/core/datasets/indexed_dataset.py): 9-byte magic, version <Q, dtype
# code <B, sequence count S <Q, document count D <Q, then int32 lengths [S], int64 byte pointers
# [S], int64 document indices [D]; dtype codes -> dtypes. Read here without megatron (training's
# shard checks, the merge's streaming concatenation).
IDX_MAGIC, IDX_HEAD = b"MMIDIDX\x00\x00", 34
IDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
              7: np.float32, 8: np.uint16}

_FULL = "megatron.core.datasets.indexed_dataset"
_NAMES = {"_INDEX_HEADER", "logger", "DType", "_IndexWriter", "_IndexReader",
          "IndexedDatasetBuilder", "get_idx_path", "get_bin_path"}
_MODULE = None


def _source_path() -> str:
    spec = importlib.util.find_spec("megatron")  # finds the package; does not execute it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("megatron-core is not installed")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "core", "datasets", "indexed_dataset.py")
        if os.path.isfile(path):
            return path
    raise ImportError("megatron/core/datasets/indexed_dataset.py not found")


def _load_file(path: str, name: str) -> types.ModuleType:
    # A standalone module from one file, not registered under megatron's package name.
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _log_single_rank(logger, level, msg, *args, **kwargs):
    # megatron.core.utils.log_single_rank logs on rank 0 only; data prep is not distributed.
    logger.log(level, msg, *args, **kwargs)


def _light() -> types.ModuleType:
    path = _source_path()
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    body = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if all(m and m.split(".")[0] not in ("megatron", "torch") for m in mods):
                body.append(node)  # stdlib and numpy imports
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in _NAMES:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in _NAMES for t in node.targets):
            body.append(node)
    found = {getattr(n, "name", None) or n.targets[0].id for n in body
             if not isinstance(n, (ast.Import, ast.ImportFrom))}
    if found != _NAMES:
        raise ImportError(f"{path} lacks {sorted(_NAMES - found)}")
    msc = _load_file(os.path.join(os.path.dirname(os.path.dirname(path)), "msc_utils.py"),
                     "lenext_dist.prep._mcore_msc_utils")
    mod = types.ModuleType("lenext_dist.prep._mcore_indexed_dataset")
    mod.__file__ = path
    mod.__dict__.update(MultiStorageClientFeature=msc.MultiStorageClientFeature,
                        log_single_rank=_log_single_rank)
    # Postponed annotations: signatures mention torch.Tensor, which is never imported here.
    code = compile(ast.Module(body=body, type_ignores=[]), path, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, mod.__dict__)
    mod.logger = logging.getLogger(_FULL)
    return mod


def indexed_dataset() -> types.ModuleType:
    """megatron's indexed_dataset module, or its writer half loaded without torch."""
    global _MODULE
    if _FULL in sys.modules:
        return sys.modules[_FULL]
    if _MODULE is None:
        try:
            _MODULE = _light()
        except (ImportError, OSError, SyntaxError, NameError):
            import megatron.core.datasets.indexed_dataset as full

            _MODULE = full
    return _MODULE
