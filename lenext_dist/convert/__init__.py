"""megatron/DeepSpeed checkpoint -> HF folder, declarative key map, verified by logits.

CLI: `python -m lenext_dist.convert --checkpoint runs/x/checkpoints --out hf/x [--tag step_N]
[--scale-c C | --head-scales-from PATH] [--format custom|stock] [--verify]`.
`--format stock` (stock.py): NoPE -> SmolLM3ForCausalLM, RoPE -> LlamaForCausalLM, no remote code.
`--from-hf HF_DIR --out RUN` (hf_import.py): the way back, a HF folder -> a run folder to train from.
"""
from .export import ExportError, export, head_scales_from, megatron_reference, verify, write_attention_copy
from .hf_import import ImportRefused, import_hf
from .keymap import KEYMAP, Rule, Shape, hf_to_megatron, megatron_to_hf
from .stock import STOCK_FORMS, refusal

__all__ = ["ExportError", "export", "verify", "megatron_reference", "head_scales_from", "write_attention_copy",
           "KEYMAP", "Rule", "Shape", "megatron_to_hf", "hf_to_megatron", "STOCK_FORMS", "refusal",
           "import_hf", "ImportRefused"]
