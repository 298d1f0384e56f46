"""Ulysses sequence parallelism: config validation at the edge, the KV repeat rule and the dry
run's per-rank memory (the distributed behaviour is tests/distributed/test_ulysses.py)."""
import pytest

from lenext_dist.config import ConfigError, load_config
from lenext_dist.model.ulysses import kv_repeat

TINYLLAMA = ["model.num_layers=22", "model.hidden_size=2048", "model.num_attention_heads=32",
             "model.num_query_groups=4", "model.ffn_hidden_size=5632", "model.vocab_size=32000",
             "model.seq_length=65536", "train.micro_batch_size=1", "train.global_batch_size=8",
             "train.precision=bf16", "parallel.zero_stage=2"]


@pytest.mark.parametrize("override, message", [
    ("parallel.ulysses_size=3", "does not divide model.num_attention_heads 4"),
    ("model.seq_length=34", "does not divide model.seq_length 34"),
    ("parallel.ulysses_size=0", "must be >= 1"),
])
def test_bad_sizes_are_refused_with_what_to_do(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.seq_length=32", "parallel.ulysses_size=4", override])


def test_world_must_split_into_sequence_groups():
    cfg = load_config(None, ["parallel.ulysses_size=2"])
    assert cfg.parallel.data_parallel_size(6) == 3
    with pytest.raises(ConfigError, match="does not divide the world size 3"):
        cfg.parallel.data_parallel_size(3)


@pytest.mark.parametrize("h, g, n, want", [(32, 4, 8, 2), (32, 4, 4, 1), (32, 4, 2, 1),
                                           (4, 1, 2, 2), (12, 4, 6, 3), (32, 32, 8, 1)])
def test_kv_heads_repeat_to_a_multiple_of_the_ranks(h, g, n, want):
    r = kv_repeat(h, g, n)
    assert r == want and (g * r) % n == 0 and h % (g * r) == 0
    with pytest.raises(ValueError, match="do not split"):
        kv_repeat(h + 1, 1, n)


@pytest.mark.parametrize("ckpt", [False, True])
def test_memory_estimate_divides_the_sequence_terms(ckpt):
    from lenext_dist.train.dryrun import memory_estimate

    def est(n):
        cfg = load_config(None, [*TINYLLAMA, f"parallel.ulysses_size={n}",
                                 f"train.activation_checkpointing={str(ckpt).lower()}"])
        return memory_estimate(cfg, 1_100_000_000, 1_100_000_000, 8)

    one, eight = est(1), est(8)
    for k in ("weights", "gradients", "fp32_master", "adam_states"):  # ZeRO over all 8 ranks
        assert eight[k] == one[k]
    for k in ("activations", "norm_fp32", "logits"):  # s/8 tokens per rank
        assert eight[k] == pytest.approx(one[k] / 8)
    sbh = 65536 * 2048
    assert one["activations"] == (sbh * (22 * 2 + 34) if ckpt else sbh * 22 * 34)
