"""megatron's sample-index cache (<data.cache_dir>/*.npy), guarded: files it loads are plain data,
loaded without pickle; files it saves appear whole; entries that could hang or redirect a read
(FIFOs, devices, links) are refused before megatron opens them. Used by data/gpt_data.py around
megatron's dataset build.
"""
from __future__ import annotations

import contextlib
import os
import stat
import types

import numpy as np
import numpy.lib.format as npformat

from lenext_dist.atomic import atomic_file
from lenext_dist.config import ConfigError

# megatron keeps its sample indices in <data.cache_dir>/*.npy: rank 0 builds and numpy.save's them,
# the other ranks numpy.load them (allow_pickle=True) after the builder's barrier. Two hazards:
# - a "cache" file that is a pickle would run its code when a copied or shared run folder is
#   resumed: every file megatron loads is checked to be plain data right before it is loaded,
#   and loaded with allow_pickle=False;
# - plain numpy.save is not atomic: a reader (another run sharing the cache, or a rank of this one
#   on a file system that shows a file before its bytes) could see half a file. Each save goes to
#   a temporary name and is renamed into place whole (lenext_dist.atomic), so a cache file that
#   exists is complete. No rank scans the folder ahead of megatron: while rank 0 writes, a scan by
#   another rank would read files in the making (the start-up race of issue 40).
_NPY_HEADERS = {(1, 0): npformat.read_array_header_1_0, (2, 0): npformat.read_array_header_2_0}


def cache_error(path: str, what: str) -> ConfigError:
    return ConfigError(f"data.cache_dir: {path}: {what}; delete it (megatron rebuilds its sample "
                       "indices) and resume only run folders you trust")


def plain_npy(path: str) -> None:
    """Refuse `path` unless it is a regular .npy file of plain values (its header is read, nothing
    run; a FIFO or device is refused before it is opened, so it cannot hang the start)."""
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as e:
        raise cache_error(path, f"unreadable ({e.strerror})") from None
    if not regular:
        raise cache_error(path, "not a regular file, refused")
    with open(path, "rb") as f:
        try:
            read = _NPY_HEADERS.get(npformat.read_magic(f))
            plain = read is not None and not read(f)[2].hasobject
        except (ValueError, SyntaxError, TypeError):
            plain = False
    if not plain:
        raise cache_error(path, "not a plain numpy array (a pickle, Python objects or damaged), "
                                 "refused: loading it could run code")


class CheckedNumpy(types.ModuleType):
    """numpy as megatron's dataset modules see it inside `no_pickle`: `load` checks the file and
    never unpickles; `save` writes whole files only; everything else is numpy's."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def load(file, *args, **kwargs):
        plain_npy(file)
        try:
            return np.load(file, *args, **{**kwargs, "allow_pickle": False})
        except (ValueError, OSError) as e:  # a damaged file: truncated data after a good header
            raise cache_error(os.fspath(file), f"damaged ({e})") from None

    @staticmethod
    def save(file, arr, *args, **kwargs):
        with atomic_file(file, fsync=True) as f:
            np.save(f, arr, *args, **{**kwargs, "allow_pickle": False})


@contextlib.contextmanager
def no_pickle(cache: str):
    """For megatron's build: its GPT and blended datasets' numpy.load checks each file it loads and
    loads it with allow_pickle=False; their numpy.save writes each file whole (see above).
    `cache` is where those files live (named for the reader; the checks are per file)."""
    from megatron.core.datasets import blended_dataset, gpt_dataset

    modules = (blended_dataset, gpt_dataset)
    saved = [m.numpy for m in modules]
    for m in modules:
        m.numpy = CheckedNumpy("numpy")
    try:
        yield
    finally:
        for m, numpy in zip(modules, saved):
            m.numpy = numpy


def regular_cache_files(cache: str) -> None:
    """Every entry of the sample-index cache a regular file or folder, by lstat (nothing opened):
    a FIFO named *.npy would block megatron's read forever (the run hung with its lock held, its
    signals never handled), a link would be read, or written, through."""
    for name in sorted(os.listdir(cache)) if os.path.isdir(cache) else ():
        path = os.path.join(cache, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:  # another rank's or run's temporary, renamed into place since
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file (a FIFO, socket or device)"
            raise ConfigError(f"data.cache_dir: {path}: {what}, refused: reading it could hang or "
                              "read elsewhere; delete it (megatron rebuilds its sample indices)")
