"""Stock exports over the registries: every attention.layout x every temperature schedule (x
attention.chunked where the layout allows it) is either refused by name (ExportError, nothing
written) or exported, and then the stock model runs a forward at 1x and 4x the training length
equal to the custom export's, and its KV-cache decoding equals its full forward. (Attack of issue
40: Llama 4's temperature without attention.chunked wrote a Llama4ForCausalLM whose every
forward failed, exit 0.)"""
import os

import pytest
import torch

from lenext_dist.attention import LAYOUTS
from lenext_dist.attention.temperature import TEMPERATURES
from lenext_dist.config import LayoutConfig, TemperatureConfig
from lenext_dist.convert.export import ExportError, export
from test_stock_export import L, run_config, step_folder

os.environ.setdefault("DS_ACCELERATOR", "cpu")

LAYOUT_OPTIONS = {  # the options each layout needs (4 layers, every 2nd)
    "uniform": {}, "nope_every": {"every": 2}, "smollm3": {"every": 2},
    "local_global": {"every": 2}, "irope": {"every": 2},
    "explicit": {"layers": ["rope", "nope", "rope", "nope"]},
}
ATTENTION = {"local_global": {"window": 6}, "irope": {"chunked": 6}}
"""The local attention a layout is refused without (lenext_dist.attention.layout.NEEDS)."""
SCHEDULES = {"none": {}, "uniform": {"c": 1.3}, "log_fit": {"a": 0.3},
             "llama4": {"floor_scale": 4, "attn_scale": 0.5}, "qwen_logn": {}, "ssmax": {}}


def test_the_sweep_covers_the_registries():
    assert set(LAYOUT_OPTIONS) == set(LAYOUTS) and set(SCHEDULES) == set(TEMPERATURES)


def combos():
    """(position, layout, schedule, chunked): the uniform layout of NoPE and of RoPE, the others
    of RoPE with their NoPE layers; chunked where the layout allows it."""
    for layout in sorted(LAYOUT_OPTIONS):
        for position in ("nope", "rope") if layout == "uniform" else ("rope",):
            for kind in sorted(SCHEDULES):
                if position == "rope" and layout == "uniform" and kind != "none":
                    continue  # a temperature with no NoPE layer to scale: refused by the config
                for chunked in ((6,) if layout == "irope" else (None, 6) if layout == "uniform"
                                else (None,)):
                    yield position, layout, kind, chunked


@pytest.mark.parametrize("position,layout,kind,chunked", list(combos()))
def test_each_stock_export_runs_and_equals_custom_or_is_refused_by_name(
        tmp_path, megatron_1rank, position, layout, kind, chunked):
    from transformers import AutoModelForCausalLM

    attn = {**ATTENTION.get(layout, {}), "chunked": chunked}
    cfg = run_config(position, layers=4, learned=kind == "ssmax",
                     layout=LayoutConfig(kind=layout, **LAYOUT_OPTIONS[layout]),
                     temperature=TemperatureConfig(kind=kind, **SCHEDULES[kind]), **attn)
    ckpt = step_folder(tmp_path, cfg, megatron_1rank)
    try:
        stock_dir = export(ckpt, tmp_path / "stock", fmt="stock")["out"]
    except ExportError as e:
        msg = str(e)
        assert "\n" not in msg and ("has no" in msg or "not verified" in msg or "exactly" in msg), msg
        assert not (tmp_path / "stock").exists()
        return
    custom_dir = export(ckpt, tmp_path / "custom")["out"]
    stock = AutoModelForCausalLM.from_pretrained(stock_dir, dtype=torch.float32).eval()
    custom = AutoModelForCausalLM.from_pretrained(custom_dir, trust_remote_code=True,
                                                  dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mult in (1, 4):
            x = torch.randint(0, 4096, (2, mult * L), generator=g)
            a = stock(input_ids=x, use_cache=False).logits
            b = custom(input_ids=x, use_cache=False).logits
            assert (a - b).abs().max() <= 1e-4 * b.abs().max(), (mult, type(stock).__name__)
        pre = stock(input_ids=x[:, :-3], use_cache=True)
        step = stock(input_ids=x[:, -3:], past_key_values=pre.past_key_values, use_cache=True)
        assert (step.logits - a[:, -3:]).abs().max() <= 1e-4 * a.abs().max()
