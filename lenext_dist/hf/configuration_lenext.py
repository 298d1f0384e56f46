"""`LenextConfig`: the HF config of an exported lenext model (model_type `lenext`).

Shipped inside every export next to `modeling_lenext.py`; imports only transformers.

The Llama-shaped fields (vocab_size, hidden_size, ...) have the usual meaning. The lenext fields
say how attention works and are REQUIRED by the modeling code, which refuses to build a model
when one is missing or unknown (`check_lenext_config`):

- `position`: the position variant, a name of the attention registry (`nope`, `rope`, ...).
  NoPE models carry `position: "nope"` and never rotate q/k.
- `rope`: {"base": float, "scaling": "none"|"pi"|"ntk"|"yarn", "factor": float}; present for
  every model (used only when position is a rotary variant).
- `scale_c`: the uniform softmax-scale multiplier the export was made with (lambda = c/sqrt(d));
  the per-head multipliers actually used live in the weights (`model.layers.N.self_attn.head_scale`).
- `train_length`: the training context L (YaRN's original length).
- `head_scale_source`: where the exported head scales came from (`uniform`, `learned`, `file`).
- `attention_options`: every other field of the run's `attention` config section (sliding
  `window`, log-length scale, per-variant sections such as `kerple`, the per-layer `layout`, ...),
  handed to the variant's `from_config` as attributes (missing ones take the variant's defaults;
  a missing `layout` is every layer `position`). Optional.
- `bos_at_document_start`: the training data had BOS (`bos_token_id`) before every document
  (data.bos); evaluations start documents and prompts with BOS by default when it is true.
  Optional (absent in exports made before it existed: false).
- `document_mask`: training kept attention inside each packed document (data.document_mask);
  `LenextForCausalLM.forward(document_ids=...)` does the same on packed inputs. Optional.

`rope_parameters` is deliberately set to a rope type transformers does not know
(`LENEXT_ROPE_GUARD`), so that forcing the folder into a stock Llama class
(`LlamaForCausalLM.from_pretrained(dir)`) fails instead of silently running RoPE on a NoPE model.
"""
from __future__ import annotations

from transformers import PretrainedConfig

LENEXT_FORMAT = 1
LENEXT_ROPE_GUARD = {"rope_type": "lenext-not-a-llama-load-with-trust_remote_code"}
REQUIRED_FIELDS = ("position", "rope", "scale_c", "train_length")
ROPE_FIELDS = ("base", "scaling", "factor")


class LenextConfig(PretrainedConfig):
    model_type = "lenext"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 4096
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    rope_parameters: dict | None = None
    # --- lenext: how attention works (required; see check_lenext_config) ---
    position: str | None = None
    rope: dict | None = None
    scale_c: float | None = None
    train_length: int | None = None
    head_scale_source: str | None = None
    attention_options: dict | None = None
    bos_at_document_start: bool | None = None
    document_mask: bool | None = None
    lenext_format: int | None = None
    lenext_source: dict | None = None

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)


def check_lenext_config(config, positions=None) -> None:
    """Raise ValueError unless `config` has every lenext field with a usable value.

    positions: the registry (name -> class) the modeling code carries; None skips the name check.
    """
    missing = [k for k in REQUIRED_FIELDS if getattr(config, k, None) is None]
    if missing:
        raise ValueError(
            f"lenext config is missing {missing}: this export cannot say how its attention works "
            "(NoPE vs RoPE, scale); refusing to guess. Re-export with lenext_dist.convert.")
    fmt = getattr(config, "lenext_format", None)
    if fmt is not None and fmt > LENEXT_FORMAT:
        raise ValueError(f"lenext_format {fmt} is newer than this modeling code ({LENEXT_FORMAT})")
    if positions is not None and config.position not in positions:
        raise ValueError(f"unknown config.position {config.position!r}; this modeling code knows "
                         f"{sorted(positions)}")
    rope = config.rope
    if not isinstance(rope, dict) or any(k not in rope for k in ROPE_FIELDS):
        raise ValueError(f"config.rope must be a dict with {list(ROPE_FIELDS)}, got {rope!r}")
    opts = getattr(config, "attention_options", None)
    if opts is not None and not isinstance(opts, dict):
        raise ValueError(f"config.attention_options must be a dict, got {opts!r}")
    if not float(config.scale_c) > 0:
        raise ValueError(f"config.scale_c must be > 0, got {config.scale_c}")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(f"num_key_value_heads {config.num_key_value_heads} must divide "
                         f"num_attention_heads {config.num_attention_heads}")


__all__ = ["LenextConfig", "check_lenext_config", "LENEXT_FORMAT", "LENEXT_ROPE_GUARD"]
