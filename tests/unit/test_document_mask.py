"""Document masking of packed sequences (issue 17 part 3): for every registered attention variant,
a packed sequence with the document mask gives each document the outputs / logits it gets alone:
on the attention function (every kernel: chunked, sdpa_mask, eager; FlexAttention once), on the
megatron model (document ids as its attention mask, 1-rank gloo) and on the HF export's model
class (`document_ids=`), which also agree with each other."""
import os
from types import SimpleNamespace as NS

import pytest
import torch

from lenext_dist.attention import POSITIONS, Documents, attend, build_position, document_ids
from lenext_dist.config import AttentionConfig, TemperatureConfig, ModelConfig, RunConfig, XposConfig
from tiny_models import megatron_and_hf

os.environ.setdefault("DS_ACCELERATOR", "cpu")

B, H, G, D = 2, 4, 2, 8
L = 8  # training length of the variants (XPOS block, log-length scale's L)
ALL = sorted(POSITIONS)
EOS, BOS = 2, 1


def make(name, **opts):
    cfg = NS(position=name, rope=NS(base=10000.0, scaling="none", factor=1.0), chunk_size=5,
             **opts)
    torch.manual_seed(7)
    return build_position(cfg, head_dim=D, train_length=L, num_heads=H)


def rand_qkv(s, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, n, s, D, generator=gen) for n in (H, G, G))


def spans(ids_row):
    """(start, end) of each document of one row of ids."""
    out, start = [], 0
    for i in range(1, len(ids_row) + 1):
        if i == len(ids_row) or ids_row[i] != ids_row[i - 1]:
            out.append((start, i))
            start = i
    return out


# row 0: four documents (one longer than 2L: log-length scale and XPOS blocks inside it);
# row 1: two documents
IDS = torch.stack([torch.repeat_interleave(torch.arange(4), torch.tensor([5, 18, 3, 4])),
                   torch.repeat_interleave(torch.arange(2), torch.tensor([11, 19]))])


def test_document_ids_from_eos_and_bos():
    t = torch.tensor([[5, 6, EOS, 7, EOS, BOS, 8, EOS], [BOS, 5, 6, BOS, 7, 8, 9, 9]])
    assert document_ids(t, eos_id=EOS).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2],
                                                    [0, 0, 0, 0, 0, 0, 0, 0]]
    # a BOS right after an EOS starts one document, not two; a BOS alone starts one
    assert document_ids(t, eos_id=EOS, bos_id=BOS).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2],
                                                                [0, 0, 0, 1, 1, 1, 1, 1]]
    docs = Documents(document_ids(t, eos_id=EOS, bos_id=BOS))
    assert docs.positions.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 0, 1, 2, 3, 4]]
    assert docs.starts.tolist() == [[0, 0, 0, 3, 3, 5, 5, 5], [0, 0, 0, 3, 3, 3, 3, 3]]
    with pytest.raises(ValueError, match="EOS or a BOS"):
        document_ids(t)


OPTIONS = [{}, {"window": 4}, {"temperature": {"kind": "log_fit", "a": 0.5, "layers": "all"}},
           {"chunked": 3}]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("opts", OPTIONS, ids=["plain", "window", "log_scale", "chunked"])
def test_packed_equals_alone_on_every_kernel(name, opts):
    s = IDS.shape[1]
    q, k, v = rand_qkv(s)
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    var = make(name, **opts)
    docs = Documents(IDS)
    for impl in ("chunked", "sdpa_mask", "eager"):
        var.impl = impl
        packed = attend(q, k, v, m, var, documents=docs)
        for b in range(B):
            for a, e in spans(IDS[b].tolist()):
                alone = attend(q[b:b + 1, :, a:e], k[b:b + 1, :, a:e], v[b:b + 1, :, a:e], m, var)
                torch.testing.assert_close(packed[b:b + 1, :, a:e], alone, atol=3e-6, rtol=1e-5,
                                           msg=lambda msg: f"{impl} row {b} [{a}, {e}): {msg}")
    # and the mask really masks: without it the second document of row 0 reads the first
    nomask = attend(q, k, v, m, var)
    assert not torch.allclose(nomask[0, :, 5:23], packed[0, :, 5:23], atol=1e-4)


def test_xpos_blocks_count_from_each_document_start():
    s = IDS.shape[1]
    q, k, v = rand_qkv(s, seed=3)
    m = torch.full((H,), 1.1)
    var = make("xpos", xpos=XposConfig(blockwise=True))
    assert var.block == L
    for impl in ("chunked", "sdpa_mask", "eager"):
        var.impl = impl
        packed = attend(q, k, v, m, var, documents=Documents(IDS))
        a, e = 5, 23  # 18 tokens: blocks [0, 8), [8, 16), [16, 18) of the document
        alone = attend(q[:1, :, a:e], k[:1, :, a:e], v[:1, :, a:e], m, var)
        torch.testing.assert_close(packed[:1, :, a:e], alone, atol=3e-6, rtol=1e-5)


def test_gradients_under_the_mask_equal_the_documents_alone():
    """Training path (chunked SDPA under autograd): the gradient of a document's loss reaches only
    that document's inputs, and KERPLE's learned bias parameters get the same gradient."""
    s = IDS.shape[1]
    var = make("kerple_log")
    q, k, v = (x.requires_grad_() for x in rand_qkv(s, seed=4))
    m = torch.ones(H)
    out = attend(q, k, v, m, var, documents=Documents(IDS))
    out[0, :, 5:23].square().sum().backward()
    g_packed = [x.grad.clone() for x in (q, k, v)] + [var.r1_raw.grad.clone()]
    assert all(x.grad[0, :, :5].abs().max() == 0 and x.grad[0, :, 23:].abs().max() == 0
               for x in (q, k, v))
    var.zero_grad()
    qa, ka, va = (x.detach()[:1, :, 5:23].clone().requires_grad_() for x in (q, k, v))
    attend(qa, ka, va, m, var).square().sum().backward()
    for got, want in zip(g_packed[:3], (qa.grad, ka.grad, va.grad)):
        torch.testing.assert_close(got[:1, :, 5:23], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_packed[3], var.r1_raw.grad, atol=1e-5, rtol=1e-5)


def test_flex_block_mask_from_document_ranges():
    """FlexAttention (no autograd) over several 128-token tiles: partial, full and skipped tiles
    built from document ranges give the reference outputs, with and without a window."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    s = 300
    gen = torch.Generator().manual_seed(5)
    lens = [40, 150, 7, 103]
    ids = torch.stack([torch.repeat_interleave(torch.arange(4), torch.tensor(lens)),
                       torch.repeat_interleave(torch.arange(2), torch.tensor([260, 40]))])
    q, k, v = (torch.randn(B, n, s, D, generator=gen) for n in (H, G, G))
    m = torch.tensor([0.8, 1.0, 1.3, 1.7])
    from lenext_dist.attention import paths

    var = make("alibi", window=70)  # one compile (~20 s here): bias score_mod + document tiles
    docs = Documents(ids)
    ref = attend(q, k, v, m, var, eager=True, documents=docs)
    var.impl = "flex"
    with torch.no_grad():
        out = attend(q, k, v, m, var, documents=docs)
    assert not paths._flex_broken  # flex ran (no fallback to the chunked path)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    from lenext_dist.attention import MaskSpec

    bm = docs.flex_block_mask(MaskSpec())  # tiles of 128: [0, 128), [128, 256), [256, 300)
    # row 1: query tile 1 and key tile 0 lie in document 0 alone: a full tile (no mask_mod);
    # query tile 2 holds the end of document 0 and document 1: partial tiles only
    assert bm.full_kv_num_blocks[1, 0].tolist() == [0, 1, 0]
    # row 0: query tile 2 (document 3 only) shares no document with key tile 0: skipped
    assert bm.kv_num_blocks[0, 0, 2] == 2 and bm.full_kv_num_blocks[0, 0, 2] == 0


def test_kv_cache_and_explicit_positions_are_refused_with_documents():
    q, k, v = rand_qkv(IDS.shape[1])
    with pytest.raises(ValueError, match="no KV cache"):
        attend(q[:, :, 1:], k, v, torch.ones(H), make("nope"), documents=Documents(IDS))
    with pytest.raises(ValueError, match="do not match"):
        attend(q[:, :, :10], k[:, :, :10], v[:, :, :10], torch.ones(H), make("nope"),
               documents=Documents(IDS))


# ---- the megatron model and the HF export's model class -----------------------------------------

VOCAB, SEQ = 97, 16




def packed_tokens():
    """[2, 40] tokens: row 0 packs documents of 6, 21 (> 2.5 x the training length 16), 9 and 4
    tokens, each ending in EOS; row 1 the tail of a document, then one of 29 tokens."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(3, VOCAB, (2, 40), generator=gen)
    for b, ends in ((0, (5, 26, 35, 39)), (1, (10, 39))):
        x[b, list(ends)] = EOS
    return x


@pytest.mark.parametrize("position", ALL)
def test_megatron_and_hf_packed_documents_equal_alone(megatron_1rank, position):
    cfg = RunConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_query_groups=2, ffn_hidden_size=96, vocab_size=VOCAB,
                                      seq_length=SEQ),
                    attention=AttentionConfig(position=position, scale_c=1.1, temperature=TemperatureConfig(
                        kind="log_fit", a=0.3, layers="all")))
    meg, hf, *_ = megatron_and_hf(cfg, megatron_1rank, tok={"eos": EOS, "bos": BOS})
    x = packed_tokens()
    ids = document_ids(x, eos_id=EOS)
    assert torch.equal(hf.document_ids(x), ids)
    pos = torch.arange(x.shape[1]).expand_as(x)
    with torch.no_grad():
        meg_packed = meg(x, pos, attention_mask=ids)
        hf_packed = hf(input_ids=x, use_cache=False, document_ids=ids).logits
        torch.testing.assert_close(hf_packed, meg_packed, atol=1e-5, rtol=1e-5)
        for b in range(2):
            for a, e in spans(ids[b].tolist()):
                seg = x[b:b + 1, a:e]
                alone = meg(seg, torch.arange(e - a)[None], attention_mask=None)
                torch.testing.assert_close(meg_packed[b:b + 1, a:e], alone, atol=1e-5, rtol=1e-5)
                alone_hf = hf(input_ids=seg, use_cache=False).logits
                torch.testing.assert_close(hf_packed[b:b + 1, a:e], alone_hf, atol=1e-5,
                                           rtol=1e-5)
        # without the mask the later documents read the earlier ones: different logits
        assert not torch.allclose(meg(x, pos, attention_mask=None)[0, 6:27], meg_packed[0, 6:27],
                                  atol=1e-4)


def test_megatron_training_step_with_document_ids(megatron_1rank):
    """Forward + backward with document ids as the attention mask (per-token loss, finite grads)."""
    from lenext_dist.model import build_model

    cfg = RunConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_query_groups=2, ffn_hidden_size=96, vocab_size=VOCAB,
                                      seq_length=40),
                    attention=AttentionConfig(position="kerple_log"))
    megatron_1rank(5)
    meg = build_model(cfg, device="cpu")
    x = packed_tokens()
    loss = meg(x[:, :-1], torch.arange(39).expand(2, 39),
               attention_mask=document_ids(x[:, :-1], eos_id=EOS), labels=x[:, 1:])
    assert loss.shape == (2, 39) and torch.isfinite(loss).all()
    loss.mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in meg.parameters())
    with pytest.raises(ValueError, match="document ids"):
        meg(x, torch.arange(40).expand(2, 40), attention_mask=torch.ones(2, 1, 40, 40,
                                                                        dtype=torch.bool))


def test_rows_of_one_document_keep_the_causal_fast_path():
    """No document boundary in the batch: the plain causal function, bitwise (same kernels)."""
    s = 20
    q, k, v = rand_qkv(s, seed=6)
    m = torch.ones(H)
    docs = Documents(torch.zeros(B, s, dtype=torch.long))
    assert docs.single and not Documents(IDS).single
    for name in ("nope", "rope", "alibi"):
        var = make(name)
        assert torch.equal(attend(q, k, v, m, var, documents=docs), attend(q, k, v, m, var))
    # one row of one document, the other of two: still masked (every row must be single)
    mixed = torch.stack([torch.zeros(s, dtype=torch.long), (torch.arange(s) >= 8).long()])
    assert not Documents(mixed).single
    var = make("nope")
    packed = attend(q, k, v, m, var, documents=Documents(mixed))
    torch.testing.assert_close(packed[1:, :, 8:], attend(q[1:, :, 8:], k[1:, :, 8:], v[1:, :, 8:], m, var))
