"""Activation checkpointing of our layers: same loss and gradients, less activation memory kept."""
import torch

from lenext_dist.config import load_config
from lenext_dist.model import build_model, init_megatron, init_single_process_group


def _loss_and_grads(recompute: bool):
    cfg = load_config(None, ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
                             "model.vocab_size=128", "model.seq_length=32",
                             f"train.activation_checkpointing={str(recompute).lower()}"])
    init_single_process_group()
    init_megatron(0)
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu")
    ids = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        loss = model(input_ids=ids[:, :-1], position_ids=None, attention_mask=None, labels=ids[:, 1:]).mean()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, sum(saved)


def test_recompute_matches_and_saves_fewer_activations():
    loss0, grads0, saved0 = _loss_and_grads(False)
    loss1, grads1, saved1 = _loss_and_grads(True)
    assert loss0 == loss1
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], rtol=0, atol=1e-6, msg=name)
    assert saved1 < saved0 / 2
