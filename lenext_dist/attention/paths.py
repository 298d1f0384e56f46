"""Kernels for attention with an additive distance bias and/or a window / block mask.

Same contract as `core.causal_attention` plus `bias` (table [h, n] fp32: the logit bias of
distance 0..n-1, from `PositionVariant.distance_bias`; None for none) and `mask` (a `MaskSpec`):

    q [b, h, sq, d], k/v [b, g, sk, d], m [h] fp32, q_scale [sq] | None  ->  [b, h, sq, d]

logit(i, j) = m_h t_i / sqrt(d) q_i.k_j + bias[h, i - j] for visible j (causal, window, blocks).

- `chunked` (CPU training default): query chunks of `chunk_size` rows; each calls SDPA on the
  keys the chunk can see ([first_key, chunk end): W + chunk keys under a window) with an additive
  mask block [h, c, keys] (a flipped sliding view of one bias row: the block is Toeplitz). Never
  builds [h, L, L] at once in a forward without autograd; under autograd SDPA keeps each mask
  block for its backward, so a full-causal biased pass holds ~h L^2/2 mask values in total (a
  window: h L (W + chunk)). Differentiable (KERPLE parameters get gradients via the bias).
- `sdpa_mask`: one SDPA call with the full [h, sq, sk] additive mask (materialized; for short
  sequences and the benchmark).
- `flex`: `torch.nn.attention.flex_attention` compiled with `torch.compile`, bias as score_mod
  (a table lookup) and the mask as a block mask (skips fully hidden blocks). No [h, L, L] tensor.
  torch 2.13 has no FlexAttention backward on CPU, so on CPU it only runs without autograd
  (the evaluation default from 1024 tokens on). Falls back to `chunked` when torch.compile
  cannot run here (forward, or, under autograd, a backward probed at the first call of a shape),
  or past FLEX_MAX_SHAPES distinct shapes.
- `eager`: the explicit fp32 softmax reference (`core.eager_causal_attention`).

Document masking (`documents`, a `documents.Documents` of the batch; sq == sk): every kernel also
hides keys of other documents. `chunked` starts each chunk's keys at the lowest document start
of its first query (over the batch) and masks with a [b, 1|h, c, keys] block; `flex` uses a block
mask built from per-block document ranges (documents.py); `sdpa_mask` builds [b, 1|h, L, L] (as
it builds [h, L, L] without documents: short sequences and the benchmark only).

`choose_impl` resolves `auto` (see its docstring for the measured reasons).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .backends import note_impl
from .mask import MaskSpec, block_mask_from_tiles


def scaled_query(q: Tensor, m: Tensor, q_scale: Optional[Tensor]) -> Tensor:
    """q [b, h, sq, d] * m [h] (* t [sq]): lambda_{j,i} = m_j t_i / sqrt(d) after the kernel's
    1/sqrt(d). The product is taken in fp32 and rounded once: m in bf16 would be quantized
    (c = 1.2 -> 1.203125, a 0.01 sweep grid in steps of 2^-7); in fp32 runs it is bitwise q * m.
    q_scale [b, sq] (per-document positions) scales each row on its own."""
    mult = m.float().view(1, -1, 1, 1)
    if q_scale is not None:
        mult = mult * q_scale.float().unsqueeze(-2).unsqueeze(-1)  # [1|b, h, sq, 1]
    return _MulRound.apply(q, mult)


def _mul_round(x: Tensor, mult: Tensor) -> Tensor:
    """x * mult (fp32) computed in fp32 and rounded once to x.dtype, in one elementwise op
    (torch.mul with out=: TensorIterator casts bf16 inputs up on load, the fp32 product down on
    store; no fp32 copy of x). Bitwise equal to (x.float() * mult).to(x.dtype)."""
    out = torch.empty_like(x)
    return torch.mul(x, mult, out=out)


class _MulRound(torch.autograd.Function):
    """`_mul_round` with autograd (out= ops have none): d/dx = g * mult (the same one op),
    d/dmult = sum of g * x in fp32 over mult's broadcast dims (only when mult needs it)."""

    @staticmethod
    def forward(ctx, x: Tensor, mult: Tensor) -> Tensor:
        ctx.save_for_backward(x, mult)
        return _mul_round(x, mult)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, mult = ctx.saved_tensors
        gx = _mul_round(g, mult) if ctx.needs_input_grad[0] else None
        gm = None
        if ctx.needs_input_grad[1]:
            prod = g.float() * x.float()
            dims = [i for i, n in enumerate(mult.shape) if n == 1 and prod.shape[i] != 1]
            gm = prod.sum(dim=dims, keepdim=True) if dims else prod
        return gx, gm


def head_tensor(m, h: int, device) -> Tensor:
    """m as a [h] fp32 tensor (a python float: the uniform scale, filled)."""
    if isinstance(m, Tensor):
        return m
    return torch.full((h,), float(m), dtype=torch.float32, device=device)


def query_and_scale(q: Tensor, m, q_scale: Optional[Tensor]) -> tuple[Tensor, Optional[float]]:
    """(q for the kernel, its `scale=` argument). m a python float (a fixed uniform scale c):
    q untouched (or times t_i alone) and scale = c / sqrt(d), no pass over q for c; m [h]: q times
    m (and t) in fp32 once (`scaled_query`) and the kernel's default 1/sqrt(d) (scale None)."""
    if isinstance(m, (int, float)):
        scale = float(m) / math.sqrt(q.shape[-1])
        if q_scale is None:
            return q, scale
        t = q_scale.float().unsqueeze(-2).unsqueeze(-1)  # [1|b, 1, sq, 1]
        return (q.float() * t).to(q.dtype), scale
    return scaled_query(q, m, q_scale), None


class SdpaCall(NamedTuple):
    """How one `F.scaled_dot_product_attention` call treats GQA (see `sdpa_call`)."""

    repeat_kv: bool
    """Expand k/v [b, g, sk, d] to [b, h, sk, d] (repeat_interleave) before the call."""
    enable_gqa: bool
    """Pass enable_gqa=True (k/v stay [b, g, sk, d])."""


_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def sdpa_call(device_type: str, dtype: torch.dtype, masked: bool, gqa: bool) -> SdpaCall:
    """GQA handling of an SDPA call on `device_type` with q of `dtype`, an attn_mask or not.

    torch 2.13 (F.scaled_dot_product_attention's docstring): enable_gqa "works only for
    Flash_attention and math kernel on CUDA". Flash needs fp16/bf16 and no attn_mask (is_causal
    only); where it cannot run (fp32 evaluation, an additive bias / window mask), enable_gqa would
    leave only the math kernel, which materializes [b, h, sq, sk] (tens of GB per window at 16K).
    Repeating the KV heads costs (h / g - 1) x b g sk d extra values, O(L), and lets the
    memory-efficient kernel (any dtype, additive masks) run instead. CPU keeps enable_gqa: its
    fused kernel takes it and it is bitwise equal to the repeat there (tests/unit/test_attention).
    """
    if not gqa:
        return SdpaCall(repeat_kv=False, enable_gqa=False)
    flash = device_type == "cuda" and dtype in _FLASH_DTYPES and not masked
    if device_type == "cpu" or flash:
        return SdpaCall(repeat_kv=False, enable_gqa=True)
    return SdpaCall(repeat_kv=True, enable_gqa=False)


def sdpa_kv(q: Tensor, k: Tensor, v: Tensor, masked: bool) -> tuple[Tensor, Tensor, bool]:
    """(k, v, enable_gqa) for an SDPA call with q: k/v repeated to q's heads where `sdpa_call` says."""
    h, g = q.shape[1], k.shape[1]
    call = sdpa_call(q.device.type, q.dtype, masked, g != h)
    if call.repeat_kv:
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    return k, v, call.enable_gqa


def _toeplitz_mask(bias: Tensor, q0: int, c: int, lo: int, hi: int, window: Optional[int],
                   dtype: torch.dtype) -> Tensor:
    """Additive mask [1, h, c, hi - lo] for queries q0..q0+c-1 and keys lo..hi-1 (absolute):
    bias[h, i - j] where 0 <= i - j (< window), else -inf. The block is Toeplitz, so it is a
    sliding view (`unfold`) of one row of c + keys - 1 values per head, flipped: one copy of the
    block instead of index arithmetic over it (and `unfold` has a cheap backward for KERPLE)."""
    n, nk = bias.shape[1], hi - lo
    d_max = q0 + c - 1 - lo  # distance of (last query, first key)
    deltas = torch.arange(d_max, d_max - (c - 1 + nk), -1, device=bias.device)  # decreasing
    ok = (deltas >= 0) & (deltas < n)
    if window is not None:
        ok = ok & (deltas < window)
    row = bias[:, deltas.clamp(0, n - 1)].masked_fill(~ok, float("-inf")).to(dtype)  # [h, c+nk-1]
    # row.unfold(1, nk, 1)[h, r, j] = row[h, r + j] = value at distance d_max - r - j, i.e. query
    # q0 + (c - 1 - r): flip the rows to put query q0 first
    return row.unfold(1, nk, 1).flip(1)[None]


def _block_mask(q0: int, c: int, lo: int, hi: int, bias: Optional[Tensor], mask: MaskSpec,
                dtype: torch.dtype, device, documents=None) -> Tensor:
    """Mask of queries q0..q0+c-1 and keys lo..hi-1 (python ints: no device sync): additive
    [1, h, c, n] (bias + -inf) or boolean [c, n] when there is no bias; with `documents` (indices
    in the row): [b, h, c, n] or boolean [b, 1, c, n]. An additive mask is in q's dtype (bf16:
    the bias rounds to 8 bits of mantissa; flex keeps it fp32): CUDA's memory-efficient SDPA
    kernel, the one that takes a mask, refuses any other ("invalid dtype for bias - should match
    query's dtype", aten/src/ATen/native/transformers/cuda/attention.cu)."""
    q_pos = torch.arange(q0, q0 + c, device=device)
    k_pos = torch.arange(lo, hi, device=device)
    if documents is not None:
        vis = documents.visible(q_pos, k_pos, mask)[:, None]  # [b, 1, c, n]
        if bias is None:
            return vis
        # inside a document the distance is i - j in indices too; other pairs are hidden
        add = _block_mask(q0, c, lo, hi, bias, MaskSpec(), dtype, device)  # [1, h, c, n]
        return add.masked_fill(~vis, float("-inf"))
    if bias is not None and mask.block is None and mask.chunked is None:
        return _toeplitz_mask(bias, q0, c, lo, hi, mask.window, dtype)
    vis = mask.visible(q_pos, k_pos)
    if bias is None:
        return vis
    n = bias.shape[1]
    dist = (q_pos[:, None] - k_pos[None, :]).clamp(0, n - 1)
    add = bias[:, dist].masked_fill(~vis, float("-inf"))  # [h, c, n] fp32
    return add.to(dtype)[None]


def _chunk(qs: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], q0: int, lo: int,
           mask: MaskSpec, documents, gqa: bool, scale: Optional[float]) -> Tensor:
    """SDPA of one query chunk qs [b, h, c, d] (absolute start q0) on keys lo.. of k/v."""
    am = _block_mask(q0, qs.shape[2], lo, lo + k.shape[2], bias, mask, qs.dtype, qs.device,
                     documents)
    return F.scaled_dot_product_attention(qs, k, v, attn_mask=am, enable_gqa=gqa, scale=scale)


CHUNK_BIAS_BYTES = 256 * 2**20
"""Most bytes of one chunk's additive mask (as fp32): fewer query rows per chunk at long range.
Measured on an H200 (benchmarks/results/gpu/): 256 rows at 32K keys and 32 heads allocated 1 GiB
in one piece, 5.2 GiB peak for one ALiBi call, where q, k, v and their gradients take 0.9."""


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, m: Tensor, *,
                      q_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                      mask: MaskSpec = MaskSpec(), chunk_size: int = 256, documents=None) -> Tensor:
    """Under autograd with more than one chunk, each chunk is checkpointed: its mask block is
    rebuilt in backward instead of kept (otherwise SDPA keeps every block: ~h L^2 / 2 values
    per layer with a bias, 47 GB over 22 layers at 8K), so memory stays O(chunk x keys)."""
    sq, sk = q.shape[2], k.shape[2]
    off = sk - sq
    if bias is not None:  # an additive [b|1, h, c, keys] block per chunk: bounded, not O(h c L)
        chunk_size = max(16, min(chunk_size, CHUNK_BIAS_BYTES // (q.shape[0] * q.shape[1] * sk * 4)))
    qs, scale = query_and_scale(q, m, q_scale)
    k, v, gqa = sdpa_kv(q, k, v, masked=True)  # once for all chunks
    starts = range(0, sq, chunk_size)
    # lowest visible key of every chunk, python ints (documents: one device sync per batch)
    firsts = ([mask.first_key(a + off) for a in starts] if documents is None
              else documents.first_keys(chunk_size, mask))
    grad = needs_grad(qs, k, v, bias)  # qs carries m and q_scale
    recompute = grad and len(starts) > 1
    outs = []
    for start, lo in zip(starts, firsts):
        end = min(start + chunk_size, sq)
        hi = end + off
        args = (qs[:, :, start:end], k[:, :, lo:hi], v[:, :, lo:hi], bias, start + off, lo,
                mask, documents, gqa, scale)
        if recompute:
            from torch.utils.checkpoint import checkpoint

            outs.append(checkpoint(_chunk, *args, use_reentrant=False))
        else:
            outs.append(_chunk(*args))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def sdpa_mask_attention(q: Tensor, k: Tensor, v: Tensor, m: Tensor, *,
                        q_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                        mask: MaskSpec = MaskSpec(), chunk_size: int = 256,
                        documents=None) -> Tensor:
    sq, sk = q.shape[2], k.shape[2]
    am = _block_mask(sk - sq, sq, 0, sk, bias, mask, q.dtype, q.device, documents)
    k, v, gqa = sdpa_kv(q, k, v, masked=True)
    qs, scale = query_and_scale(q, m, q_scale)
    return F.scaled_dot_product_attention(qs, k, v, attn_mask=am, enable_gqa=gqa, scale=scale)


# ---- FlexAttention ----------------------------------------------------------------------------

def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


FLEX_BLOCK = 128  # FlexAttention's default tile (_DEFAULT_SPARSE_BLOCK_SIZE)


@functools.lru_cache(maxsize=16)
def _flex_block_mask(mask: MaskSpec, sq: int, sk: int, device: str):
    """The block mask of `mask` for sq == sk (flex runs full sequences only, `choose_impl`),
    from the window/block/chunk arithmetic (`MaskSpec.tiles`): [1, 1, L/128, L/128] tables."""
    if sq != sk:
        raise ValueError(f"flex block masks need sq == sk, got {sq} queries and {sk} keys")
    any_vis, full = mask.tiles(sk, FLEX_BLOCK)
    return block_mask_from_tiles(any_vis.to(device), full.to(device), mask.mask_mod(0),
                                 FLEX_BLOCK, sk)


def _bias_score_mod(table: Tensor, off: int):
    n = table.shape[1]

    def score_mod(score, b, h, q_idx, kv_idx):
        d = torch.clamp(q_idx + off - kv_idx, 0, n - 1)
        return score + table[h, d]

    return score_mod


FLEX_MAX_SHAPES = 8
"""Distinct flex call signatures compiled per process (torch.compile with static shapes compiles
once per sequence length; dynamo's own recompile limit is 8, past which it would silently run
the unfused flex that materializes the scores). Further shapes take the chunked path."""
FLEX_KERNEL_LADDER = (None, {"num_stages": 2}, {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1})
"""Triton kernel options tried in turn on CUDA when a compile runs out of shared memory.
Measured on an H200 (torch 2.11, benchmarks/results/gpu/): the default H100 forward tile for bf16
d = 64 (BLOCK_M = BLOCK_N = 128, 3 stages) compiles for a block mask alone but needs 245760 bytes
of shared memory (limit 232448) once a score_mod reads a bias table (ALiBi, KERPLE, Sandwich);
fewer stages, then smaller tiles, fit. Tiles stay divisors of FLEX_BLOCK (the block mask's)."""
_flex_shapes: dict = {}   # call signature -> the kernel options it compiled with
_flex_broken: dict = {}   # call signature -> the error that sent it to the chunked path


def _flex_key(q: Tensor, k: Tensor, bias: Optional[Tensor], mask: MaskSpec, documents,
              grad: bool) -> tuple:
    # a learned bias (KERPLE: bias.requires_grad) is its own key: its backward differs from
    # ALiBi's constant table, so its first call with autograd gets its own backward probe
    learned_bias = bias is not None and bias.requires_grad
    return (tuple(q.shape), tuple(k.shape), q.dtype, q.device.type, bias is not None,
            learned_bias, mask, documents is not None, grad)


def _flex_forward(q: Tensor, k: Tensor, v: Tensor, m: Tensor, q_scale: Optional[Tensor],
                  bias: Optional[Tensor], mask: MaskSpec, documents=None,
                  options: Optional[dict] = None) -> Tensor:
    sq, sk = q.shape[2], k.shape[2]
    block_mask = (_flex_block_mask(mask, sq, sk, str(q.device)) if documents is None
                  else documents.flex_block_mask(mask))
    # the table stays fp32: score_mod runs on fp32 scores, and a bf16 table would shift
    # ALiBi/KERPLE/Sandwich logits by up to +-0.25 at long range
    score_mod = None if bias is None else _bias_score_mod(bias.float(), sk - sq)
    qs, scale = query_and_scale(q, m, q_scale)
    extra = {"kernel_options": options} if options else {}
    return _compiled_flex()(qs, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                            enable_gqa=k.shape[1] != q.shape[1], **extra)


def _probe_backward(q: Tensor, k: Tensor, v: Tensor, m: Tensor, q_scale: Optional[Tensor],
                    bias: Optional[Tensor], mask: MaskSpec, documents=None,
                    options: Optional[dict] = None) -> None:
    """Forward + backward once on detached copies, so that the backward's compile (which would
    otherwise happen at the caller's first `loss.backward()`, outside any try, e.g. KERPLE's
    learnable bias on CUDA, or no FlexAttention backward at all on CPU) fails here, where the
    caller can still fall back. Costs one extra attention pass per new training shape.

    The probe's own saved tensors bypass any saved-tensor hooks around it (the innermost hooks
    win): under activation checkpointing (non-reentrant) the layer's forward would otherwise save
    the probe's tensors too, and its recomputation in backward, where the signature is already
    compiled and no probe runs, would save fewer: torch's CheckpointError at the first backward."""
    leaves = [t if not isinstance(t, Tensor) else t.detach().requires_grad_(t.requires_grad)
              for t in (q, k, v, m, q_scale, bias)]
    with torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
        out = _flex_forward(*leaves[:5], leaves[5], mask, documents, options)
        wrt = [t for t in leaves if isinstance(t, Tensor) and t.requires_grad]
        torch.autograd.grad(out.float().sum(), wrt)


def _keep(t: Tensor) -> Tensor:
    return t


def kernel_ladder(device_type: str) -> tuple:
    """FLEX_KERNEL_LADDER on CUDA (Triton tiles); elsewhere the defaults alone."""
    return FLEX_KERNEL_LADDER if device_type == "cuda" else FLEX_KERNEL_LADDER[:1]


def _first_compile(key: tuple, grad: bool, args: tuple) -> Optional[Tensor]:
    """Compile flex for a new call signature, down FLEX_KERNEL_LADDER (CUDA) while the compile
    runs out of shared memory; None (the signature recorded as broken, one warning) when no rung
    compiles or the error is another (no compiler, no backward on this device)."""
    import warnings

    ladder = kernel_ladder(args[0].device.type)
    for options in ladder:
        try:
            if grad:
                _probe_backward(*args, options=options)
            out = _flex_forward(*args, options=options)
        except torch.OutOfMemoryError:
            raise  # the batch does not fit (flex would, at a smaller one): not a reason to leave flex
        except Exception as e:  # noqa: BLE001 - no compiler / unsupported backend: stay correct
            if "out of resource" in str(e) and options is not ladder[-1]:
                continue  # a smaller tile may fit the shared memory
            warnings.warn(f"FlexAttention unavailable here ({type(e).__name__}: {e}); "
                          "using the chunked SDPA path")
            _flex_broken[key] = e
            note_impl("chunked", f"flex unavailable: {type(e).__name__}")
            return None
        _flex_shapes[key] = options
        return out
    return None  # unreachable: the last rung returns or records


def flex_path_attention(q: Tensor, k: Tensor, v: Tensor, m: Tensor, *,
                        q_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                        mask: MaskSpec = MaskSpec(), chunk_size: int = 256,
                        documents=None) -> Tensor:
    grad = needs_grad(q, k, v, m, q_scale, bias)
    key = _flex_key(q, k, bias, mask, documents, grad)
    args = (q, k, v, m, q_scale, bias, mask, documents)
    if key in _flex_shapes:
        return _flex_forward(*args, options=_flex_shapes[key])
    out = None
    if key in _flex_broken:
        note_impl("chunked", "flex failed earlier for this call signature")
    elif len(_flex_shapes) >= FLEX_MAX_SHAPES:
        note_impl("chunked", f"flex past FLEX_MAX_SHAPES={FLEX_MAX_SHAPES} shapes")
    else:
        out = _first_compile(key, grad, args)
    if out is not None:
        return out
    return chunked_attention(q, k, v, m, q_scale=q_scale, bias=bias, mask=mask,
                             chunk_size=chunk_size, documents=documents)


FLEX_MIN_LENGTH = 1024
"""`auto` on CPU uses FlexAttention only from this many keys on (its compile, ~3-5 s per length
here, pays off only on long evaluations)."""


def needs_grad(*tensors) -> bool:
    """Autograd differentiates through one of `tensors` (None skipped): in a HeadScale search only
    m may, the layer's q, k and v coming from frozen weights."""
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def choose_impl(impl: str, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                m: Optional[Tensor] = None, q_scale: Optional[Tensor] = None) -> str:
    """Resolve `auto`, and fall back where a kernel cannot run.

    `auto`: CUDA -> `flex` (FlexAttention has a backward there; not measured on this CPU-only
    box). CPU -> `flex` when no gradient is needed, sq == sk and sk >= FLEX_MIN_LENGTH
    (evaluation), else `chunked` (training, short sequences, KV-cache steps).
    Measured here (benchmarks/bench_attention_paths.py, torch 2.13, 1 thread, h=4 d=64, forward
    without autograd; ALiBi / window 2048): flex 1.2-1.6x faster than chunked on ALiBi at
    2K-8K with 4-5x less memory, about even on the window; both far ahead of one SDPA call with
    the full [h, L, L] mask (1.4-6.7x slower, 3-26x the memory) and of the eager reference.
    torch 2.13 has no FlexAttention backward on CPU, so `flex` under autograd on CPU (and for
    KV-cache steps, sq != sk, which would recompile per step) falls back to `chunked`.
    """
    cpu = q.device.type == "cpu"
    grad = needs_grad(q, k, v, bias, m, q_scale)
    if impl == "auto":
        impl = "flex" if not cpu or (not grad and k.shape[2] >= FLEX_MIN_LENGTH) else "chunked"
    if impl == "flex" and (not flex_available() or (grad and cpu) or q.shape[2] != k.shape[2]):
        return "chunked"
    return impl
