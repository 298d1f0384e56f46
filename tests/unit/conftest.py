"""Unit tier: one torch thread per test module (tiny models on a busy 2-core machine run far
faster single-threaded than with OpenMP threads waiting on each other). The 1-rank megatron
set-up the model tests share is in the repository's conftest.py (experiments' tests use it too)."""
import pytest

from tiny_models import one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield
