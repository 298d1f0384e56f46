"""Every command's `--help` is for users: a one-line purpose, an example, and none of the code's
internal names (registries, modules, function names, issue numbers)."""
import functools
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

INTERNAL = re.compile(
    r"SUBCOMMANDS|build_parser|job_from_args|ExtendOptions|RunConfig|registered in|\bregistry\b"
    r"|\bREADME\b|\bDESIGN\b|\bissue \d+"
    r"|\b(?:lenext_dist|study|eval|prep|train|extend|config|convert|model|attention)/[\w/]*\.py\b")


def _script(path: str):
    spec = importlib.util.spec_from_file_location(f"_cli_{Path(path).stem}", REPO / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def _lenext():
    from lenext_dist.cli import main

    return main


def _shard():
    from lenext_dist.prep.cli import shard_main

    return functools.partial(shard_main, prog="data_prep/shard.py")


def _prep(name, prog):
    def load():
        from lenext_dist.prep import cli

        return functools.partial(getattr(cli, name), prog=prog)
    return load


def _build_kv():
    from lenext_dist.prep.kv_corpus import main

    return functools.partial(main, prog="data_prep/build_kv.py")


def _convert():
    from lenext_dist.convert.__main__ import main

    return main


def _train_rank():
    from lenext_dist.train.cli import rank_main

    return rank_main


def _nope_length():
    from experiments.nope_length.study import main

    return main


def _nope_layouts():
    from experiments.nope_layouts.study import main

    return main


def _stage2():
    from experiments.stage2.study import main

    return main


def _sizes():
    from experiments.sizes.study import main

    return main


def _probe():
    from experiments.nope_length.probe import main

    return main


def _gpu_check():
    from lenext_dist.gpu.cli import main

    return main


def _wheelhouse():
    from lenext_dist.gpu.wheelhouse import main

    return main


# (the command as a user types it, the main to call, its argv before --help)
COMMANDS = [
    ("lenext", _lenext, []),
    ("lenext prep", _lenext, ["prep"]),
    ("lenext prep merge", _lenext, ["prep", "merge"]),
    ("lenext prep tokenizer", _lenext, ["prep", "tokenizer"]),
    ("lenext prep sample", _lenext, ["prep", "sample"]),
    ("lenext prep kv", _lenext, ["prep", "kv"]),
    ("lenext train", _lenext, ["train"]),
    ("lenext convert", _lenext, ["convert"]),
    ("lenext eval", _lenext, ["eval"]),
    ("lenext eval ppl", _lenext, ["eval", "ppl"]),
    ("lenext eval passkey", _lenext, ["eval", "passkey"]),
    ("lenext eval tasks", _lenext, ["eval", "tasks"]),
    ("lenext eval entropy", _lenext, ["eval", "entropy"]),
    ("lenext eval scale-sweep", _lenext, ["eval", "scale-sweep"]),
    ("lenext eval ruler", _lenext, ["eval", "ruler"]),
    ("lenext report", _lenext, ["report"]),
    ("lenext extend", _lenext, ["extend"]),
    ("python data_prep/shard.py", _shard, []),
    ("python data_prep/shard.py merge", _shard, ["merge"]),
    ("python data_prep/train_tokenizer.py", _prep("train_tokenizer_main", "data_prep/train_tokenizer.py"), []),
    ("python data_prep/build_sample.py", _prep("build_sample_main", "data_prep/build_sample.py"), []),
    ("python data_prep/build_kv.py", _build_kv, []),
    ("python launch/pretrain.py", lambda: _script("launch/pretrain.py"), []),
    ("python -m lenext_dist.train", _train_rank, []),
    ("python launch/hostfile.py", lambda: _script("launch/hostfile.py"), []),
    ("python -m lenext_dist.convert", _convert, []),
    ("python -m experiments.nope_length", _nope_length, []),
    ("python -m experiments.nope_length.probe", _probe, []),
    ("python -m experiments.nope_layouts", _nope_layouts, []),
    ("python -m experiments.stage2", _stage2, []),
    ("python -m experiments.sizes", _sizes, []),
    ("python -m lenext_dist.gpu", _gpu_check, []),
    ("python -m lenext_dist.gpu.wheelhouse", _wheelhouse, []),
]


def help_text(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command,main,argv", COMMANDS,
                         ids=[(c.values if hasattr(c, "values") else c)[0] for c in COMMANDS])
def test_help_has_purpose_example_and_no_internal_names(command, main, argv, capsys):
    text = help_text(main(), argv, capsys)
    lines = text.splitlines()
    # the first line after the usage block says what the command does, in one sentence
    start = next(i for i, line in enumerate(lines) if line.startswith("usage:"))
    body = lines[start + 1:]
    while body and body[0].strip() and body[0].startswith(" "):  # usage continuation lines
        body = body[1:]
    purpose = next(line for line in body if line.strip())
    assert not purpose.startswith(("positional", "options")), f"{command}: no description"
    assert purpose.rstrip().endswith("."), f"{command}: purpose line {purpose!r} is not one sentence"
    assert len(purpose) <= 110, f"{command}: purpose line is longer than one line"
    # an example: a line under an `example(s):` heading that runs the command
    m = re.search(r"^examples?\b.*:\n((?:  .*\n?)+)", text, re.M)
    assert m, f"{command}: no `example:` section"
    base = command.split()[1] if command.startswith("python ") else command.split()[0]
    base = base if base != "-m" else command.split()[2]
    assert base in m.group(1), f"{command}: the example does not run {base}"
    bad = INTERNAL.findall(text)
    assert not bad, f"{command}: internal names in --help: {bad}"


def test_lenext_help_lists_every_verb_once_without_importing_torch():
    """`lenext --help` builds no command's parser: no torch import (a fresh interpreter), and the
    verbs it prints are exactly cli.SUBCOMMANDS, the one list of them."""
    import subprocess
    import sys

    code = ("import sys\nfrom lenext_dist.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("TORCH False"), p.stdout + p.stderr
    from lenext_dist.cli import SUBCOMMANDS

    listed = re.findall(r"^    (\w+)  ", p.stdout, re.M)
    assert listed == list(SUBCOMMANDS)


@pytest.mark.parametrize("verb", [["eval"], ["eval", "ppl"], ["report"], ["extend"], ["train"], ["prep"],
                                  ["convert"]])
def test_a_verbs_help_imports_no_torch(verb):
    """Issue 44, item 4: `lenext VERB --help` answers at once (eval's kinds come from the job
    classes, whose module and the eval package load without torch; the convert package imports
    none of its modules)."""
    import subprocess
    import sys

    code = (f"import sys\nfrom lenext_dist.cli import main\ntry:\n    main({verb + ['--help']!r})\n"
            "except SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("TORCH False"), p.stdout[-500:] + p.stderr
