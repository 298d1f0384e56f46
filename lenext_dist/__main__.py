"""`python -m lenext_dist ...` == the `lenext` console script."""
import sys

from .cli import main

sys.exit(main())
