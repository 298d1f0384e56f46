"""The size study's models without training: each size loads as `lenext train` loads it, with the
head dimension 16 at every size (a temperature c / sqrt(d) means the same), sizes ordered by
parameters, three seeds each; the full plan is the one the design names."""
from experiments.nope_length.study import REPO
from experiments.sizes import study
from lenext_dist.config import load_config


def test_every_size_is_a_valid_kv_config_with_head_dimension_16():
    for name, size in study.SIZES.items():
        cfg = load_config(str(REPO / "configs/exp/kv-nope.yaml"),
                          [o.lstrip("-") for o in size.overrides()])
        assert cfg.model.num_layers == size.layers and cfg.model.hidden_size == size.hidden
        assert cfg.model.hidden_size // cfg.model.num_attention_heads == 16, name
    params = [s.params() for s in study.SIZES.values()]
    assert params == sorted(params) and params[0] == 2 * (4 * 64 ** 2 + 3 * 64 * 176)


def test_the_full_plan_trains_three_seeds_of_every_size_to_the_gate():
    plan = study.full_plan()
    assert [m.name for m in plan.models] == [f"{s}-s{i}" for s in study.SIZES for i in (0, 1, 2)]
    assert all(m.position == "nope" for m in plan.models)
    assert (plan.steps, plan.interval, study.SEGMENT) == (7500, 125, 500)
    assert plan.multiples == (1, 2, 4, 8, 16) and plan.headscale_targets == (2, 4, 8)
