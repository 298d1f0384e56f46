"""The typed config tree of a run.

One dataclass per section (the `attention` section's in attention.py, train.stages' in
stages.py, a blend item's in blend.py); every field has a
docstring-comment under it (the configuration
reference, docs/configuration.md, is written from these). Validation that concerns one section lives in its
`__post_init__`; checks that span sections (batch arithmetic, head scales vs heads) live in
`RunConfig.__post_init__`. The loader (`load.py`) rejects unknown keys and wrong types before any
of this runs, so a dataclass here only ever sees values of its declared types.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, Optional

from .attention import AttentionConfig
from .checks import ConfigError, _check
from .blend import BlendItem, check_weights
from .stages import StageConfig, check_stages


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
    loader_workers: Optional[int] = None
    """Processes that build the next steps' batches while this one trains (torch DataLoader,
    same batches in the same order); null: 1 on an accelerator, 0 on the CPU. Why: the batch is
    built in Python, sample by sample (~20 ms for 256 kv samples): on an H200 it was 24-40% of a
    small model's step (the kv runs' logs); on the CPU it is ~2% and a worker would take a core from
    the compute."""

    def __post_init__(self):
        _check(self.loader_workers is None or self.loader_workers >= 0, "data.loader_workers",
               "must be >= 0 (or null: 1 on an accelerator, 0 on the CPU)")
        for item in self.blend + self.valid_blend:
            _check(bool(item.prefix), "data.blend[].prefix", "must not be empty")
        for name in ("blend", "valid_blend"):
            check_weights(getattr(self, name), f"data.{name}")


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
    """AdamW decoupled weight decay on matrices (never on norms, biases or head scales)."""
    no_decay_embeddings: bool = False
    """Exempt the token embedding from weight decay, as OLMo 2 and SmolLM3 train. Tied embeddings
    share that tensor with the output layer, so it goes undecayed too; an untied output layer
    keeps its decay (docs/recipe.md)."""
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
        _check(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0 (0: no decay), got {self.weight_decay}")
        _check(self.eps > 0, "optim.eps", f"must be > 0 (AdamW divides by sqrt(v) + eps), got {self.eps}")
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
    exit_at: int = 0
    """Stop after this step with a checkpoint and exit 0, the LR schedule still over train.steps
    (Megatron's --exit-interval): a later run with a larger exit_at, or 0, goes on from there
    (training in segments, e.g. until a gate). 0: run to train.steps."""
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
    """Validation batches of train.global_batch_size sequences per evaluation (megatron's
    --eval-iters): the same samples whatever the number of ranks."""
    per_token_loss: bool = False
    """A step's loss as the mean over every loss-mask token of its global batch (megatron's
    --calculate-per-token-loss) instead of the mean of its micro-batches' means (megatron's
    default): they differ where micro-batches hold different numbers of loss tokens
    (data.task_loss=answers with answers of various lengths), where the default weights a token of
    a micro-batch with few answers more. Validation is averaged alike."""
    activation_checkpointing: bool = False
    """Recompute each transformer layer in the backward pass (memory for long HeadScale lengths)."""
    fused_kernels: bool = True
    """On CUDA: megatron's torch.compile fusions (SwiGLU, bias-dropout-add; fused cross-entropy in
    bf16 runs only: its backward rounds the gradient to bf16); false turns them off. CPU runs never
    fuse."""
    nonfinite_patience: int = 0
    """Consecutive steps with a NaN/inf loss or grad norm (fp16: loss only, its loss scaler skips
    overflowing steps) tolerated before training stops with an error (exit 2, `latest` left on
    the last good checkpoint); 0: stop at the first. Weights holding NaN/inf stop it regardless
    (checked before every save)."""
    stages: list[StageConfig] = field(default_factory=list)
    """Length stages of one run (e.g. 4K -> 32K -> 64K with a RoPE theta per stage): each from
    its start_step on; the LR schedule runs on over train.steps; a checkpoint at each boundary
    (docs/recipe.md, lenext_dist/config/stages.py). Empty: one stage, the settings above."""

    def __post_init__(self):
        for k in ("steps", "micro_batch_size", "global_batch_size", "eval_iters"):
            _check(getattr(self, k) > 0, f"train.{k}", "must be > 0")
        _check(self.nonfinite_patience >= 0, "train.nonfinite_patience", "must be >= 0")
        _check(0 <= self.exit_at <= self.steps, "train.exit_at",
               f"must be between 0 (off) and train.steps = {self.steps}, not {self.exit_at}")
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
    backend: Optional[Literal["nccl", "gloo"]] = None
    """torch.distributed backend: nccl (GPUs) or gloo (CPU); null picks DeepSpeed's accelerator
    default (the same two)."""
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
        _check(self.peak_tflops is None or self.peak_tflops > 0, "logging.peak_tflops",
               f"must be > 0 (the MFU's denominator), got {self.peak_tflops}; null: the device's table "
               "value, else measured")


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
        if self.run_dir is None:  # the name is then a folder of runs/: one plain folder name
            _check(bool(self.name) and self.name not in (".", "..") and "/" not in self.name
                   and os.sep not in self.name and "\0" not in self.name, "name",
                   f"{self.name!r} is not a plain folder name (runs/<name> would lie outside runs/ "
                   "or be runs/ itself); use letters, digits, '-', '_', '.', or set run_dir")
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
        if self.train.stages:  # each stage's settings pass the same checks as a run's (one line)
            check_stages(self)
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
        why = layout.refusal(specs, a.rope.scaling, a.rope.fraction)
        if why:
            raise ConfigError(why)
        if any(x == "rope" for x, *_ in specs):
            from lenext_dist.attention.rope import RoPE

            try:  # the rotated dims of attention.rope.fraction, and what the scaling asks of them
                RoPE(self.model.head_dim, scaling=a.rope.scaling, factor=a.rope.factor,
                     train_length=self.model.train_length, fraction=a.rope.fraction)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        names, n = [x for x, *_ in specs], self.model.num_layers
        _check(a.layout.kind in ("uniform", "explicit") or len(set(specs)) > 1, "attention.layout",
               f"{a.layout.kind!r} (every {a.layout.every}) over model.num_layers {n} leaves every "
               f"layer {names[0]}: it would do nothing; give every <= {n} (and a position other "
               "than nope), or kind 'uniform'")
        t = a.temperature
        _check(t.kind == "none" or t.layers == "all" or "nope" in names, "attention.temperature.layers",
               f"'nope', but no layer is NoPE ({layout.describe(names)}): temperature {t.kind!r} would "
               "scale nothing; set attention.temperature.layers 'all', or a layout with NoPE layers")
        qk = a.qk_norm
        _check(qk.kind == "none" or qk.layers == "all" or "rope" in names, "attention.qk_norm.layers",
               f"'rope', but no layer runs RoPE ({layout.describe(names)}): qk_norm {qk.kind!r} would "
               "normalize nothing; set attention.qk_norm.layers 'all', or a layout with RoPE layers")
        from lenext_dist.attention.temperature import NEEDS_LENGTH

        _check(t.kind not in NEEDS_LENGTH or self.model.train_length >= 2, "model.train_length",
               f"{self.model.train_length}: temperature {t.kind!r} divides by ln L (0 for L = 1); "
               "give the training length (>= 2)")

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

