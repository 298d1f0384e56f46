"""flags.Parser, the parser of every command: one line for a mistake, a flag given once."""
import argparse

import pytest

from lenext_dist.cli import main
from lenext_dist.config import ConfigError, load_config, split_cli_overrides
from lenext_dist.flags import Parser


def _parser() -> Parser:
    p = Parser(prog="tool")
    p.add_argument("--lengths", type=int)
    p.add_argument("--verify", action=argparse.BooleanOptionalAction)
    p.add_argument("--tag", action="append")
    p.add_argument("-v", action="count", default=0)
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("run")
    s.add_argument("--lengths", type=int)
    return p


@pytest.mark.parametrize("argv, says", [
    (["--lengths", "1", "--lengths", "2"], "argument --lengths: given twice"),
    (["--lengths=1", "--lengths", "2"], "argument --lengths: given twice"),
    (["--len", "1", "--lengths=2"], "argument --len and --lengths: given twice"),  # a prefix
    (["--verify", "--no-verify"], "argument --verify and --no-verify: given twice"),
    (["--lengths", "x"], "argument --lengths: invalid int value: 'x'"),
    (["run", "--lengths", "1", "--lengths", "2"], "argument --lengths: given twice"),
])
def test_a_mistake_is_one_line_that_names_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err
    assert err.startswith(("tool: error: " + says, "tool run: error: " + says))
    assert err.rstrip().endswith("--help)")


def test_flags_that_collect_may_repeat_and_subcommands_own_their_flags():
    a = _parser().parse_args(["--tag", "a", "--tag", "b", "-v", "-v", "--lengths", "1",
                              "run", "--lengths", "2"])
    assert a.tag == ["a", "b"] and a.v == 2 and a.lengths == 2  # the subcommand's, set once


def test_every_command_refuses_a_repeated_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "ppl", "--model", "m", "--lengths", "128", "--lengths", "256"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("lenext eval ppl: error: argument --lengths: given twice (the "
                                       "last would silently win); give it once (see lenext eval ppl "
                                       "--help)\n")


def test_a_config_override_given_twice_on_a_command_line_is_refused():
    with pytest.raises(ConfigError, match=r"optim.lr given twice \('optim.lr=1e-3', then "
                                          r"'optim.lr=2e-3'\); give it once"):
        split_cli_overrides(["--optim.lr=1e-3", "--optim.lr", "2e-3"])
    assert split_cli_overrides(["--optim.lr=1e-3", "optim.min_lr_ratio=0.1"]) == [
        "optim.lr=1e-3", "optim.min_lr_ratio=0.1"]
    # code composing its overrides may override its own (a base list, then a variant's)
    assert load_config(None, ["optim.lr=1e-3", "optim.lr=2e-3"]).optim.lr == 2e-3


def test_no_command_builds_a_plain_argparse_parser():
    """A new command made with argparse.ArgumentParser would print the usage block again and take
    a repeated flag's last value: every parser is a flags.Parser (or a subparser of one)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    plain = [str(f.relative_to(repo)) for d in ("lenext_dist", "launch", "data_prep", "experiments")
             for f in (repo / d).rglob("*.py")
             if "argparse.ArgumentParser(" in f.read_text() and "/tests/" not in str(f)]
    assert plain == []
