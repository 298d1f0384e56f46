"""The per-head scale's name, in one place (training module, optimizer groups, counts, key map,
export and the exported model all read it from here).

`HEAD_SCALE` is the attribute of the core attention (megatron side: a parameter when learned, a
non-persistent buffer when uniform; exported model: a buffer) holding m_h [heads], which
multiplies each head's logits (DESIGN section 3). `HEAD_SCALE_KEY` ends its megatron
state-dict key (`decoder.layers.{i}.self_attention.core_attention.head_scale`; the full templates
of both sides are in lenext_dist/convert/keymap.py).
"""
HEAD_SCALE = "head_scale"
HEAD_SCALE_KEY = f"core_attention.{HEAD_SCALE}"
