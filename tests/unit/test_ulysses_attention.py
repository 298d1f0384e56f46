"""Ulysses attention on 2 real gloo processes (no engine, so it is fast enough for the unit tier
and the mutation pass): the megatron model with parallel.ulysses_size 2 on sequence shards gives
the per-token losses of the unsharded model, and the shards' losses (over the group's token
count) summed over the ranks give its gradients, m_h and KERPLE's per-head parameters included.
The whole training loop under DeepSpeed is tests/distributed/test_ulysses.py."""
import os
import socket

import torch
import torch.multiprocessing as mp

CASES = {  # overrides of the tiny model (4 heads, 2 KV groups, 32 tokens)
    "kerple_headscale": ["attention.position=kerple_log", "attention.head_scale.enabled=true",
                         "attention.head_scale.init=1.3", "attention.head_scale.trainable=true"],
    # 6 heads, 3 KV groups over 2 ranks: k/v repeated to 6 (group order matters, unlike g = 1)
    "alibi_gqa3": ["attention.position=alibi", "model.num_attention_heads=6",
                   "model.hidden_size=96", "model.num_query_groups=3"],
    "rope_window_logscale": ["attention.position=rope", "attention.window=8",
                             "attention.temperature.kind=log_fit", "attention.temperature.a=0.5",
                             "attention.temperature.layers=all", "model.train_length=8"],
    "xpos_documents": ["attention.position=xpos", "attention.xpos.blockwise=true",
                       "data.document_mask=true"],
    # attention.layout: local RoPE + YaRN layers under a window, a global NoPE layer (each layer
    # its own variant and window), packed documents
    "layout_documents": ["attention.position=rope", "attention.layout.kind=local_global",
                         "attention.layout.every=2", "attention.window=12",
                         "attention.rope.scaling=yarn", "attention.rope.factor=2",
                         "data.document_mask=true"],
    # Llama 4's iRoPE: chunked RoPE layer, global NoPE layer under its temperature (steps every
    # 4 tokens inside each document), packed documents, SSMax-like learned head scales
    "irope_llama4_documents": ["attention.position=rope", "attention.layout.kind=irope",
                               "attention.layout.every=2", "attention.chunked=6",
                               "attention.temperature.kind=llama4",
                               "attention.temperature.floor_scale=4",
                               "attention.temperature.attn_scale=0.5", "data.document_mask=true"],
    # QK-norm (learned RMSNorm weights, gradients summed over the ranks) on the partial-RoPE
    # layers of an interleaved layout, packed documents
    "qk_norm_partial_rope": ["attention.position=rope", "attention.layout.kind=nope_every",
                             "attention.layout.every=2", "attention.rope.fraction=0.5",
                             "attention.qk_norm.kind=rms", "attention.qk_norm.layers=rope",
                             "data.document_mask=true"],
}
BASE = ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
        "model.num_query_groups=2", "model.ffn_hidden_size=128", "model.vocab_size=256",
        "model.seq_length=32", "train.precision=fp32"]


def _worker(rank: int, port: int, out: dict):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist

    from lenext_dist.attention import document_ids
    from lenext_dist.config import load_config
    from lenext_dist.model import build_model, init_megatron, ulysses

    from lenext_dist.train.loop import skip_deepspeed_shm_op

    skip_deepspeed_shm_op()  # no JIT build, no /dev/shm buffer left behind
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, 32), generator=g)
    tokens[:, [5, 20]] = 7  # EOS: three documents per row
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1),
             "loss_mask": (torch.rand(2, 32, generator=g) > 0.2).float(),
             "position_ids": torch.arange(32).expand(2, 32), "document_ids": document_ids(tokens, eos_id=7)}
    for name, over in CASES.items():
        models, outs = {}, {}
        for n in (1, 2):
            cfg = load_config(None, [*BASE, *over, f"parallel.ulysses_size={n}"])
            ulysses.init_sequence_parallel(n)
            init_megatron(1234)  # same seed -> same weights
            models[n] = build_model(cfg, device="cpu")
            b = ulysses.shard_batch(batch)
            docs = b["document_ids"] if cfg.data.document_mask else None
            per_token = models[n](input_ids=b["tokens"], position_ids=b["position_ids"],
                                  attention_mask=docs, labels=b["labels"])  # [b, s/n]
            mask = b["loss_mask"]
            ((per_token * mask).sum() / ulysses.loss_denominator(mask.sum())).backward()
            outs[n] = per_token.detach()  # [b, s] unsharded, [b, s/2] this rank's shard
        lo = ulysses.rank() * 16
        ok_fwd = torch.allclose(outs[2], outs[1][:, lo:lo + 16], rtol=1e-5, atol=1e-5)
        worst = 0.0
        for (k, p1), (_, p2) in zip(models[1].named_parameters(), models[2].named_parameters()):
            assert (p1.grad is None) == (p2.grad is None), k
            if p1.grad is None:
                continue
            grad = p2.grad.clone()
            dist.all_reduce(grad)  # DeepSpeed's sum over the sequence group
            worst = max(worst, float((grad - p1.grad).abs().max() / (p1.grad.abs().max() + 1e-12)))
        if rank == 0:
            out[name] = (ok_fwd, worst, sorted(k for k, _ in models[2].named_parameters()))
    ulysses.init_sequence_parallel(1)
    dist.destroy_process_group()


def test_ulysses2_forward_and_gradients_match_the_unsharded_model():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(port, out), nprocs=2, join=True)
    assert sorted(out) == sorted(CASES)
    for name, (ok_fwd, worst, _keys) in out.items():
        assert ok_fwd, name
        assert worst < 1e-4, (name, worst)
    assert any(k.endswith("head_scale") for k in out["kerple_headscale"][2])
    assert any("position" in k for k in out["kerple_headscale"][2])
    assert sum(k.endswith(("q_norm.weight", "k_norm.weight")) for k in out["qk_norm_partial_rope"][2]) == 2
