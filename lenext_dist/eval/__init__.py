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
import importlib

_HOMES = {"adapter": ("capture_qk", "head_scales", "set_head_scales", "set_uniform_scale", "train_length"),
          "data": ("DocSet", "EvalDoc", "load_documents", "load_tokenizer"),
          "entropy": ("entropy_by_position", "entropy_from_probs", "evaluate_entropy"),
          "passkey": ("build_prompt", "passkey_match", "run_passkey"),
          "options": ("PROTOCOLS",),
          "ppl": ("context_diagnostics", "evaluate_ppl", "plan_windows", "run_ppl"),
          "scale_sweep": ("best_c_for_length", "fit_log_scale", "run_scale_sweep"),
          "scoring": ("Window", "score_windows")}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    """The package's names, imported on first use (PEP 562): `lenext eval --help` and
    `lenext report` load eval/cli.py and eval/report.py without torch."""
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
