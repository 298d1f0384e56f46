"""Every case `make gpu-check` runs, built from the registries (never a hand list of names).

A case is data: what to build (config overrides, length, documents), the kernel it should take on
CUDA and a memory estimate, so `--dry` can print and write the whole plan on a CPU and the CUDA
runners (run_train.py, run_attention.py, run_export.py) read the same objects.

Kinds (build_plan gives the order they run in: train, export, long attention, 2K attention):
1. train: the TinyLlama-1.1B NoPE step at its real shape (--config: 22 layers, seq 2048, bf16)
   under DeepSpeed ZeRO-2 and ZeRO-1, the largest micro-batch that fits (searched down on OOM);
   then ZeRO-2 with packed documents under activation checkpointing (FlexAttention in the model).
2. attention: forward+backward of one attention call per distinct layer variant, q [1, h, L, d]
   with TinyLlama's heads, bf16: every registered position variant, layout and temperature
   schedule at L = 2K; document masks, windows and chunked attention at 2K and LONG, and the
   plain (NoPE) and bias (ALiBi) paths at LONG.
3. export: training (megatron) vs export (HF lenext) logits, bf16 and fp32, at 1x and 8x L.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Optional

import torch

SHORT, LONG = 2048, 32768
"""Attention lengths: the training length, and a long one where an L x L tensor (1 GiB as bool)
outweighs every O(L) tensor of the call (q in fp32: 256 MiB)."""
LAYOUT_LAYERS = 4
"""Layers of a layout case (layout.every = 2: both kinds of layer present)."""
SAMPLE_OPTIONS = {"c": 1.2, "a": 0.3}
"""Values for the options a temperature schedule requires (temperature.REQUIRED)."""
BOUND_S = {"train": 150.0, "attention": 45.0, "export": 40.0}
"""Time bound of one case, seconds; an attention case gets it per FlexAttention call (each compiles
its forward and backward: the bound is mostly compile time). A case not finished within it fails."""


@dataclass
class Case:
    name: str
    kind: str
    length: int
    overrides: list[str] = field(default_factory=list)
    documents: int = 1
    """Documents packed per row (1: plain causal)."""
    dtype: str = "bf16"
    plan: dict = field(default_factory=dict)
    """What --dry writes: shapes, the kernel(s) it would choose, the memory estimate."""
    bound_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _window(L: int) -> int:
    return L // 8


def attention_cases(long: int = LONG) -> list[Case]:
    """The registry sweep at SHORT and the mask/long-context set at SHORT and `long`."""
    from lenext_dist.attention import POSITIONS, temperature
    from lenext_dist.attention.layout import LAYOUTS, NEEDS

    cases = [Case(f"position/{p}", "attention", SHORT, [f"attention.position={p}"]) for p in POSITIONS]
    mixable = [n for n, cls in POSITIONS.items() if not cls.learned]  # layout.refusal: learned ones run uniform
    for kind in LAYOUTS:
        o = ["attention.position=rope", f"attention.layout.kind={kind}", "attention.layout.every=2"]
        if kind in NEEDS:
            o.append(f"attention.{NEEDS[kind]}={_window(SHORT)}")
        if kind == "explicit":  # the one layout that names its layers: take them from the registry
            layers = list(itertools.islice(itertools.cycle(mixable), LAYOUT_LAYERS))
            o.append(f"attention.layout.layers=[{','.join(layers)}]")
        cases.append(Case(f"layout/{kind}", "attention", SHORT, o))
    for kind in temperature.TEMPERATURES:
        o = [f"attention.temperature.kind={kind}", "attention.temperature.layers=all",
             "attention.head_scale.enabled=true"]  # ssmax needs HeadScale; it composes with all
        o += [f"attention.temperature.{k}={SAMPLE_OPTIONS[k]}" for k in temperature.REQUIRED.get(kind, ())]
        cases.append(Case(f"temperature/{kind}", "attention", SHORT, o))
    for L in (SHORT, long):
        tag = f"@{L // 1024}K"
        for p in ("nope", "alibi"):  # the plain SDPA path and the distance-bias path
            if L != SHORT:
                cases.append(Case(f"long/{p}{tag}", "attention", L, [f"attention.position={p}"]))
            cases.append(Case(f"documents/{p}{tag}", "attention", L, [f"attention.position={p}"],
                              documents=L // 4096 + 3))
            cases.append(Case(f"window/{p}{tag}", "attention", L,
                              [f"attention.position={p}", f"attention.window={_window(L)}"]))
        cases.append(Case(f"chunked/nope{tag}", "attention", L,
                          ["attention.position=nope", f"attention.chunked={L // 4}"]))
    return cases


RECOMPUTE_DOCUMENTS = 4
"""Documents packed per row of the recompute case."""


def train_cases() -> list[Case]:
    """ZeRO-2 and ZeRO-1 at the real shape (MFU judged); then document masks under activation
    checkpointing, as the production recipes train (configs/exp/*-stages.yaml): FlexAttention
    inside the model, its backward through the recomputed layers (a CheckpointError before
    30 Nov), judged on running flex and a finite loss, not on MFU."""
    bf16 = ["train.precision=bf16"]
    return [*(Case(f"train/zero{z}", "train", SHORT, [*bf16, f"parallel.zero_stage={z}"]) for z in (2, 1)),
            Case("train/zero2-documents-recompute", "train", SHORT,
                 [*bf16, "parallel.zero_stage=2", "data.document_mask=true", "train.activation_checkpointing=true"],
                 documents=RECOMPUTE_DOCUMENTS)]


def export_cases() -> list[Case]:
    return [Case(f"export/{dt}@{f}x", "export", f * SHORT, [f"train.precision={dt}"], dtype=dt)
            for dt in ("bf16", "fp32") for f in (1, 8)]


def case_config(config: Optional[str], case: Case, extra: list[str] = ()):
    from lenext_dist.config import load_config

    layers = [f"model.num_layers={LAYOUT_LAYERS}"] if case.kind == "attention" else []
    if case.kind == "export":
        layers = ["model.num_layers=2"]  # two layers: parity is per layer; 8x L logits stay small
    return load_config(config, [*layers, *case.overrides, *extra])


def distinct_variants(cfg) -> list:
    """One variant per distinct (name, window, chunked) of the layout: each is one attention call."""
    from lenext_dist.attention.layout import layer_variants

    m = cfg.model
    vs = layer_variants(cfg.attention, num_layers=m.num_layers, head_dim=m.head_dim,
                        train_length=m.train_length, num_heads=m.num_attention_heads)
    return list({id(v): v for v in vs}.values())


def attention_kernel(variant, documents: int, shape: tuple[int, int, int, int], dtype: torch.dtype) -> str:
    """The kernel `attention.attend` takes for this variant on CUDA, decided by the code that
    decides it (paths.choose_impl) on meta tensors standing for CUDA ones."""
    from lenext_dist.attention.paths import choose_impl

    from .kernels import expected_sdpa_backend

    b, h, g, L, d = shape  # q [b, h, L, d], k/v [b, g, L, d]
    if variant.score_mod is None and documents == 1:
        return "sdpa:" + expected_sdpa_backend(dtype, False, d)
    q = torch.empty(b, h, L, d, device="meta", dtype=dtype, requires_grad=True)
    k = torch.empty(b, g, L, d, device="meta", dtype=dtype, requires_grad=True)
    return choose_impl(variant.impl, q, k, k, None)


def head_shape(cfg) -> tuple[int, int, int]:
    m = cfg.model
    return m.num_attention_heads, m.kv_heads, m.head_dim


def fill_plan(config: Optional[str], cases: list[Case]) -> list[Case]:
    """Resolve every case's config and write its plan (shapes, kernel, memory estimate); a case
    whose config is refused keeps the one-line reason (the run then fails it)."""
    from lenext_dist.config.checks import ConfigError

    from .kernels import attention_budget, expected_sdpa_backend, square_bytes

    for case in cases:
        case.bound_s = BOUND_S[case.kind]
        try:
            cfg = case_config(config, case)
        except (ConfigError, ValueError) as e:
            case.plan = {"error": str(e)}
            continue
        h, g, d = head_shape(cfg)
        dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float32
        if case.kind == "attention":
            shape = (1, h, g, case.length, d)
            case.plan = {"q": [1, h, case.length, d], "kv": [1, g, case.length, d], "dtype": case.dtype,
                         "layers": [list(s) for s in cfg.layer_specs],
                         "kernels": [attention_kernel(v, case.documents, shape, dtype) for v in distinct_variants(cfg)],
                         "budget_bytes": attention_budget(1, h, g, case.length, d, 2),
                         "square_bytes": square_bytes(case.length)}
            case.bound_s *= max(1, case.plan["kernels"].count("flex"))
        elif case.kind == "train":
            case.plan = train_plan(cfg)
        else:
            m = cfg.model
            case.plan = {"layers": m.num_layers, "tokens": [1, case.length], "dtype": case.dtype,
                         "kernel": "sdpa:" + expected_sdpa_backend(dtype, False, d),
                         "logits_bytes": case.length * m.vocab_size * 4 * 2}
    return cases


MICRO_BATCHES = (32, 24, 16, 12, 8, 6, 4, 3, 2, 1)
"""Micro-batches tried, largest first: the search starts at the largest the estimate admits."""


def train_plan(cfg, device_bytes: Optional[int] = None) -> dict:
    """Shape, the micro-batch the search starts from (dryrun.memory_estimate <= 90% of the device;
    80 GiB when planning without one) and its estimate."""
    from lenext_dist.model import parameter_counts
    from lenext_dist.train.dryrun import memory_estimate

    counts = parameter_counts(cfg)
    cap = 0.9 * (device_bytes or 80 * 2**30)
    est = {}
    for b in MICRO_BATCHES:
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch_size=b, global_batch_size=b))
        est[b] = round(memory_estimate(c, counts["total"], counts["total"], 1)["total"])
    start = next((b for b in MICRO_BATCHES if est[b] <= cap), MICRO_BATCHES[-1])
    m = cfg.model
    return {"layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_attention_heads,
            "query_groups": m.num_query_groups, "seq": m.seq_length, "parameters": counts["total"],
            "zero_stage": cfg.parallel.zero_stage, "precision": cfg.train.precision,
            "micro_batch_start": start, "micro_batches": [b for b in MICRO_BATCHES if b <= start],
            "memory_estimate_bytes": est[start], "estimates": est,
            "kernel": ("flex" if cfg.data.document_mask else "sdpa:flash") if cfg.attention.position == "nope"
            else "see attention cases"}


def build_plan(config: Optional[str], long: int = LONG) -> list[Case]:
    """In the order they run: the training step, export parity, then attention, the long cases
    (where an L x L would show) before the 2K sweep, so a spent budget drops the cheapest evidence."""
    attention = sorted(attention_cases(long), key=lambda c: -c.length)
    return fill_plan(config, train_cases() + export_cases() + attention)
