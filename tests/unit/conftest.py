"""Unit tier: one torch thread per test module (tiny models on a busy 2-core machine run far
faster single-threaded than with OpenMP threads waiting on each other)."""
import pytest

from lenext_dist.eval.testing import one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield
