"""In the repo: the attention math of the training code, under the name the modeling file imports.

An export replaces this shim by a flattened verbatim copy of lenext_dist/attention/ (written by
lenext_dist.convert.export.write_attention_copy), so `modeling_lenext.py` is the same file in both.
"""
from lenext_dist.attention import *  # noqa: F401,F403
from lenext_dist.attention import __all__  # noqa: F401
