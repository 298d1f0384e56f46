"""Training (megatron GPTModel) vs export (HF LenextForCausalLM) logits on CUDA at 1x and 8x L.

The export is built in memory the way `lenext convert` builds it (convert/keymap.megatron_to_hf,
export.build_hf_config, the uniform head scales as fp32 rows), so the comparison covers the
weight map and both attention call sites on the GPU's kernels (flash in bf16, memory-efficient in
fp32), with no checkpoint on disk.
"""
from __future__ import annotations

import torch

from . import plan

TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}
"""Max |logits_hf - logits_megatron| / max |logits_megatron|: fp32 differs by summation order only;
bf16 rounds activations at different points in the two graphs (2 layers, 8 mantissa bits)."""


@torch.no_grad()
def run(case: plan.Case, ctx) -> dict:
    from lenext_dist.convert.export import build_hf_config
    from lenext_dist.convert.keymap import HF_HEAD_SCALE, Shape, megatron_to_hf
    from lenext_dist.dtypes import TORCH_NAMES
    from lenext_dist.hf.modeling_lenext import LenextForCausalLM
    from lenext_dist.model import build_model

    from . import kernels

    cfg = plan.case_config(ctx.config, case, ctx.extra)
    dev = ctx.device
    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float32
    ref = build_model(cfg, device=dev).to(dev, dtype).eval()  # as DeepSpeed casts it for training
    state = {k: v.float().cpu() for k, v in ref.state_dict().items() if torch.is_tensor(v)}
    hf_state = megatron_to_hf(state, Shape.from_run_config(cfg))
    c, m = float(cfg.attention.scale_c), cfg.model
    for i in range(m.num_layers):
        hf_state[HF_HEAD_SCALE.format(i=i)] = torch.full((m.num_attention_heads,), c)
    hf = LenextForCausalLM(build_hf_config(cfg, scale_c=c, head_scale_source="uniform", tok=None,
                                           source={}, dtype=TORCH_NAMES[case.dtype]))
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    if missing or unexpected:
        return {"ok": False, "error": f"export state: missing {missing[:3]}, unexpected {unexpected[:3]}"}
    hf = hf.to(dev, dtype).eval()
    ids = torch.randint(0, m.vocab_size, (1, case.length), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(0))
    pos = torch.arange(case.length, device=dev)[None]
    kernels.reset_peak(dev)
    a = ref(ids, pos, attention_mask=None).float()
    b = hf(input_ids=ids, use_cache=False).logits.float()
    diff = (a - b).abs().max().item()
    rel = diff / max(a.abs().max().item(), 1e-12)
    ok = rel <= TOLERANCE[case.dtype] and bool(torch.isfinite(a).all() and torch.isfinite(b).all())
    return {"ok": ok, "max_abs_diff": diff, "rel_diff": rel, "tolerance": TOLERANCE[case.dtype],
            "peak_bytes": kernels.peak_bytes(dev),
            "error": None if ok else f"logits differ: {rel:.2e} relative > {TOLERANCE[case.dtype]}"}
