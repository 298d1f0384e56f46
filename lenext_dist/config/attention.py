"""The `attention` section of the run config: the position variant and its option sections, the
per-layer layout, the temperature schedule and HeadScale (lenext_dist/attention holds the math;
it imports nothing from here, so these checks import it late)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from .checks import ConfigError, _check


@dataclass
class RopeConfig:
    """Rotary position embedding settings, used by `rope` layers (attention.position, or the
    layers attention.layout makes RoPE)."""

    base: float = 10000.0
    """Rotary base theta."""
    scaling: Literal["none", "pi", "ntk", "yarn"] = "none"
    """Length extension applied at evaluation time (PI / NTK-aware / YaRN)."""
    factor: float = 1.0
    """Extension factor s = target length / training length, for `scaling`."""
    fraction: float = 1.0
    """Partial RoPE: the fraction of each head's dims that rotate (megatron's rotary_percent,
    transformers' partial_rotary_factor): the first int(fraction * head_dim) dims (an even count),
    the others pass unrotated; 1.0 = every dim."""

    def __post_init__(self):
        _check(self.base > 1.0, "attention.rope.base", "must be > 1")
        _check(self.factor >= 1.0, "attention.rope.factor", "must be >= 1")
        _check(0.0 < self.fraction <= 1.0, "attention.rope.fraction", "must be in (0, 1]")


@dataclass
class QKNormConfig:
    """QK-norm: each head's q and k normalized over the head dim before the rotation, the
    temperature and the head scale (lenext_dist/attention/qknorm.py)."""

    kind: Literal["none", "rms", "l2"] = "none"
    """`rms` (RMSNorm with a learned weight [head_dim] on q and one on k, per layer: Qwen3's
    q_norm/k_norm) or `l2` (Llama 4's weightless x / rms(x)); `none` = off."""
    layers: Literal["all", "rope"] = "all"
    """The layers it normalizes: `all`, or `rope` (the layers running RoPE only, as Llama 4)."""
    eps: Optional[float] = None
    """Epsilon inside the rsqrt; null = model.norm_epsilon (transformers' rms_norm_eps)."""

    def __post_init__(self):
        from lenext_dist.attention import qknorm  # late, as in AttentionConfig

        try:
            qknorm.check(self)
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class HeadScaleConfig:
    """Per-head softmax scale lambda_h = m_h / sqrt(d) (the paper's HeadScale)."""

    enabled: bool = False
    """Give every attention layer a vector m of one scale per query head."""
    init: Optional[float] = None
    """Initial m_h for every head; null takes attention.scale_c (the best uniform scale)."""
    trainable: bool = False
    """m_h receives gradients (kept in fp32)."""
    min_value: Optional[float] = 1.0
    """Clamp m_h >= min_value after every optimizer step; null turns the constraint off (ablation)."""

    def __post_init__(self):
        if self.init is not None:
            _check(self.init > 0, "attention.head_scale.init", "must be > 0")
        _check(not self.trainable or self.enabled, "attention.head_scale.trainable",
               "needs attention.head_scale.enabled: true")


@dataclass
class KerpleConfig:
    """KERPLE biases (Chi et al. 2022), for attention.position `kerple_log` / `kerple_power`."""

    r1_init_max: float = 2.0
    """Initial r1 per head ~ U(0, r1_init_max) (the released KERPLE code: U(0, 2))."""
    r2_init_max: float = 1.0
    """Initial r2 per head ~ U(0, r2_init_max) (the released KERPLE code: U(0, 1))."""
    eps: float = 0.01
    """Lower bound of r1 and r2 (r = eps + softplus(raw); the code clamps at 1e-2)."""

    def __post_init__(self):
        _check(self.r1_init_max > 0 and self.r2_init_max > 0, "attention.kerple.r*_init_max",
               "must be > 0")
        _check(self.r2_init_max < 2, "attention.kerple.r2_init_max",
               "must be < 2 (kerple_power's exponent lies in (0, 2))")
        _check(self.eps > 0, "attention.kerple.eps", "must be > 0")


@dataclass
class SandwichConfig:
    """Sandwich bias lambda p_i.p_j (Chi et al. 2023), for attention.position `sandwich`."""

    dim: Optional[int] = None
    """Dimension d' of the sinusoidal embeddings p; null takes the head dim."""
    scale: float = 1.0
    """lambda, the weight of p_i.p_j in the logits."""
    per_head: bool = False
    """Multiply lambda by ALiBi-like head factors 2^(-8(h-1)/H) (our option, off by default)."""
    base: float = 10000.0
    """Base of the sinusoid frequencies base^(-2k/d')."""

    def __post_init__(self):
        if self.dim is not None:
            _check(self.dim >= 2 and self.dim % 2 == 0, "attention.sandwich.dim", "must be even and >= 2")
        _check(self.scale > 0, "attention.sandwich.scale", "must be > 0")
        _check(self.base > 1, "attention.sandwich.base", "must be > 1")


@dataclass
class XposConfig:
    """XPOS (Sun et al. 2022), for attention.position `xpos` (rotation base: attention.rope.base)."""

    gamma: float = 0.4
    """Decay per rotation pair xi_k = (k/(d/2) + gamma) / (1 + gamma)."""
    scale_base: float = 512.0
    """q is scaled by xi^(i/scale_base), k by xi^(-j/scale_base)."""
    blockwise: bool = False
    """Blockwise causal attention, block = L = model.train_length (null: model.seq_length); each
    query sees its own block and the previous one."""

    def __post_init__(self):
        _check(self.gamma > 0, "attention.xpos.gamma", "must be > 0")
        _check(self.scale_base > 0, "attention.xpos.scale_base", "must be > 0")


@dataclass
class LayoutConfig:
    """Per-layer layout: which position variant each layer runs (lenext_dist/attention/layout.py).
    Everything else of `attention` (window, except on local_global's global layers; log-length
    scale, rope settings, scale) applies to every layer; RoPE layers rotate with attention.rope
    (and its scaling), NoPE layers do not."""

    kind: str = "uniform"
    """A name in the layout registry: `uniform` (every layer attention.position), `nope_every`
    (layers k, 2k, ... (1-based) NoPE, the others attention.position; k = `every`), `smollm3`
    (SmolLM3's pattern: nope_every over attention.position `rope`, k = `every`, its
    no_rope_layer_interval: 4 in SmolLM3-3B), `local_global`
    (layers k, 2k, ... global NoPE without a window, the others attention.position under
    attention.window, which it needs: Cohere Command R7B's with k = 4 and `rope`), `irope`
    (Llama 4: layers k, 2k, ... global NoPE, the others RoPE under attention.chunked, which it
    needs), `explicit` (`layers`, one name per layer)."""
    every: int = 4
    """k of `nope_every` / `smollm3` / `local_global` / `irope`: every k-th layer is NoPE (4 layers,
    k = 2: rope, nope, rope, nope)."""
    layers: list[str] = field(default_factory=list)
    """`explicit` only: one attention-registry name per layer (model.num_layers entries), e.g.
    [rope, rope, rope, nope]."""
    global_layers: list[int] = field(default_factory=list)
    """`explicit` only: the layers (1-based) that attend globally; the others take
    attention.window / attention.chunked (e.g. [rope, rope, rope, nope] with [4]: local RoPE +
    global NoPE)."""

    def __post_init__(self):
        from lenext_dist.attention import layout, registry  # late, as in AttentionConfig

        _check(self.kind in layout.LAYOUTS, "attention.layout.kind",
               f"unknown layout {self.kind!r}; registered: {sorted(layout.LAYOUTS)}")
        _check(self.every >= 1, "attention.layout.every", "must be >= 1")
        _check(not self.layers or self.kind == "explicit", "attention.layout.layers",
               f"is read by kind 'explicit' only (kind is {self.kind!r})")
        _check(not self.global_layers or self.kind == "explicit", "attention.layout.global_layers",
               f"is read by kind 'explicit' only (kind is {self.kind!r})")
        _check(bool(self.layers) or self.kind != "explicit", "attention.layout.layers",
               "kind 'explicit' needs one position name per layer")
        unknown = sorted({x for x in self.layers if x not in registry.POSITIONS})
        _check(not unknown, "attention.layout.layers",
               f"unknown variants {unknown}; registered: {sorted(registry.POSITIONS)}")


@dataclass
class TemperatureConfig:
    """A temperature schedule: logits of query i times t_i (lenext_dist/attention/temperature.py),
    on the layers `layers` names; composes with attention.scale_c / head_scale (m_h t_i / sqrt(d))."""

    kind: str = "none"
    """A name in the temperature registry: `none`; `uniform` (t = c); `log_fit` (the paper's log
    fit, t_i = 1 + a ln max(1, i/L)); `llama4` (Llama 4's t_i = 1 + attn_scale ln(1 + floor(i /
    floor_scale))); `qwen_logn` (Qwen's t_i = max(1, ln i / ln L)); `ssmax` (Scalable-Softmax,
    t_i = ln i / ln L times a learned per-head m_h: needs attention.head_scale enabled).
    i = position + 1, L = model.train_length (null: model.seq_length)."""
    layers: Literal["nope", "all"] = "nope"
    """The layers it scales: `nope` (the layers running NoPE, as Llama 4 does) or `all`."""
    c: Optional[float] = None
    """`uniform`: the scale c (needed)."""
    a: Optional[float] = None
    """`log_fit`: the slope a (needed; the paper's 0.3-0.4, experiments/nope_length's 0.27)."""
    floor_scale: Optional[float] = None
    """`llama4`: tokens per temperature step (null: transformers' 8192)."""
    attn_scale: Optional[float] = None
    """`llama4`: strength (null: transformers' 0.1)."""

    def __post_init__(self):
        from lenext_dist.attention import temperature  # late, as in AttentionConfig

        try:
            temperature.check(self)
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class AttentionConfig:
    """Attention variant (a registry entry, see lenext_dist/attention) and its softmax scale."""

    KERNEL_FIELDS: ClassVar[tuple[str, ...]] = ("impl", "chunk_size", "sdpa_backends")
    """The fields that choose how attention is computed (kernels, for a machine and a length),
    never what: exports leave them behind and a stock form never depends on them."""

    position: str = "nope"
    """Position handling, a name in the attention registry: `nope`, `rope`, `alibi`, `kerple_log`,
    `kerple_power`, `sandwich`, `xpos`; of every layer, or of the layers attention.layout does not
    make NoPE."""
    scale_c: float = 1.0
    """Uniform softmax scale lambda = c / sqrt(d) (paper: c ~1.2 for 2x, 1.5 for 4x length)."""
    window: Optional[int] = None
    """Sliding-window attention: each token sees the last `window` tokens (itself included), with
    any position variant, in training or at evaluation, on every layer (layout local_global: on
    its local layers); null = full causal."""
    chunked: Optional[int] = None
    """Chunked attention (Llama 4's attention_chunk_size): each token sees the earlier tokens
    of its own chunk of C (positions [nC, (n+1)C)), on every layer (layout irope: on its RoPE
    layers); null = off."""
    temperature: TemperatureConfig = field(default_factory=TemperatureConfig)
    """A per-position temperature schedule (uniform c, log fit, Llama 4, Qwen log-n, SSMax) on the
    NoPE layers (or all)."""
    qk_norm: QKNormConfig = field(default_factory=QKNormConfig)
    """QK-norm (RMSNorm or Llama 4's weightless norm of q and k per head) on every layer or the
    RoPE layers."""
    impl: Literal["auto", "chunked", "flex", "sdpa_mask", "eager"] = "auto"
    """Kernel for variants with a bias or a window/block mask; auto = FlexAttention on CUDA and for
    long (>= 1024) evaluation passes on CPU, else chunked SDPA (see benchmarks/bench_attention_paths.py)."""
    chunk_size: int = 256
    """Query rows per block of the chunked kernel (memory ~ heads x chunk x (window + chunk))."""
    sdpa_backends: list[str] = field(default_factory=list)
    """SDPA kernels to try first, in order (`flash`, `efficient`, `cudnn`, `math`), e.g. [cudnn,
    flash] for cuDNN's attention on an H100 where this torch has it; math stays the last fallback.
    Empty: torch's own choice. Training and `lenext extend` runs only (the math is the same)."""
    rope: RopeConfig = field(default_factory=RopeConfig)
    kerple: KerpleConfig = field(default_factory=KerpleConfig)
    sandwich: SandwichConfig = field(default_factory=SandwichConfig)
    xpos: XposConfig = field(default_factory=XposConfig)
    head_scale: HeadScaleConfig = field(default_factory=HeadScaleConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)

    def __post_init__(self):
        _check(self.scale_c > 0, "attention.scale_c", "must be > 0")
        from lenext_dist.attention import registry  # late: attention imports nothing from config

        _check(self.position in registry.POSITIONS, "attention.position",
               f"unknown variant {self.position!r}; registered: {sorted(registry.POSITIONS)}")
        if self.layout.kind == "uniform":  # a layout's layers are checked with model.num_layers
            _check(self.rope.scaling == "none" or registry.POSITIONS[self.position].rope_scalings,
                   "attention.rope.scaling", f"{self.rope.scaling!r} scales a RoPE rotation; "
                   f"position {self.position!r} has none")
            _check(self.rope.fraction == 1.0 or registry.POSITIONS[self.position].rope_scalings,
                   "attention.rope.fraction", f"{self.rope.fraction} rotates part of each head "
                   f"with RoPE; position {self.position!r} has no RoPE rotation")
        from lenext_dist.attention.backends import SDPA_BACKENDS

        bad = [x for x in self.sdpa_backends if x not in SDPA_BACKENDS]
        _check(not bad, "attention.sdpa_backends", f"unknown {bad}: use names of {list(SDPA_BACKENDS)}")
        if self.window is not None:
            _check(self.window >= 1, "attention.window", "must be >= 1 (or null)")
        if self.chunked is not None:
            _check(self.chunked >= 1, "attention.chunked", "must be >= 1 (or null)")
        _check(self.temperature.kind != "ssmax" or self.head_scale.enabled,
               "attention.temperature.kind", "ssmax learns one scale per head: it needs "
               "attention.head_scale.enabled (and trainable, min_value null, to train it)")
        _check(self.chunk_size >= 1, "attention.chunk_size", "must be >= 1")
