"""Typed run configuration: dataclasses (schema), strict YAML loading, the DeepSpeed JSON."""
from .attention import (AttentionConfig, HeadScaleConfig, KerpleConfig, LayoutConfig, QKNormConfig, RopeConfig,
                        SandwichConfig, TemperatureConfig, XposConfig)
from .checks import ConfigError
from .schema import (BlendItem, CheckpointConfig, DataConfig, LoggingConfig, ModelConfig, OptimConfig,
                     ParallelConfig, RunConfig, StageConfig, TrainConfig)
from .load import load_config, save_config, split_cli_overrides, to_dict
from .deepspeed import deepspeed_config

# The package's public names (re-exported from the modules above).
__all__ = [
    "AttentionConfig", "BlendItem", "CheckpointConfig", "ConfigError", "DataConfig", "HeadScaleConfig",
    "KerpleConfig", "LayoutConfig", "LoggingConfig", "ModelConfig", "OptimConfig", "ParallelConfig", "RopeConfig",
    "QKNormConfig", "RunConfig", "SandwichConfig", "StageConfig", "TemperatureConfig", "TrainConfig", "XposConfig",
    "load_config",
    "save_config", "split_cli_overrides", "to_dict", "deepspeed_config",
]
