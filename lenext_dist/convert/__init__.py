"""megatron/DeepSpeed checkpoint -> HF folder, declarative key map, verified by logits.

Modules (import from them; the package imports nothing, so `lenext convert --help` needs no
torch): `export` (export, verify, ExportError), `hf_import` (import_hf), `hf_readers`, `hf_weights`, `keymap`, `stock`,
`outdir`, `cli`.

CLI: `python -m lenext_dist.convert --checkpoint runs/x/checkpoints --out hf/x [--tag step_N]
[--scale-c C | --head-scales-from PATH] [--format custom|stock] [--verify]`.
`--format stock` (stock.py): NoPE -> SmolLM3ForCausalLM, RoPE -> LlamaForCausalLM, no remote code.
`--from-hf HF_DIR --out RUN` (hf_import.py; hf_readers.py reads config.json, hf_weights.py the
weights): the way back, a HF folder -> a run folder to train from.
"""
