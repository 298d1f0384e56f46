"""The mutation pass's list (tests/mutation/mutations.py; `make mutation`, not part of `make test`)
stays plantable: each entry's file exists and holds its original text exactly once, and its test
files exist. Checked here, in the unit tier, so that a refactor that moves the code a mutation
plants into is found when it lands, not at the next mutation pass."""
import sys
from pathlib import Path

MUTATION = Path(__file__).resolve().parents[1] / "mutation"


def test_every_mutation_can_be_planted():
    sys.path.insert(0, str(MUTATION))
    try:
        from mutations import MUTATIONS
        from run import check
    finally:
        sys.path.remove(str(MUTATION))
    assert check(MUTATIONS) == []
