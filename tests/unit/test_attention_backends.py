"""Which attention implementation and SDPA kernel ran (lenext_dist.attention.backends), read by
`make gpu-check`'s records: the real torch dispatch on this CPU, no mocks."""
import logging
from types import SimpleNamespace as NS

import pytest
import torch

from lenext_dist.attention import attend, build_position
from lenext_dist.attention.backends import (last_backend, last_impl, prefer_sdpa_backends,
                                            record_sdpa_backends)
from lenext_dist.attention.core import causal_attention


def qkv(s=64):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, n, s, 16, generator=gen) for n in (4, 2, 2))


def variant(position, window=None):
    cfg = NS(position=position, rope=NS(base=10000.0, scaling="none", factor=1.0), window=window,
             temperature=None, chunk_size=32)
    return build_position(cfg, head_dim=16, train_length=32, num_heads=4)


def test_records_the_fused_cpu_kernel_and_the_math_fallback():
    q, k, v = qkv()
    with record_sdpa_backends() as seen:
        fused = causal_attention(q, k, v, 1.0)
    assert seen == ["flash_cpu"] and last_backend() == ["flash_cpu"]
    with record_sdpa_backends() as seen, prefer_sdpa_backends(["math"]):
        math = causal_attention(q, k, v, 1.0)
    assert seen == ["math"]
    torch.testing.assert_close(fused, math, atol=1e-5, rtol=1e-5)


def test_preferring_gpu_kernels_falls_back_cleanly_on_cpu():
    q, k, v = qkv()
    ref = causal_attention(q, k, v, 1.0)
    with prefer_sdpa_backends(["cudnn", "efficient"]), record_sdpa_backends() as seen:
        out = causal_attention(q, k, v, 1.0)
    assert seen == ["math"]  # neither GPU kernel runs on CPU: the math kernel, no error
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    with prefer_sdpa_backends(["cudnn", "flash"]), record_sdpa_backends() as seen:
        out = causal_attention(q, k, v, 1.0)
    assert seen == ["flash_cpu"]  # FLASH_ATTENTION covers torch's fused CPU kernel
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        prefer_sdpa_backends(["fa9"])


def test_the_implementation_is_noted_and_logged_once(caplog):
    q, k, v = qkv()
    var = variant("alibi", window=16)
    with caplog.at_level(logging.INFO, logger="lenext_dist.attention"):
        for _ in range(3):
            attend(q, k, v, torch.ones(4), var)
        assert last_impl() == "chunked"
        attend(q, k, v, torch.ones(4), variant("nope"))
        assert last_impl() == "sdpa"
    lines = [r.getMessage() for r in caplog.records if "implementation" in r.getMessage()]
    assert sum("chunked" in line for line in lines) <= 1  # once per process, never per call


def test_the_config_option_sets_the_priority_of_the_training_loop():
    """attention.sdpa_backends: names checked at the config edge; the loop's context prefers them
    (on this CPU torch, 'flash' is its fused CPU kernel) and is a no-op when empty."""
    from lenext_dist.attention.backends import last_backend, record_sdpa_backends
    from lenext_dist.config import ConfigError, load_config
    from lenext_dist.train.loop import sdpa_preference

    with pytest.raises(ConfigError, match=r"attention.sdpa_backends: unknown \['fa9'\]"):
        load_config(None, ["attention.sdpa_backends=[fa9]"])
    q = torch.randn(1, 2, 64, 16)
    for names, want in ((["math"], "math"), (["flash"], "flash_cpu")):
        cfg = load_config(None, [f"attention.sdpa_backends=[{','.join(names)}]"])
        with sdpa_preference(cfg), record_sdpa_backends():
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert want in last_backend(), (names, last_backend())
    with sdpa_preference(load_config(None, [])):
        pass
