"""One declaration per option (lenext_dist/flags.py, issue 35): the parser is written from the
dataclass fields, so a flag and its field share name, default, check and message."""
import argparse
import re
from dataclasses import dataclass, fields
from typing import Optional

import pytest

from lenext_dist.errors import UserError
from lenext_dist.flags import pos_int
from lenext_dist.flags import add_flags, check_fields, from_args, option


@dataclass(kw_only=True)
class Toy:
    name: str = option(check=str, required=True, help="a name")
    size: int = option(3, pos_int, "how many", group="sizes")
    mode: str = option("a", choices=("a", "b"), group="sizes")
    files: list[str] = option(default_factory=lambda: ["x"], nargs="+")
    fast: bool = option(False, action="store_true")
    seen: Optional[int] = None  # no flag: not on the command line

    def __post_init__(self):
        check_fields(self, lambda m: UserError(f"toy: {m}"))


def _parse(argv):
    p = argparse.ArgumentParser(prog="toy", exit_on_error=False)
    add_flags(p, Toy)
    return p, p.parse_args(argv)


def test_the_parser_is_written_from_the_fields():
    p, args = _parse(["--name", "n", "--mode", "b", "--files", "y", "z", "--fast"])
    assert from_args(Toy, args) == Toy(name="n", size=3, mode="b", files=["y", "z"], fast=True)
    assert [g.title for g in p._action_groups][-1] == "sizes"
    assert "how many" in p.format_help() and "--seen" not in p.format_help()
    with pytest.raises(argparse.ArgumentError, match="argument --size: must be > 0, got 0"):
        _parse(["--name", "n", "--size", "0"])


def test_a_value_given_in_code_gets_the_flags_check_and_message():
    assert Toy(name="n", size="4").size == 4
    with pytest.raises(UserError, match=r"^toy: argument --size: must be > 0, got 0$"):
        Toy(name="n", size=0)


def test_every_extend_option_is_a_flag_with_its_field_default():
    from lenext_dist.extend.cli import build_parser
    from lenext_dist.extend.workflow import ExtendOptions

    args = build_parser().parse_args(["--base", "runs/x", "--targets", "256,512"])
    assert set(vars(args)) == {f.name for f in fields(ExtendOptions)}
    assert from_args(ExtendOptions, args) == ExtendOptions(base="runs/x", targets=[256, 512])
    with pytest.raises(UserError, match=r"^lenext extend: argument --min-value: expected a number, got 'x'$"):
        ExtendOptions(base="runs/x", targets=[256], min_value="x")


def test_every_eval_option_is_a_flag_of_its_kind():
    from lenext_dist.eval.cli import build_parser
    from lenext_dist.eval.jobs import JOBS, EvalError, PplJob

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for kind, cls in JOBS.items():
        assert {a.dest for a in sub.choices[kind]._actions} - {"help"} == {f.name for f in fields(cls)}
    with pytest.raises(EvalError, match=r"^lenext eval ppl: the following arguments are required: --model$"):
        PplJob(data=["d"], lengths=[128])
    with pytest.raises(EvalError, match=r"required: --model, --data, --lengths$"):  # argparse's words
        PplJob()


@pytest.mark.parametrize("value", ["-5", "0", "99999", "abc", "80.5"])
def test_a_port_out_of_range_is_refused_by_train_and_extend_before_anything_starts(value):
    """`lenext train --port -5` failed in torch's store once per rank; `lenext extend --port 99999`
    (or --zero-stage 7) after the export and the sweep, minutes later: both at the parser now."""
    from lenext_dist.extend.cli import build_parser as extend_parser
    from lenext_dist.extend.workflow import ExtendOptions
    from lenext_dist.train.cli import build_parser as train_parser

    said = rf"argument --port: expected a port number 1-65535, got '{re.escape(value)}'"
    with pytest.raises(argparse.ArgumentError, match=said):
        train_parser(argparse.ArgumentParser(exit_on_error=False)).parse_args(["--nproc", "2", "--port", value])
    extend = extend_parser(argparse.ArgumentParser(exit_on_error=False))
    with pytest.raises(argparse.ArgumentError, match=said):
        extend.parse_args(["--base", "runs/x", "--targets", "256", "--port", value])
    with pytest.raises(UserError, match=rf"^lenext extend: {said}$"):
        ExtendOptions(base="runs/x", targets=[256], port=value)
    assert train_parser().parse_args(["--port", "65535"]).port == 65535
    assert ExtendOptions(base="runs/x", targets=[256], port="1").port == 1


def test_extend_refuses_a_zero_stage_past_3():
    from lenext_dist.extend.cli import build_parser
    from lenext_dist.extend.workflow import ExtendOptions

    said = r"argument --zero-stage: must be 0, 1, 2 or 3 \(a ZeRO stage\), got 7"
    with pytest.raises(argparse.ArgumentError, match=said):
        build_parser(argparse.ArgumentParser(exit_on_error=False)).parse_args(
            ["--base", "runs/x", "--targets", "256", "--zero-stage", "7"])
    assert [ExtendOptions(base="x", targets=[256], zero_stage=z).zero_stage for z in (0, "3")] == [0, 3]
