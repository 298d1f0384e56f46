"""python -m lenext_dist.convert --checkpoint runs/x/checkpoints --out hf/x [options]
(the same command as `lenext convert`)."""
from __future__ import annotations

import sys

from lenext_dist.errors import entry_point

from .cli import build_parser, run


@entry_point
def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
