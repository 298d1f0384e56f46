"""`python -m lenext_dist.extend ...` = `lenext extend ...`."""
import sys

from .cli import main

sys.exit(main())
