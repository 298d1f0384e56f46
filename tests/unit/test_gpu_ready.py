"""GPU readiness, the parts a CPU can check (issue 22): the rank -> visible device mapping, the
GPU pre-flight, the generated DeepSpeed JSON's dtypes and overlap (and that a real DeepSpeed engine
takes them), the peak-FLOPs table, the dry-run memory terms (the GPU check itself: test_gpu_check.py)."""
import os

import pytest
import torch

from lenext_dist.config import ConfigError, deepspeed_config, load_config
from lenext_dist.attention import POSITIONS, SCALINGS
from lenext_dist.train.device import (check_gpu_visible, gpu_job_reason, local_rank,
                                      visible_device_index)

os.environ.setdefault("DS_ACCELERATOR", "cpu")


# ---- device index from the visible GPUs --------------------------------------------------------

@pytest.mark.parametrize("rank,count,want", [
    (0, 8, 0), (5, 8, 5),     # --gpus-per-node: every task sees the node's 8 GPUs
    (0, 1, 0), (5, 1, 0),     # --gpus-per-task=1: CUDA_VISIBLE_DEVICES names one GPU
])
def test_visible_device_index(rank, count, want):
    assert visible_device_index(rank, count) == want


def test_visible_device_index_refuses_ambiguous_and_empty():
    with pytest.raises(ConfigError, match="sees only 2 devices"):
        visible_device_index(5, 2)
    with pytest.raises(ConfigError, match="no accelerator"):
        visible_device_index(0, 0)


def test_visible_device_index_with_simulated_cuda_visible_devices():
    """A subprocess-free simulation: torch counts CUDA_VISIBLE_DEVICES' entries on a GPU host;
    here we count them as torch would and map every local rank of an 8-task node."""
    for cvd, want in (("3", [0] * 8), ("0,1,2,3,4,5,6,7", list(range(8)))):
        count = len(cvd.split(","))
        env = {"CUDA_VISIBLE_DEVICES": cvd}
        got = [visible_device_index(local_rank({**env, "SLURM_LOCALID": str(r)}), count)
               for r in range(8)]
        assert got == want


def test_local_rank_sources():
    assert local_rank({}) == 0
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}) == 3
    assert local_rank({"LOCAL_RANK": "1", "SLURM_LOCALID": "0"}) == 1  # the launcher's wins


def test_gpu_preflight():
    assert gpu_job_reason(None, {}) is None
    assert gpu_job_reason("gloo", {"SLURM_GPUS_ON_NODE": "4"}) is None  # CPU run on purpose
    assert "SLURM_GPUS_ON_NODE=4" in gpu_job_reason(None, {"SLURM_GPUS_ON_NODE": "4"})
    with pytest.raises(ConfigError, match="parallel.backend is nccl.*sees no CUDA"):
        check_gpu_visible("nccl", {}, cuda_available=False)
    with pytest.raises(ConfigError, match="DS_ACCELERATOR=cuda"):
        check_gpu_visible(None, {"DS_ACCELERATOR": "cuda"}, cuda_available=False)
    check_gpu_visible("nccl", {}, cuda_available=True)
    check_gpu_visible(None, {"DS_ACCELERATOR": "cpu"}, cuda_available=False)


# ---- DeepSpeed JSON ----------------------------------------------------------------------------

def _ds(*overrides, world=2):
    return deepspeed_config(load_config(None, ["train.micro_batch_size=2", "train.global_batch_size=8",
                                               *overrides]), world)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_accumulates_and_reduces_in_fp32(stage):
    ds = _ds("train.precision=bf16", f"parallel.zero_stage={stage}")
    assert ds["bf16"] == {"enabled": True, "immediate_grad_update": True}
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"}
    assert ds["communication_data_type"] == "fp32"


def test_bf16_zero0_keeps_deepspeeds_only_supported_accumulation():
    ds = _ds("train.precision=bf16", "parallel.zero_stage=0")
    assert "data_types" not in ds  # DeepSpeed 0.19.8 raises NotImplementedError for it at ZeRO-0


def test_reduce_dtype_choice_and_fp32_runs():
    assert _ds("train.precision=bf16", "parallel.reduce_dtype=bf16")["communication_data_type"] == "bf16"
    assert "communication_data_type" not in _ds("train.precision=bf16", "parallel.reduce_dtype=null")
    ds = _ds()  # fp32 precision: nothing bf16-specific
    assert "bf16" not in ds and "data_types" not in ds


def test_zero2_overlap_and_buckets():
    z = _ds("parallel.zero_stage=2")["zero_optimization"]
    assert z["overlap_comm"] is True and z["contiguous_gradients"] is True
    assert z["reduce_bucket_size"] == z["allgather_bucket_size"] == 50_000_000
    assert _ds("parallel.zero_stage=2", "parallel.overlap_comm=false")["zero_optimization"][
        "overlap_comm"] is False
    assert "overlap_comm" not in _ds("parallel.zero_stage=3")["zero_optimization"]  # on by default




def test_deepspeed_engine_takes_the_bf16_settings(megatron_1rank, monkeypatch):
    """A real DeepSpeed engine (1 gloo rank, bf16, ZeRO-2) built from the generated JSON: fp32
    gradient accumulation and reduce, overlap on; two steps give a finite loss and grad norm.
    Also records DeepSpeed 0.19.8's cast: every parameter (head scales too) becomes bf16 inside
    the engine (`_cast_module_mixed_precision`; keep_in_fp32_modules covers buffers only)."""
    from lenext_dist.model import build_model, head_scale_parameters
    from lenext_dist.train import optim
    from lenext_dist.train.loop import skip_deepspeed_shm_op

    monkeypatch.setenv("LOCAL_RANK", "0")  # DeepSpeed asserts a launcher set it
    skip_deepspeed_shm_op()
    cfg = load_config(None, ["train.precision=bf16", "parallel.zero_stage=2", "train.micro_batch_size=2",
                             "train.global_batch_size=4", "attention.head_scale.enabled=true",
                             "model.vocab_size=128", "model.seq_length=32"])
    engine = optim.build_engine(build_model(cfg, device="cpu"), cfg, 1)
    opt = engine.optimizer
    assert type(opt).__name__ == "DeepSpeedZeroOptimizer"
    assert opt.gradient_accumulation_dtype == torch.float32
    assert opt.communication_data_type == torch.float32 and opt.overlap_comm
    assert all(p.dtype == torch.bfloat16 for _, p in head_scale_parameters(engine.module))
    ids = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(0))
    for _ in range(2):  # accumulation 2: one optimizer step
        loss = engine(input_ids=ids[:, :-1], position_ids=torch.arange(32).expand(2, 32),
                      attention_mask=None, labels=ids[:, 1:]).float().mean()
        engine.backward(loss)
        engine.step()
    assert torch.isfinite(loss) and torch.isfinite(torch.as_tensor(engine.get_global_grad_norm()))


# ---- SDPA call arguments -----------------------------------------------------------------------

from lenext_dist.attention.paths import SdpaCall, sdpa_call  # noqa: E402

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.mark.parametrize("device,dtype,masked,gqa,want", [
    # CUDA, flash possible (half precision, is_causal only): GQA natively, no copy
    ("cuda", BF16, False, True, SdpaCall(False, True)),
    ("cuda", FP16, False, True, SdpaCall(False, True)),
    # CUDA where flash cannot run: repeat KV so the O(L)-memory efficient kernel can
    ("cuda", FP32, False, True, SdpaCall(True, False)),   # fp32 evaluation (lenext eval default)
    ("cuda", BF16, True, True, SdpaCall(True, False)),    # ALiBi/KERPLE bias, window mask
    ("cuda", FP32, True, True, SdpaCall(True, False)),
    ("xpu", BF16, False, True, SdpaCall(True, False)),    # other accelerators: no GQA promise
    # CPU unchanged: its fused kernel takes enable_gqa
    ("cpu", FP32, False, True, SdpaCall(False, True)),
    ("cpu", BF16, True, True, SdpaCall(False, True)),
    # MHA: nothing to do anywhere
    ("cuda", FP32, True, False, SdpaCall(False, False)),
    ("cpu", BF16, False, False, SdpaCall(False, False)),
])
def test_sdpa_call_arguments(device, dtype, masked, gqa, want):
    assert sdpa_call(device, dtype, masked, gqa) == want


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("masked", [False, True])
def test_repeated_kv_gives_the_same_attention(dtype, masked):
    """The call the CUDA fallback makes (k/v repeated, no enable_gqa) against the enable_gqa call,
    on the same inputs: the same numbers (a mask: an additive ALiBi-like bias)."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 16, 32, generator=gen).to(dtype)
    k, v = (torch.randn(2, 2, 16, 32, generator=gen).to(dtype) for _ in range(2))
    dist_ = torch.arange(16)[:, None] - torch.arange(16)[None, :]
    am = torch.where(dist_ >= 0, -0.1 * dist_.float(), float("-inf")).to(dtype) if masked else None
    kw = dict(attn_mask=am) if masked else dict(is_causal=True)
    gqa = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    rep = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), **kw)
    torch.testing.assert_close(rep, gqa, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_repeat_branch_through_the_kernels_keeps_the_output(dtype, monkeypatch):
    """causal_attention (is_causal, and KV-cache with a mask) and the chunked/sdpa_mask bias paths,
    run once as on CPU (enable_gqa) and once forced onto the repeat-KV branch CUDA takes for fp32
    or masked calls: identical outputs."""
    from lenext_dist.attention import paths
    from lenext_dist.attention.core import causal_attention

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 24, 16, generator=gen).to(dtype)
    k, v = (torch.randn(1, 2, 24, 16, generator=gen).to(dtype) for _ in range(2))
    m = torch.full((4,), 1.2)
    bias = -0.05 * torch.arange(24, dtype=torch.float32).expand(4, 24)

    def run():
        return [causal_attention(q, k, v, m), causal_attention(q[:, :, -5:], k, v, m),
                paths.chunked_attention(q, k, v, m, bias=bias, chunk_size=8),
                paths.sdpa_mask_attention(q, k, v, m, bias=bias)]

    native = run()
    calls = []
    monkeypatch.setattr(paths, "sdpa_call",
                        lambda *a: calls.append(a) or SdpaCall(repeat_kv=True, enable_gqa=False))
    for got, want in zip(run(), native):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(calls) == 4 and {c[2] for c in calls} == {False, True}  # both mask states seen


# ---- fp32 scale parameters under a bf16 engine ---------------------------------------------------

@pytest.mark.parametrize("stage", [1, 2])
def test_bf16_engine_runs_head_scales_and_kerple_in_exact_fp32(stage, megatron_1rank, monkeypatch):
    _bf16_engine_exact_fp32(stage, monkeypatch)


def _bf16_engine_exact_fp32(stage, monkeypatch):
    """DeepSpeed casts m_h and KERPLE's r1/r2 to bf16 (m = 1.2 -> 1.203125) and builds its fp32
    master from that; after build_engine the masters hold the exact values again and the forward
    reads them (fp32_value), before and after an optimizer step; gradients still reach them."""
    from deepspeed.utils import safe_get_full_fp32_param

    from lenext_dist.attention.precision import fp32_value
    from lenext_dist.model import build_model
    from lenext_dist.train import fp32_params, optim
    from lenext_dist.train.loop import skip_deepspeed_shm_op

    monkeypatch.setenv("LOCAL_RANK", "0")
    skip_deepspeed_shm_op()
    cfg = load_config(None, ["train.precision=bf16", f"parallel.zero_stage={stage}",
                             "train.micro_batch_size=2", "train.global_batch_size=2",
                             "attention.position=kerple_log", "attention.head_scale.enabled=true",
                             "attention.head_scale.trainable=true", "attention.head_scale.init=1.2",
                             "model.vocab_size=128", "model.seq_length=32"])
    model = build_model(cfg, device="cpu")
    want = {n: p.detach().clone() for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert any(n.endswith("head_scale") for n in want) and any("r1_raw" in n for n in want)
    engine = optim.build_engine(model, cfg, 1)
    seen = []
    core = engine.module.decoder.layers[0].self_attention.core_attention
    core.position.register_forward_pre_hook(lambda mod, args: seen.append(args[3].detach().clone()))

    def step():
        ids = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(len(seen)))
        loss = engine(input_ids=ids[:, :-1], position_ids=torch.arange(32).expand(2, 32),
                      attention_mask=None, labels=ids[:, 1:]).float().mean()
        engine.backward(loss)
        engine.step()
        fp32_params.refresh(engine)

    params = dict(engine.module.named_parameters())
    for n, v in want.items():
        p = params[n]
        assert p.dtype == torch.bfloat16  # DeepSpeed's cast: the parameter itself
        assert torch.equal(safe_get_full_fp32_param(p), v), n  # the master: exact again
        assert torch.equal(fp32_value(p), v), n  # what the forward reads
    step()
    assert seen[0].dtype == torch.float32 and torch.equal(seen[0], torch.full((4,), 1.2))
    hs = core.head_scale
    master = safe_get_full_fp32_param(hs)
    assert not torch.equal(master, torch.full((4,), 1.2))  # it trained
    assert torch.equal(fp32_value(hs), master)
    assert not torch.equal(master.to(torch.bfloat16).float(), master)  # finer than bf16
    r1_raw = core.position.r1_raw
    torch.testing.assert_close(core.position.r1(), 1e-2 + torch.nn.functional.softplus(
        safe_get_full_fp32_param(r1_raw)), rtol=0, atol=0)
    step()
    assert torch.equal(seen[1], master)  # the second forward used the stepped fp32 value
    return cfg, engine


@pytest.mark.parametrize("stage", [1, 2])
def test_bf16_resume_restores_the_exact_fp32_values(stage, megatron_1rank, monkeypatch, tmp_path):
    """checkpoint.save / checkpoint.load (as the loop resumes) of the bf16 engine above: after
    fp32_params.refresh the fresh engine's forward reads the saved fp32 masters, not bf16."""
    from deepspeed.utils import safe_get_full_fp32_param

    from lenext_dist.attention.precision import fp32_value
    from lenext_dist.checkpoint.layout import tag_for
    from lenext_dist.model import build_model
    from lenext_dist.train import checkpoint, fp32_params, optim

    cfg, engine = _bf16_engine_exact_fp32(stage, monkeypatch)
    cfg.checkpoint.dir = str(tmp_path)
    checkpoint.save(engine, cfg, 2, 4)
    saved = {n: safe_get_full_fp32_param(p).clone() for n, p in engine.module.named_parameters()
             if getattr(p, "_lenext_fp32", None) is not None}
    fresh = optim.build_engine(build_model(cfg, device="cpu"), cfg, 1)
    checkpoint.load(fresh, str(tmp_path), tag_for(2))
    fp32_params.refresh(fresh)
    params = dict(fresh.module.named_parameters())
    for n, v in saved.items():
        assert torch.equal(fp32_value(params[n]), v), n


# ---- KERPLE through FlexAttention: the backward inside the fallback ------------------------------

def test_flex_backward_failure_falls_back_before_the_callers_backward(monkeypatch):
    """KERPLE's bias requires grad; `flex` chosen explicitly on CPU, where torch 2.13 compiles the
    FlexAttention forward but has no backward: the backward probe fails inside
    flex_path_attention, which warns and returns the chunked result, so the caller's backward
    runs (on CUDA the same probe catches a backward that fails to compile)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from lenext_dist.attention import KerpleLog, paths

    monkeypatch.setattr(paths, "_flex_shapes", {})
    monkeypatch.setattr(paths, "_flex_broken", {})
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 32, 16, generator=gen, requires_grad=True)
    k, v = (torch.randn(1, 2, 32, 16, generator=gen, requires_grad=True) for _ in range(2))
    m = torch.ones(4)
    kerple = KerpleLog(4)
    bias = kerple.distance_bias(32)
    assert bias.requires_grad
    with pytest.warns(UserWarning, match="FlexAttention unavailable"):
        out = paths.flex_path_attention(q, k, v, m, bias=bias)
    assert "backward" in str(next(iter(paths._flex_broken.values())))  # caught in the probe, under autograd
    ref = paths.chunked_attention(q, k, v, m, bias=bias)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    out.sum().backward()  # the caller's backward: no compile involved any more
    assert kerple.r1_raw.grad is not None and torch.isfinite(kerple.r1_raw.grad).all()
    with torch.no_grad():  # the forward alone did compile and run on CPU
        monkeypatch.setattr(paths, "_flex_broken", {})
        fwd = paths.flex_path_attention(q, k, v, m, bias=bias)
    torch.testing.assert_close(fwd, ref.detach(), atol=2e-5, rtol=1e-5)


def test_flex_first_call_inside_activation_checkpointing_backpropagates(monkeypatch):
    """On CUDA a training call with a mask or bias takes flex, and its first call per signature
    runs the backward probe inside the layer's non-reentrant checkpoint (train.activation_
    checkpointing): the probe's saved tensors joined the layer's, its recomputation (no probe:
    the signature is compiled by then) saved fewer, and the first backward raised torch's
    CheckpointError. The kernel is a differentiable stand-in (the chunked path): torch 2.13 has no
    FlexAttention backward on the CPU; what is under test is the probe inside the checkpoint."""
    from torch.utils.checkpoint import checkpoint

    from lenext_dist.attention import paths
    from lenext_dist.attention.mask import MaskSpec

    def kernel(q, k, v, m, q_scale, bias, mask, documents=None, options=None):
        return paths.chunked_attention(q, k, v, m, q_scale=q_scale, bias=bias, mask=mask)

    monkeypatch.setattr(paths, "_flex_forward", kernel)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 4, 64, 16, generator=gen)
    m = torch.full((4,), 1.25)
    grads = []
    for wrap in (lambda f, *a: f(*a), lambda f, *a: checkpoint(f, *a, use_reentrant=False)):
        monkeypatch.setattr(paths, "_flex_shapes", {})
        monkeypatch.setattr(paths, "_flex_broken", {})
        q, k, v = (x.clone().requires_grad_() for _ in range(3))

        def layer(q, k, v):
            return paths.flex_path_attention(q * 2, k, v, m, mask=MaskSpec(window=16)) * 3

        wrap(layer, q, k, v).square().sum().backward()
        assert not paths._flex_broken and len(paths._flex_shapes) == 1  # the flex path, not its fallback
        grads.append([t.grad for t in (q, k, v)])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("position", sorted(POSITIONS) + [f"rope:{s}" for s in sorted(SCALINGS) if s != "none"])
def test_position_constants_stay_on_the_cpu_under_the_ambient_device(position):
    """build_model builds the layers under torch.device(dev) (cuda:N on a GPU rank): a variant's
    plain constants (RoPE's inv_freq, ALiBi's slopes, XPOS's xi) landed there, XPOS read xi on
    the host in every forward (a device sync per layer), and KERPLE drew its initial values from
    the device's generator (another init than the CPU's for one seed). Meta stands in for CUDA:
    what lands on it is not on the CPU."""
    from lenext_dist.attention import build_position
    from lenext_dist.attention.kerple import KerpleLog

    name, _, scaling = position.partition(":")
    over = [f"attention.position={name}", "model.num_attention_heads=4"]
    cfg = load_config(None, over + ([f"attention.rope.scaling={scaling}"] if scaling else []))
    with torch.device("meta"):
        v = build_position(cfg.attention, head_dim=16, train_length=64, num_heads=4)
        if name == "xpos":
            assert v.max_position(torch.bfloat16) > 30_000  # computed without reading a device tensor
    consts = {k: t.device.type for k, t in vars(v).items() if isinstance(t, torch.Tensor)}
    assert set(consts.values()) <= {"cpu"}, consts
    if name.startswith("kerple"):
        torch.manual_seed(7)
        want = KerpleLog(4)
        got = KerpleLog(4)
        torch.manual_seed(7)
        with torch.device("meta"):
            got.reset_parameters()  # draws on the CPU whatever the ambient device
        assert torch.equal(got.r1_raw, want.r1_raw) and torch.equal(got.r2_raw, want.r2_raw)


def test_out_of_memory_in_the_first_flex_call_is_raised_not_a_reason_to_leave_flex(monkeypatch):
    """An OOM while the first call of a signature compiles and runs (the gpu-check's micro-batch
    search, a user's first step) recorded the signature as broken: every later call of that shape
    ran the chunked path, silently. The OOM now reaches the caller and flex stays eligible."""
    from lenext_dist.attention import paths

    def oom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(paths, "_compiled_flex", lambda: oom)
    monkeypatch.setattr(paths, "_flex_shapes", {})
    monkeypatch.setattr(paths, "_flex_broken", {})
    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    with torch.no_grad(), pytest.raises(torch.OutOfMemoryError):
        paths.flex_path_attention(q, k, v, torch.ones(2), bias=torch.zeros(2, 32))
    assert not paths._flex_broken and not paths._flex_shapes


# ---- dry-run memory terms ------------------------------------------------------------------------

TINYLLAMA = ["model.num_layers=22", "model.hidden_size=2048", "model.num_attention_heads=32",
             "model.num_query_groups=4", "model.ffn_hidden_size=5632", "model.vocab_size=32000",
             "model.seq_length=2048", "train.micro_batch_size=8", "train.global_batch_size=512"]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_memory_estimate_terms(precision):
    from lenext_dist.train.dryrun import memory_estimate

    cfg = load_config(None, [*TINYLLAMA, f"train.precision={precision}", "parallel.zero_stage=2"])
    T, W = 1_100_000_000, 64
    est = memory_estimate(cfg, T, T, W)
    s, b, h, L, V = 2048, 8, 2048, 22, 32000
    w = 2 if precision == "bf16" else 4
    assert est["gradients"] == T * 4 / W  # fp32 accumulation partition (bf16) / fp32 grads
    assert est["activations"] == L * s * b * h * 34 * w / 2
    assert est["norm_fp32"] == ((2 * L + 1) * s * b * h * 4 if w == 2 else 0)
    assert est["logits"] == s * b * V * (6 if w == 2 else 4)
    assert est["total"] == sum(v for k, v in est.items() if k != "total")
    if precision == "bf16":  # the two new terms: ~9 GiB of the ~40 at micro batch 8
        assert 8.5 < (est["norm_fp32"] + est["logits"]) / 2**30 < 9.5
        # ~37 GB in all: a 40 GB A100 keeps < 4 GB for the CUDA context, NCCL, temporaries
        assert 35e9 < est["total"] < 40e9


def test_rmsnorm_keeps_an_fp32_copy_under_bf16():
    """The norm_fp32 term is real: torch's RMSNorm (megatron's local spec, WrappedTorchNorm) on a
    bf16 input saves an fp32 tensor of the input's full shape for its backward."""
    x = torch.randn(16, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    norm = torch.nn.RMSNorm(64, eps=1e-5, dtype=torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        norm(x)
    assert any(t.dtype == torch.float32 and t.shape == x.shape for t in saved)


def test_megatron_cross_entropy_saves_fp32_logits(megatron_1rank):
    """The logits term: megatron's cross-entropy saves an fp32 [s, b, V] softmax from bf16 logits."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = torch.randn(8, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 128, (8, 2))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        vocab_parallel_cross_entropy(logits, target)
    assert any(t.dtype == torch.float32 and t.shape == logits.shape for t in saved)


# ---- peak-FLOPs table ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,dtype,want", [
    ("NVIDIA A100-SXM4-80GB", BF16, 312.0), ("NVIDIA A100-PCIE-40GB", FP32, 19.5),
    ("NVIDIA H100 80GB HBM3", BF16, 989.0), ("NVIDIA H100 PCIe", BF16, 756.0),
    ("NVIDIA H100 NVL", BF16, 835.0), ("NVIDIA H200", BF16, 989.0), ("NVIDIA H200", FP32, 67.0),
    ("NVIDIA L40S", BF16, 362.0), ("NVIDIA L40", BF16, 181.0), ("NVIDIA L4", FP16, 121.0),
    ("NVIDIA A10G", BF16, 125.0), ("Tesla V100-SXM2-32GB", FP16, 125.0),
    ("Tesla V100-SXM2-32GB", BF16, None),  # no bf16 tensor cores: measured instead
    ("AMD Instinct MI300X", BF16, 1307.4), ("Some Future GPU", BF16, None),
    ("NVIDIA B200", BF16, 2250.0), ("NVIDIA GB200", BF16, 2500.0), ("NVIDIA H800", BF16, 989.0),
    ("NVIDIA H20", BF16, 148.0), ("NVIDIA H200 NVL", BF16, 835.0),
])
def test_peak_table_lookup(name, dtype, want):
    from lenext_dist.train.peak import table_peak

    assert table_peak(name, dtype) == want


def test_the_matmul_peak_is_measured_even_when_the_warm_up_passes_the_deadline():
    """On a busy machine the warm-up alone outlasted `seconds`: the peak read 0.0 (MFU: division
    by zero). seconds=0 is that case every time."""
    from lenext_dist.train.metrics import measure_matmul_tflops

    assert measure_matmul_tflops(n=64, seconds=0) > 0


def test_peak_source_order():
    """The config value wins; CPU is never in the table and is measured (small matmul)."""
    from lenext_dist.train.peak import peak_tflops

    assert peak_tflops("cpu", FP32, 312.0) == (312.0, "logging.peak_tflops")
    peak, src = peak_tflops("cpu", FP32)
    assert peak > 0 and src.startswith("measured (1024^3")


# ---- per-call copies and fusions -------------------------------------------------------------------

def test_variant_constants_are_copied_to_a_device_once():
    """ALiBi's slopes, Sandwich's lam / inv_freq and XPOS's xi reach a device once (the meta device
    stands in for an accelerator: a real copy), not per layer per call; values unchanged."""
    from lenext_dist.attention import XPOS, ALiBi, Sandwich

    for v, names in ((ALiBi(8), ["slopes"]), (Sandwich(8, 16), ["lam", "inv_freq"]), (XPOS(16), ["xi"])):
        for name in names:
            first = v.const(name, "meta")
            assert first.device.type == "meta" and v.const(name, torch.device("meta")) is first
            assert torch.equal(v.const(name, "cpu"), getattr(v, name))
    a = ALiBi(8)
    assert torch.equal(a.distance_bias(16, "cpu"), a.distance_bias(16, "cpu"))
    assert a.distance_bias(16, "meta").shape == (8, 16)


def test_megatron_fusions_only_on_cuda():
    """CPU and the meta dry run keep the unfused ops; CUDA turns on the torch-only fusions (the
    cross-entropy one in bf16 runs only) unless train.fused_kernels is false (their numerics were
    compared on CPU by hand: 5e-7 on the loss)."""
    from lenext_dist.model.build import transformer_config

    def flags(device, *o):
        t = transformer_config(load_config(None, list(o)), device=device)
        return (t.bias_activation_fusion, t.bias_dropout_fusion, t.cross_entropy_loss_fusion)

    assert flags("cuda", "train.precision=bf16") == (True, True, True)
    # the fused cross-entropy's backward rounds the logits' gradient to bf16: not for fp32 / fp16
    assert flags("cuda", "train.precision=fp32") == flags("cuda", "train.precision=fp16") == (True, True, False)
    assert flags("cpu") == flags("meta") == flags("cuda", "train.fused_kernels=false") == (False,) * 3
    t = transformer_config(load_config(None, []), device="cuda")
    assert t.cross_entropy_fusion_impl == "native" and not t.gradient_accumulation_fusion


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_estimate_partitions_by_zero_stage(stage):
    """What ZeRO stage z cuts into W pieces: optimizer states (fp32 master, Adam m, v) from z >= 1,
    gradients from z >= 2, weights at z = 3 (Rajbhandari et al. 2020, "ZeRO", section 5)."""
    from lenext_dist.train.dryrun import memory_estimate

    cfg = load_config(None, [*TINYLLAMA, "train.precision=bf16", f"parallel.zero_stage={stage}"])
    T, P, W = 1_000_000, 1_200_000, 8
    est = memory_estimate(cfg, P, T, W)
    assert est["weights"] == P * 2 / (W if stage >= 3 else 1)
    assert est["gradients"] == T * (4 if stage >= 1 else 2) / (W if stage >= 2 else 1)
    assert est["fp32_master"] == T * 4 / (W if stage >= 1 else 1)
    assert est["adam_states"] == T * 8 / (W if stage >= 1 else 1)


def test_fp32_value_reads_the_shadow_only_while_it_matches_the_parameter():
    """The shadow holds the exact fp32 value while it rounds to the bf16 parameter; once the
    parameter changes (a load, a manual edit) the parameter's own value wins, elementwise."""
    from lenext_dist.attention.precision import FP32_ATTR, fp32_value

    exact = torch.tensor([1.2, 0.7, 3.3])
    p = torch.nn.Parameter(exact.to(torch.bfloat16))
    setattr(p, FP32_ATTR, exact.clone())
    assert torch.equal(fp32_value(p), exact)  # 1.2, not bf16's 1.203125
    with torch.no_grad():
        p[1] = 2.0  # edited: element 1 no longer matches its shadow
    got = fp32_value(p)
    assert got[1] == 2.0 and got[0] == exact[0] and got[2] == exact[2]
    got.sum().backward()
    assert torch.equal(p.grad, torch.ones(3, dtype=torch.bfloat16))


# ---- FlexAttention's shared-memory ladder (an H200 finding) ---------------------------------------

def _flex_running_out_of_shared_memory(paths, monkeypatch, fits):
    """The real compiled flex behind a stand-in for Triton's launch check: options that do not
    `fits` fail as the H200 did ("out of resource", torch 2.11); the CPU flex takes no Triton
    options, so a fitting call runs without them."""
    real = paths._compiled_flex()
    tried = []

    def flex(*a, kernel_options=None, **kw):
        tried.append(kernel_options)
        if not fits(kernel_options):
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: "
                               "triton_tem_fused_flex_attention_0 Required: 245760 Hardware limit:232448")
        return real(*a, **kw)

    monkeypatch.setattr(paths, "_compiled_flex", lambda: flex)
    monkeypatch.setattr(paths, "kernel_ladder", lambda device_type: paths.FLEX_KERNEL_LADDER)
    monkeypatch.setattr(paths, "_flex_shapes", {})
    monkeypatch.setattr(paths, "_flex_broken", {})
    return tried


def test_flex_steps_down_its_tiles_when_shared_memory_runs_out(monkeypatch, recwarn):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from lenext_dist.attention import paths

    tried = _flex_running_out_of_shared_memory(paths, monkeypatch, lambda o: bool(o) and "BLOCK_M" in o)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, 256, 16, generator=gen) for _ in range(3))
    bias = -torch.arange(256.0).expand(4, 256) * 0.1
    with torch.no_grad():
        out = paths.flex_path_attention(q, k, v, torch.ones(4), bias=bias)
        again = paths.flex_path_attention(q, k, v, torch.ones(4), bias=bias)
    assert tried[:3] == list(paths.FLEX_KERNEL_LADDER)  # every rung, in order, until one fits
    assert tried[3] == paths.FLEX_KERNEL_LADDER[-1]  # the signature keeps the options that fit
    assert not paths._flex_broken and not [w for w in recwarn if "FlexAttention" in str(w.message)]
    ref = paths.chunked_attention(q, k, v, torch.ones(4), bias=bias)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(again, out, atol=0, rtol=0)


def test_a_flex_failure_sends_only_its_own_signature_to_the_chunked_path(monkeypatch):
    """On the H200 the first signature that failed (ALiBi's bias table) sent every later flex
    call of the process to the chunked path, document masks included; now only its own."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from lenext_dist.attention import paths
    from lenext_dist.attention.mask import MaskSpec

    fits = {}  # "now": whether a compile fits the shared memory
    _flex_running_out_of_shared_memory(paths, monkeypatch, lambda o: fits["now"])
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 256, 16, generator=gen) for _ in range(3))
    bias = -torch.arange(256.0).expand(4, 256) * 0.1
    fits["now"] = False
    with torch.no_grad(), pytest.warns(UserWarning, match="FlexAttention unavailable"):
        paths.flex_path_attention(q, k, v, torch.ones(4), bias=bias)
    assert len(paths._flex_broken) == 1 and not paths._flex_shapes
    fits["now"] = True
    with torch.no_grad():
        out = paths.flex_path_attention(q, k, v, torch.ones(4), mask=MaskSpec(window=64))
        paths.flex_path_attention(q, k, v, torch.ones(4), bias=bias)  # stays chunked: no retry
    assert len(paths._flex_shapes) == 1 and len(paths._flex_broken) == 1
    ref = paths.chunked_attention(q, k, v, torch.ones(4), mask=MaskSpec(window=64))
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def test_a_headscale_run_without_matplotlib_keeps_its_scales(tmp_path, monkeypatch, capsys):
    """A GPU node set up from the wheelhouse has no matplotlib (gpu/wheelhouse.py NOT_NEEDED): rank 0
    died drawing the heatmap after the last checkpoint while the other ranks waited at the final
    barrier. The JSON is the result; the heatmap is left out, said in the log."""
    import json
    import sys

    from lenext_dist.train.loop import _write_head_scales

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    _write_head_scales(torch.ones(2, 4), str(tmp_path), rank=0)
    assert json.loads((tmp_path / "head_scales.json").read_text())["head_scales"] == [[1.0] * 4] * 2
    assert not (tmp_path / "head_scales.png").exists() and "no heatmap" in capsys.readouterr().out
