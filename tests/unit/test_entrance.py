"""One way in (issue 44): the Makefile, the README, docs/ and the Slurm job scripts run every stage
through `lenext` (or the package's modules), never a script of the checkout's launch/ or data_prep/
folders; those scripts stay as aliases for cluster users, each the package's own command."""
import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = re.compile(r"\b(?:launch|data_prep)/\w+\.py\b")


def _places():
    yield REPO / "Makefile"
    yield REPO / "README.md"
    yield from sorted((REPO / "docs").glob("*.md"))
    yield from sorted((REPO / "launch" / "slurm").glob("*.sbatch"))


def test_makefile_readme_docs_and_slurm_call_no_checkout_script():
    """A line may name a checkout script only to say it is an alias (the docs keep them known)."""
    bad = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in _places()
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if SCRIPT.search(line) and "alias" not in line]
    assert not bad, "\n".join(bad)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
            for a in n.names}


def test_each_alias_is_the_package_command():
    """data_prep/X.py and launch/pretrain.py import the very function their `lenext` verb (or the
    package module) runs, and nothing else of the package."""
    from lenext_dist.prep import cli as prep_cli

    expected = {
        "data_prep/shard.py": {"lenext_dist.prep.cli.shard_main", "lenext_dist.errors.entry_point"},
        "data_prep/train_tokenizer.py": {"lenext_dist.prep.cli.train_tokenizer_main"},
        "data_prep/build_sample.py": {"lenext_dist.prep.cli.build_sample_main"},
        "data_prep/build_kv.py": {"lenext_dist.prep.kv_corpus.main"},
        "launch/pretrain.py": {"lenext_dist.train.cli.rank_main"},
        "launch/hostfile.py": {"lenext_dist.cluster.__main__.hostfile_main"},
    }
    for script, names in expected.items():
        assert {n for n in _imports(REPO / script) if n.startswith("lenext_dist")} == names, script
    # ... and `lenext prep VERB` dispatches to the same functions
    assert set(prep_cli.PREP_VERBS) == {"shard", "merge", "tokenizer", "sample", "kv"}
    train_main = (REPO / "lenext_dist" / "train" / "__main__.py").read_text()
    assert "rank_main()" in train_main  # python -m lenext_dist.train == launch/pretrain.py


def test_the_extending_guide_names_only_files_that_exist():
    """docs/extending.md is linked from the README, and every repository path it names exists."""
    text = (REPO / "docs" / "extending.md").read_text()
    assert "docs/extending.md" in (REPO / "README.md").read_text()
    paths = set(re.findall(r"`((?:lenext_dist|tests|docs|experiments|configs)/[\w/.]+)`", text))
    paths |= set(re.findall(r"^# ((?:lenext_dist|tests)/[\w/.]+\.py)$", text, re.M))
    assert len(paths) >= 15
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, missing


def test_sigterm_unwinds_through_finally_blocks_and_restores_the_handler(capsys):
    """`kill PID` of a command inside sigterm_unwinds: SystemExit(143) instead of death mid-write,
    so its finally blocks (staging folders, workers, locks) run; the handler before comes back."""
    import os
    import signal
    import time

    from lenext_dist.errors import sigterm_unwinds

    before = signal.getsignal(signal.SIGTERM)
    ran = []
    with pytest.raises(SystemExit) as e:
        with sigterm_unwinds("stopped by SIGTERM: rerun it"):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises at the next bytecode, well before
            finally:
                ran.append("cleaned")
    assert e.value.code == 143 and ran == ["cleaned"]
    assert "stopped by SIGTERM: rerun it" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
