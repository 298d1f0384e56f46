"""`python -m lenext_dist.gpu ...` (what `make gpu-check` runs)."""
import sys

from .cli import main

sys.exit(main())
