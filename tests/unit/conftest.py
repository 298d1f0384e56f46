"""Unit tier: one torch thread per test module (tiny models on a busy 2-core machine run far
faster single-threaded than with OpenMP threads waiting on each other), and the 1-rank megatron
setup that the model tests share."""
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
        dist.destroy_process_group()


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
        dist.destroy_process_group()
