"""`python -m lenext_dist.study ...` (see cli.py)."""
import sys

from .cli import main

sys.exit(main())
