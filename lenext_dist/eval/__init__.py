"""Evaluation of exported HF models (DESIGN section 4): sliding-window perplexity (three named
protocols), extrapolation penalty and context use, passkey retrieval, attention entropy, the
uniform-scale sweep with its log-length fit, plots and a markdown report.

Modules: `data` (documents), `scoring` (batched per-token losses), `ppl`, `passkey`, `entropy`,
`scale_sweep`, `adapter` (the only module that knows the attention layout), `plots`, `report`,
`jobs` (the typed evaluation jobs: options, `run()`, result paths; used in process by every caller),
`options` (the option checks), `model_io` (loading, the model's record, JSON), `cli` (`lenext eval ...`
-> a job), `claims` (the paper's claims on measured numbers, for `lenext extend`). The tiny
random models of the tests and benchmarks live in tests/tiny_models.py.
"""
from .adapter import capture_qk, head_scales, set_head_scales, set_uniform_scale, train_length
from .data import DocSet, EvalDoc, load_documents, load_tokenizer
from .entropy import entropy_by_position, entropy_from_probs, evaluate_entropy
from .passkey import build_prompt, passkey_match, run_passkey
from .ppl import PROTOCOLS, context_diagnostics, evaluate_ppl, plan_windows, run_ppl
from .scale_sweep import best_c_for_length, fit_log_scale, run_scale_sweep
from .scoring import Window, score_windows

__all__ = ["capture_qk", "head_scales", "set_head_scales", "set_uniform_scale", "train_length",
           "DocSet", "EvalDoc", "load_documents", "load_tokenizer", "entropy_by_position",
           "entropy_from_probs", "evaluate_entropy", "build_prompt", "passkey_match",
           "run_passkey", "PROTOCOLS", "context_diagnostics", "evaluate_ppl", "plan_windows",
           "run_ppl", "best_c_for_length", "fit_log_scale", "run_scale_sweep", "Window",
           "score_windows"]
