"""Tiny randomly initialized causal LMs for tests and benchmarks (test fixtures: not part of the package).

`tiny_llama()` builds a plain `transformers.LlamaForCausalLM` (2 layers, hidden 32, GQA);
`save_tiny_model(dir)` writes it with `save_pretrained` plus a SentencePiece `tokenizer.model`,
i.e. the layout of an exported model directory.
"""
from __future__ import annotations

import os
import shutil
from typing import NamedTuple, Optional

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/.. = the checkout
SAMPLE_TOKENIZER = os.path.join(REPO, "data", "sample", "tokenizer.model")


def tiny_llama(*, vocab_size: int = 4096, hidden: int = 32, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, train_length: int = 128, seed: int = 0,
               rope: bool = True):
    """A random LlamaForCausalLM in eval mode (fp32). rope=False makes RoPE an identity
    (theta so large that every angle is ~0: a stand-in for NoPE)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=train_length,
                      rope_theta=10000.0 if rope else 1e30, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the 0.02 init: sharper, position-dependent attention
        for name, p in model.named_parameters():
            if "proj" in name:
                p.mul_(5.0)
    return model.eval()


def save_tiny_model(out_dir: str, tokenizer: Optional[str] = None, **kw) -> str:
    """Save a tiny Llama + tokenizer.model to out_dir (an HF model directory); returns out_dir."""
    model = tiny_llama(**kw)
    model.save_pretrained(out_dir)
    shutil.copy(tokenizer or SAMPLE_TOKENIZER, os.path.join(out_dir, "tokenizer.model"))
    return out_dir


def random_docs(lengths, vocab_size: int = 4096, seed: int = 0):
    """EvalDocs of random token ids (for protocol tests that need no tokenizer)."""
    from lenext_dist.eval.data import EvalDoc

    rng = np.random.default_rng(seed)
    return [EvalDoc(f"doc{i}", "<random>", rng.integers(3, vocab_size, n).astype(np.int64))
            for i, n in enumerate(lengths)]


class one_thread:
    """Context manager: torch on one CPU thread (tiny models on a shared, busy machine spend
    most of their time in OpenMP spin-waits with more), restored on exit."""

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)
        return False


def tiny_lenext(position: str = "nope", *, vocab_size: int = 4096, hidden: int = 32,
                layers: int = 2, heads: int = 4, kv_heads: int = 2, train_length: int = 128,
                scale_c: float = 1.0, seed: int = 0, attention_options: Optional[dict] = None):
    """A random `LenextForCausalLM` (lenext_dist.hf, in process) in eval mode, with the config
    fields and auto_map of an export."""
    from lenext_dist.hf import LenextConfig, LenextForCausalLM
    from lenext_dist.hf.configuration_lenext import LENEXT_FORMAT, LENEXT_ROPE_GUARD

    cfg = LenextConfig(
        architectures=["LenextForCausalLM"],
        auto_map={"AutoConfig": "configuration_lenext.LenextConfig",
                  "AutoModel": "modeling_lenext.LenextModel",
                  "AutoModelForCausalLM": "modeling_lenext.LenextForCausalLM"},
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=train_length, rope_parameters=dict(LENEXT_ROPE_GUARD),
        position=position, rope={"base": 10000.0, "scaling": "none", "factor": 1.0},
        scale_c=scale_c, train_length=train_length, head_scale_source="uniform",
        attention_options=attention_options or {}, lenext_format=LENEXT_FORMAT,
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = LenextForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "proj" in name:
                p.mul_(5.0)
    return model.eval()


def save_tiny_lenext(out_dir: str, tokenizer: Optional[str] = None, **kw) -> str:
    """A random lenext model written like an export (weights, config with auto_map, the shipped
    modeling files, the flattened attention copy, tokenizer.model): loadable offline with
    `AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)`."""
    from pathlib import Path

    from lenext_dist.convert.export import ship_code

    model = tiny_lenext(**kw)
    model.save_pretrained(out_dir)
    ship_code(Path(out_dir))
    shutil.copy(tokenizer or SAMPLE_TOKENIZER, os.path.join(out_dir, "tokenizer.model"))
    return out_dir


class MegatronAndHF(NamedTuple):
    meg: torch.nn.Module        # megatron-core GPTModel, eval mode
    hf: torch.nn.Module         # LenextForCausalLM with the same weights, eval mode
    state: dict                 # megatron's tensors
    hf_state: dict              # the same through the export's key map


def megatron_and_hf(cfg, init_megatron, *, seed: int = 11, jitter: float = 0.1,
                    gain: Optional[float] = None, tok: Optional[dict] = None) -> MegatronAndHF:
    """A megatron model of RunConfig `cfg` and the custom HF model holding its weights through the
    export's key map: the pair every megatron == export test compares. Weights leave their init so
    that a swapped key or a dropped path shows: every vector + U(0, jitter) (norms and scales away
    from 1); every matrix x `gain` where given (position-dependent attention needs larger
    projections), else + U(0, jitter) too. Checks the key map's round trip, and that the HF model
    lacks no weight but those an export may leave out (uniform head scales, a tied lm_head)."""
    from lenext_dist.convert.export import build_hf_config
    from lenext_dist.convert.keymap import Shape, hf_to_megatron, megatron_to_hf
    from lenext_dist.hf import LenextForCausalLM
    from lenext_dist.model import build_model

    init_megatron(seed)
    meg = build_model(cfg, device="cpu").eval()
    with torch.no_grad():
        for p in meg.parameters():
            p.mul_(gain) if gain is not None and p.dim() > 1 else p.add_(torch.rand_like(p) * jitter)
    state = {k: v for k, v in meg.state_dict().items() if isinstance(v, torch.Tensor)}
    shape = Shape.from_run_config(cfg)
    hf_state = megatron_to_hf(state, shape)
    back = hf_to_megatron(hf_state, shape)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in back)
    hf = LenextForCausalLM(build_hf_config(cfg, scale_c=cfg.attention.scale_c,
                                           head_scale_source="uniform", tok=tok, source={},
                                           dtype="float32")).eval()
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    assert not unexpected, unexpected
    assert all(k.endswith("head_scale") or k == "lm_head.weight" for k in missing), missing
    return MegatronAndHF(meg, hf, state, hf_state)
