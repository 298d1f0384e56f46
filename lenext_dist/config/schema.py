"""The typed config tree of a run.

One dataclass per section; every field has a docstring-comment under it (the configuration
reference, docs/configuration.md, is written from these). Validation that concerns one section lives in its
`__post_init__`; checks that span sections (batch arithmetic, head scales vs heads) live in
`RunConfig.__post_init__`. The loader (`load.py`) rejects unknown keys and wrong types before any
of this runs, so a dataclass here only ever sees values of its declared types.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from lenext_dist.errors import UserError


class ConfigError(UserError, ValueError):
    """A config value is wrong. The message names the key (and the file, when loaded from YAML)."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


@dataclass
class ModelConfig:
    """Shape of the megatron-core GPT. Defaults: a tiny CPU model; see configs/model/."""

    name: str = "tiny-cpu"
    """Free-form name, recorded in checkpoints and exports."""
    num_layers: int = 2
    """Transformer layers (TinyLlama: 22)."""
    hidden_size: int = 64
    """Model width (TinyLlama: 2048)."""
    num_attention_heads: int = 4
    """Query heads per layer; head dim = hidden_size / heads (TinyLlama: 32, head dim 64)."""
    num_query_groups: Optional[int] = None
    """Key/value heads for grouped-query attention (GQA); null means one per head (MHA)."""
    ffn_hidden_size: int = 176
    """SwiGLU inner width (TinyLlama: 5632 = 2.75 x 2048)."""
    vocab_size: int = 4096
    """Embedding rows; must cover the tokenizer's vocabulary."""
    seq_length: int = 128
    """Tokens per training sample of this run. When pretraining it is also L, the length the
    variants refer to, unless train_length says otherwise."""
    train_length: Optional[int] = None
    """The pretrained context L that length-relative variants refer to (YaRN's original length,
    temperature schedules, XPOS blocks, exports); null = seq_length (resolved when the config is
    read, so a saved config.yaml holds the number). A HeadScale or PI/YaRN fine-tune at a longer
    seq_length keeps the base model's L here."""
    norm_epsilon: float = 1e-5
    """RMSNorm epsilon."""
    init_method_std: float = 0.02
    """Std of the normal init of weight matrices (megatron scales output layers by 1/sqrt(2L))."""
    tie_embeddings: bool = False
    """TinyLlama unties input embedding and output layer."""

    def __post_init__(self):
        for k in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                  "vocab_size", "seq_length"):
            _check(getattr(self, k) > 0, f"model.{k}", "must be > 0")
        _check(self.train_length is None or self.train_length > 0, "model.train_length", "must be > 0")
        if self.train_length is None:  # resolved once, here: code reads model.train_length for L
            self.train_length = self.seq_length
        _check(self.hidden_size % self.num_attention_heads == 0, "model.hidden_size",
               f"{self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}")
        if self.num_query_groups is not None:
            _check(self.num_query_groups > 0 and self.num_attention_heads % self.num_query_groups == 0,
                   "model.num_query_groups",
                   f"{self.num_query_groups} must divide num_attention_heads={self.num_attention_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads


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

    def __post_init__(self):
        _check(self.base > 1.0, "attention.rope.base", "must be > 1")
        _check(self.factor >= 1.0, "attention.rope.factor", "must be >= 1")


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
    (SmolLM3-3B's pattern: nope_every with k = 4 over attention.position `rope`), `local_global`
    (layers k, 2k, ... global NoPE without a window, the others attention.position under
    attention.window, which it needs: Cohere Command R7B's with k = 4 and `rope`), `irope`
    (Llama 4: layers k, 2k, ... global NoPE, the others RoPE under attention.chunked, which it
    needs), `explicit` (`layers`, one name per layer)."""
    every: int = 4
    """k of `nope_every` / `local_global` / `irope`: every k-th layer is NoPE (4 layers, k = 2: rope, nope,
    rope, nope)."""
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
    impl: Literal["auto", "chunked", "flex", "sdpa_mask", "eager"] = "auto"
    """Kernel for variants with a bias or a window/block mask; auto = FlexAttention on CUDA and for
    long (>= 1024) evaluation passes on CPU, else chunked SDPA (see benchmarks/bench_attention_paths.py)."""
    chunk_size: int = 256
    """Query rows per block of the chunked kernel (memory ~ heads x chunk x (window + chunk))."""
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
        if self.window is not None:
            _check(self.window >= 1, "attention.window", "must be >= 1 (or null)")
        if self.chunked is not None:
            _check(self.chunked >= 1, "attention.chunked", "must be >= 1 (or null)")
        _check(self.temperature.kind != "ssmax" or self.head_scale.enabled,
               "attention.temperature.kind", "ssmax learns one scale per head: it needs "
               "attention.head_scale.enabled (and trainable, min_value null, to train it)")
        _check(self.chunk_size >= 1, "attention.chunk_size", "must be >= 1")


@dataclass
class BlendItem:
    prefix: str
    """Path prefix of a megatron .bin/.idx pair (relative paths are from the current directory)."""
    weight: float = 1.0
    """Sampling weight in the blend (normalized over all items)."""

    def __post_init__(self):
        _check(self.weight > 0, "data.blend[].weight", "must be > 0")


@dataclass
class DataConfig:
    """Megatron indexed-dataset shards and the weighted blend (GPTDataset via the blend builder)."""

    blend: list[BlendItem] = field(default_factory=list)
    """Training shards with weights, e.g. SlimPajama 0.69 + Starcoder 0.31."""
    valid_blend: list[BlendItem] = field(default_factory=list)
    """Validation shards; empty means none (validation skipped)."""
    tokenizer: str = "data/sample/tokenizer.model"
    """SentencePiece model the shards were made with (EOS id, vocabulary size)."""
    seed: int = 1234
    """Data order seed (shuffle of documents and samples); HeadScale uses a fresh one."""
    cache_dir: Optional[str] = None
    """Where megatron caches its sample indices; null puts them under <run_dir>/data_cache."""
    bos: bool = False
    """Put the tokenizer's BOS before every document when samples are built (shards stay as they
    are: no re-tokenization; shards made without BOS stay valid). Recorded in the export, and
    every evaluation then starts documents / prompts with BOS by default."""
    document_mask: bool = False
    """Document masking of packed sequences: attention stays within each document of a training
    sequence (split after EOS, and at BOS), positions count from each document's start."""
    task_loss: Literal["all", "answers"] = "all"
    """Loss tokens of generated task documents: 'all', or 'answers' (only their answer tokens: the
    code, the values, the copied span; the mask `shard.py --format tasks` writes beside the shard).
    Text shards keep every token. Why: spread over the filler, the answers' few percent of the
    loss do not teach a small NoPE to copy (docs/design-notes.md)."""

    def __post_init__(self):
        for item in self.blend + self.valid_blend:
            _check(bool(item.prefix), "data.blend[].prefix", "must not be empty")


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay to min_lr_ratio * lr (TinyLlama recipe)."""

    lr: float = 1e-3
    """Peak learning rate (paper's NoPE: 3.5e-4; HeadScale: 0.1)."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of lr."""
    warmup_steps: int = 20
    """Linear warmup steps from lr/warmup_steps to lr."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay on matrices (never on norms or head scales)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2 (0.95, TinyLlama and the paper)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables."""
    fused: bool = True
    """torch AdamW's fused kernel (CPU and CUDA; ~3x faster than the per-tensor loop on CPU,
    equal to it within float rounding); false: the per-tensor loop."""

    def __post_init__(self):
        _check(self.lr > 0, "optim.lr", "must be > 0")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2", "must be in [0, 1)")
        _check(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0")


@dataclass
class TrainConfig:
    """Steps, batch arithmetic and precision. global = micro x grad_accum x data-parallel size."""

    mode: Literal["pretrain", "headscale"] = "pretrain"
    """`headscale`: freeze every weight but the per-head scales (needs checkpoint.init_from)."""
    steps: int = 200
    """Optimizer steps of the run (part of the data order: keep it fixed when resuming)."""
    micro_batch_size: int = 4
    """Sequences per rank per forward pass."""
    global_batch_size: int = 8
    """Sequences per optimizer step over all ranks."""
    grad_accum: Optional[int] = None
    """Micro-batches per step per rank; null derives it from the other two and the world size."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Parameter/compute dtype; bf16/fp16 keep fp32 master weights in the ZeRO optimizer."""
    seed: int = 1234
    """Model init and dropout seed."""
    eval_interval: int = 100
    """Validation loss every N steps (0: never); needs data.valid_blend."""
    eval_iters: int = 4
    """Validation micro-batches per evaluation."""
    activation_checkpointing: bool = False
    """Recompute each transformer layer in the backward pass (memory for long HeadScale lengths)."""
    fused_kernels: bool = True
    """On CUDA: megatron's torch.compile fusions (SwiGLU, bias-dropout-add, fused cross-entropy);
    false turns them off. CPU runs never fuse."""
    nonfinite_patience: int = 0
    """Consecutive steps with a NaN/inf loss or grad norm (fp16: loss only, its loss scaler skips
    overflowing steps) tolerated before training stops with an error (exit 2, `latest` left on
    the last good checkpoint); 0: stop at the first. Weights holding NaN/inf stop it regardless
    (checked before every save)."""

    def __post_init__(self):
        for k in ("steps", "micro_batch_size", "global_batch_size", "eval_iters"):
            _check(getattr(self, k) > 0, f"train.{k}", "must be > 0")
        _check(self.nonfinite_patience >= 0, "train.nonfinite_patience", "must be >= 0")
        _check(self.eval_interval >= 0, "train.eval_interval", "must be >= 0")
        _check(self.grad_accum is None or self.grad_accum > 0, "train.grad_accum", "must be > 0")

    def accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step per rank; raises if the batch sizes do not divide."""
        per_step = self.micro_batch_size * world_size
        _check(self.global_batch_size % per_step == 0, "train.global_batch_size",
               f"{self.global_batch_size} is not divisible by micro_batch_size x data-parallel "
               f"size = {self.micro_batch_size} x {world_size}")
        accum = self.global_batch_size // per_step
        _check(self.grad_accum in (None, accum), "train.grad_accum",
               f"{self.grad_accum} contradicts global_batch_size/(micro_batch_size x world) = {accum}")
        return accum


@dataclass
class ParallelConfig:
    """DeepSpeed ZeRO data parallelism (tensor/pipeline parallel are fixed at 1 for now)."""

    zero_stage: int = 2
    """0: plain DDP, 1: shard optimizer state, 2: + gradients, 3: + parameters."""
    offload_optimizer: bool = False
    """ZeRO-Offload (stages 1-3): optimizer state and fp32 master weights live on the CPU and torch
    AdamW steps them there (nothing compiles; DeepSpeed's cpu_adam is not used)."""
    backend: Optional[str] = None
    """torch.distributed backend; null picks DeepSpeed's accelerator default (nccl / gloo on CPU)."""
    reduce_dtype: Optional[Literal["fp32", "bf16", "fp16"]] = "fp32"
    """Dtype of the gradient all-reduce / reduce-scatter (DeepSpeed `communication_data_type`).
    fp32 sums the ranks' bf16 gradients without rounding each partial sum to 8 mantissa bits, at
    twice the bytes of bf16; null = DeepSpeed's default (the training dtype)."""
    overlap_comm: bool = True
    """ZeRO-1/2: reduce gradient buckets on a side stream while the backward continues (DeepSpeed
    `overlap_comm`; ZeRO-3 always overlaps). Costs ~4.5 x bucket_size of buffers."""
    bucket_size: int = 50_000_000
    """ZeRO-1/2 reduce and all-gather bucket size in elements (DeepSpeed's default 5e8 would hold
    ~4.5 GB of overlap buffers in bf16: most of a 1.1B model's gradients at once)."""
    ulysses_size: int = 1
    """DeepSpeed-Ulysses sequence parallelism: each sequence is split over this many consecutive
    ranks, which all-to-all around attention (lenext_dist/model/ulysses.py); 1 = off. The
    data-parallel (ZeRO) size becomes world / ulysses_size. Needs attention heads and
    model.seq_length divisible by it. Not megatron's `sequence_parallel` (a tensor-parallel
    feature, off here)."""

    def data_parallel_size(self, world: int) -> int:
        """world / ulysses_size; raises when the world does not split into sequence groups."""
        _check(world % self.ulysses_size == 0, "parallel.ulysses_size",
               f"{self.ulysses_size} does not divide the world size {world}; launch a multiple "
               f"of {self.ulysses_size} ranks")
        return world // self.ulysses_size

    def __post_init__(self):
        _check(self.zero_stage in (0, 1, 2, 3), "parallel.zero_stage", "must be 0, 1, 2 or 3")
        _check(self.ulysses_size >= 1, "parallel.ulysses_size", "must be >= 1")
        _check(not self.offload_optimizer or self.zero_stage >= 1, "parallel.offload_optimizer",
               "ZeRO-Offload needs parallel.zero_stage >= 1")
        _check(self.bucket_size > 0, "parallel.bucket_size", "must be > 0")


@dataclass
class CheckpointConfig:
    """DeepSpeed checkpoints: atomic `latest`, keep-last-K, resume by default."""

    dir: Optional[str] = None
    """Checkpoint folder; null puts it at <run_dir>/checkpoints."""
    interval: int = 100
    """Save every N steps (and at the end, and on SIGTERM/SIGUSR1); 0 saves only at the end."""
    keep_last: int = 3
    """Checkpoints kept; older ones are deleted after a newer one is complete. 0 keeps all."""
    resume: bool = True
    """Continue from <dir>/latest when it exists. false in a run_dir (or dir) that holds an earlier
    run's outputs is refused (they would be overwritten) unless start_over is true."""
    start_over: bool = False
    """Start from step 0 even where run_dir (or dir) holds an earlier run: it is first moved aside
    to <run_dir>.old-N (nothing is deleted or overwritten). For one launch (a command-line
    override): in a config that a requeued job reruns, every restart would start over."""
    init_from: Optional[str] = None
    """Checkpoint folder (or a step_* tag folder) whose model weights start a new run (HeadScale);
    one inside a folder start_over moves aside is read from its new place."""

    def __post_init__(self):
        _check(self.interval >= 0, "checkpoint.interval", "must be >= 0")
        _check(self.keep_last >= 0, "checkpoint.keep_last", "must be >= 0")


@dataclass
class LoggingConfig:
    interval: int = 10
    """Print metrics on rank 0 every N steps."""
    tensorboard: bool = True
    """Also write scalars to <run_dir>/tensorboard."""
    peak_tflops: Optional[float] = None
    """Per-device peak TFLOP/s for MFU; null: the dense peak of the device in the training dtype
    from the table in lenext_dist/train/peak.py, else measured by a matmul at start."""
    progress_bar: bool = True
    """A tqdm bar on rank 0 when stderr is a terminal."""

    def __post_init__(self):
        _check(self.interval > 0, "logging.interval", "must be > 0")


@dataclass
class RunConfig:
    """The root: one training run (`lenext train`, `python -m lenext_dist.train`)."""

    name: str = "run"
    """Run name; also the default output folder runs/<name>."""
    run_dir: Optional[str] = None
    """Output folder (resolved config, metrics, tensorboard, checkpoints); null: runs/<name>."""
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self):
        if self.run_dir is None:
            self.run_dir = f"runs/{self.name}"
        if self.checkpoint.dir is None:
            self.checkpoint.dir = f"{self.run_dir}/checkpoints"
        if self.train.mode == "headscale":
            _check(self.attention.head_scale.enabled and self.attention.head_scale.trainable,
                   "train.mode", "headscale needs attention.head_scale.enabled and .trainable")
            _check(self.checkpoint.init_from is not None, "checkpoint.init_from",
                   "train.mode=headscale needs the pretrained checkpoint to start from")
        _check(self.train.global_batch_size % self.train.micro_batch_size == 0,
               "train.global_batch_size",
               f"{self.train.global_batch_size} is not a multiple of micro_batch_size "
               f"{self.train.micro_batch_size}")
        hs = self.attention.head_scale
        _check(self.train.precision != "fp16" or not hs.trainable,
               "train.precision", "fp16 with trainable head scales is unsupported; use bf16 or fp32")
        # DeepSpeed's bf16 optimizer at ZeRO-0 keeps fp32 masters outside its safe_* accessors: the
        # m_h >= min_value clamp could not reach them and the next step would undo it
        _check(not (self.train.precision == "bf16" and self.parallel.zero_stage == 0 and hs.trainable
                    and hs.min_value is not None), "parallel.zero_stage",
               "bf16 with clamped trainable head scales needs ZeRO stage >= 1 (or train.precision fp32)")
        self._check_layout()
        n, m = self.parallel.ulysses_size, self.model
        _check(m.num_attention_heads % n == 0, "parallel.ulysses_size",
               f"{n} does not divide model.num_attention_heads {m.num_attention_heads}; pick a "
               "divisor of the head count")
        _check(m.seq_length % n == 0, "parallel.ulysses_size",
               f"{n} does not divide model.seq_length {m.seq_length}; pick a divisor of it")

    def _check_layout(self) -> None:
        """attention.layout against model.num_layers; what a non-uniform layout cannot do yet is
        refused here, in one line naming the key."""
        from lenext_dist.attention import layout

        a = self.attention
        try:
            specs = layout.layer_specs(a, self.model.num_layers)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        why = layout.refusal(specs, a.rope.scaling)
        if why:
            raise ConfigError(why)

    @property
    def layer_positions(self) -> list[str]:
        """The attention-registry name of every layer (attention.layout over model.num_layers)."""
        from lenext_dist.attention import layout

        return layout.layer_names(self.attention, self.model.num_layers)

    @property
    def layer_specs(self) -> list[tuple[str, Optional[int], Optional[int]]]:
        """(variant, window, chunked) of every layer (attention.layout over model.num_layers)."""
        from lenext_dist.attention import layout

        return layout.layer_specs(self.attention, self.model.num_layers)

    @property
    def layer_chunks(self) -> list[Optional[int]]:
        """The attention chunk of every layer (None: not chunked)."""
        return [c for *_, c in self.layer_specs]

    @property
    def layer_windows(self) -> list[Optional[int]]:
        """The sliding window of every layer (None: full causal; attention.window on the local
        layers of attention.layout)."""
        from lenext_dist.attention import layout

        return layout.layer_windows(self.attention, self.model.num_layers)

    @property
    def head_scale_init(self) -> float:
        hs = self.attention.head_scale
        return hs.init if hs.init is not None else self.attention.scale_c

