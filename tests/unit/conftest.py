"""Unit tier: one torch thread per test module (tiny models on a busy 2-core machine run far
faster single-threaded than with OpenMP threads waiting on each other), and the 1-rank megatron
setup that the model tests share."""
import sys

import pytest
import torch.distributed as dist

from tiny_models import one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def gloo_1rank():
    """A 1-rank in-memory gloo group for one module (megatron's dataset builder needs one)."""
    from lenext_dist.model import init_single_process_group

    own = init_single_process_group()
    yield
    if own:
        destroy_group()


@pytest.fixture(scope="module")
def megatron_1rank():
    """A 1-rank gloo group + megatron's parallel state for one module; yields `init_megatron`
    (call it with a seed to re-seed megatron's RNG trackers)."""
    from lenext_dist.model import destroy_megatron, init_megatron, init_single_process_group

    own = init_single_process_group()
    init_megatron(1234)
    yield init_megatron
    destroy_megatron()
    if own:
        destroy_group()


def destroy_group():
    """Destroy the 1-rank group, and DeepSpeed's cached clone of its WORLD (deepspeed.utils.groups
    keeps it in a module global: an engine built under the next module's group would use the
    destroyed one, 'Group ... is not registered')."""
    dist.destroy_process_group()
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None and hasattr(groups, "_release_process_group_references"):
        groups._release_process_group_references(None)
