"""lenext_dist/quiet.py hides exactly the warnings it names, and megatron's really are among them."""
import subprocess
import sys

CHILD = """
import warnings, sys
from lenext_dist.quiet import install
install()
warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
warnings.warn("Apex is not installed. Falling back to Torch Norm")
warnings.warn("something else entirely")
warnings.warn("Apex is not installed. Falling back to Torch Norm", DeprecationWarning)  # other category
import megatron.core.optimizer  # warns at import without TE/Apex
"""


def test_only_the_named_warnings_are_hidden(repo):
    p = subprocess.run([sys.executable, "-W", "default", "-c", CHILD], cwd=repo, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "something else entirely" in p.stderr
    assert "DeprecationWarning: Apex is not installed" in p.stderr
    assert "UserWarning: Apex is not installed" not in p.stderr
    assert "Transformer Engine and Apex" not in p.stderr
