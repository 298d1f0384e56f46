"""optim.no_decay_embeddings: which AdamW group the token embedding lands in (real megatron model)."""
import pytest

from lenext_dist.config import RunConfig, ModelConfig, OptimConfig
from lenext_dist.model import build_model, init_megatron, init_single_process_group
from lenext_dist.train.optim import EMBEDDING, param_groups


def _groups(no_decay: bool, tie: bool):
    init_single_process_group()
    cfg = RunConfig(model=ModelConfig(tie_embeddings=tie), optim=OptimConfig(no_decay_embeddings=no_decay))
    init_megatron(cfg.train.seed)
    model = build_model(cfg, device="meta")
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, cfg.optim.weight_decay, cfg.optim.no_decay_embeddings)
    return {names[id(p)]: g["weight_decay"] for g in groups for p in g["params"]}, cfg.optim.weight_decay


@pytest.mark.parametrize("tie", [False, True])
def test_embedding_group_has_no_weight_decay_when_exempt(tie):
    wd, decay = _groups(True, tie)
    emb = [n for n in wd if n.endswith(EMBEDDING)]
    assert emb and all(wd[n] == 0.0 for n in emb)
    assert decay > 0
    # the other matrices still decay; an untied output layer keeps its decay
    assert any(v == decay for n, v in wd.items() if "linear_qkv" in n)
    out = [n for n in wd if n.endswith("output_layer.weight")]
    assert (out == []) if tie else all(wd[n] == decay for n in out)
    assert all(v == 0.0 for n, v in wd.items() if "norm" in n)


def test_embedding_decays_by_default():
    wd, decay = _groups(False, False)
    emb = [n for n in wd if n.endswith(EMBEDDING)]
    assert emb and all(wd[n] == decay for n in emb)
