"""The sample-index cache (<run_dir>/data_cache) of a copied or damaged run folder (issue 40): a
FIFO named *.npy (megatron's read would block forever, the run hung with its lock held) or a link
is refused by lstat, in one line, before anything is opened; a plain cache file that is damaged
(truncated) gives one line naming the cache, not numpy's traceback; deleting it rebuilds."""
import os
import shutil
import threading

import numpy as np
import pytest

from helpers import tiny_shard
from lenext_dist.config import BlendItem, ConfigError, load_config
from lenext_dist.data.gpt_data import build_datasets


@pytest.fixture
def started(tmp_path, gloo_1rank):
    """A run whose first start cached megatron's sample indices."""

    prefix = tiny_shard(str(tmp_path / "s_train"))
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", "train.steps=4", "train.eval_interval=0"])
    cfg.data.blend = [BlendItem(prefix=prefix)]
    build_datasets(cfg, 1)
    return cfg, tmp_path / "run" / "data_cache"


def one_line(cfg, match):
    with pytest.raises(ConfigError, match=match) as e:
        build_datasets(cfg, 1)
    assert "\n" not in str(e.value)


def test_a_fifo_or_a_link_in_the_cache_is_refused_without_opening_it(started, tmp_path):
    cfg, cache = started
    fifo = cache / "planted-sample_index.npy"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock():  # should the build open the FIFO, a writer ends the wait (and the test fails)
        if not done.wait(20):
            with open(fifo, "wb"):
                pass

    threading.Thread(target=unblock, daemon=True).start()
    one_line(cfg, rf"^data.cache_dir: {fifo}: not a regular file \(a FIFO, socket or device\), refused")
    done.set()
    fifo.unlink()
    target = tmp_path / "elsewhere.npy"
    np.save(target, np.arange(3))
    (cache / "linked.npy").symlink_to(target)
    one_line(cfg, rf"^data.cache_dir: {cache / 'linked.npy'}: a symbolic link, refused")
    (cache / "linked.npy").unlink()
    build_datasets(cfg, 1)


def test_a_damaged_cache_file_is_one_line_and_deleting_the_cache_rebuilds(started):
    cfg, cache = started
    for f in sorted(cache.glob("*.npy")):
        good = f.read_bytes()
        f.write_bytes(good[: len(good) - 16])  # the header whole, the values cut short
        one_line(cfg, rf"^data.cache_dir: {f}: (damaged|not a plain numpy array).*delete it")
        f.write_bytes(good)
    shutil.rmtree(cache)
    build_datasets(cfg, 1)
