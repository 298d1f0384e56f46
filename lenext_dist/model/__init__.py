"""megatron-core model building: the only package that imports megatron model code.

Importing this package imports neither megatron nor deepspeed (both are imported inside the
functions), so config validation and `parameter_counts(cfg)` / `flops_per_token(cfg)` stay cheap.
`core_attention.LenextCoreAttention` imports megatron at module level; `layer_spec` loads it.
"""
from .build import (build_model, head_scale_parameters, layer_spec,
                    transformer_config)
from .counts import flops_per_token, parameter_counts
from .megatron_env import destroy_megatron, init_megatron, init_single_process_group

__all__ = ["build_model", "head_scale_parameters", "layer_spec",
           "transformer_config", "flops_per_token", "parameter_counts", "init_megatron",
           "init_single_process_group", "destroy_megatron"]
