"""The HF modeling code shipped inside every export (see lenext_dist.convert).

`configuration_lenext.py`, `modeling_lenext.py` and `tokenization_lenext.py` are copied verbatim
into the exported folder; `lenext_attention.py` here is a shim over lenext_dist.attention that the
exporter replaces by a flattened copy of that package.
"""
from .configuration_lenext import LENEXT_FORMAT, LenextConfig, check_lenext_config
from .modeling_lenext import (LenextAttention, LenextForCausalLM, LenextModel, attention_inputs,
                              attention_layers, build_variant, get_head_scales, set_head_scales,
                              set_position, set_uniform_scale)

__all__ = ["LENEXT_FORMAT", "LenextConfig", "check_lenext_config", "LenextAttention",
           "LenextForCausalLM", "LenextModel", "attention_inputs", "attention_layers",
           "build_variant", "get_head_scales", "set_head_scales", "set_position",
           "set_uniform_scale"]
