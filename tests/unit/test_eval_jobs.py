"""The typed evaluation jobs (lenext_dist/eval/jobs.py) without running a model: the checks give
the CLI's one-line messages, jobs pickle (a caller may run them in workers), and each job names
its result file from its own options (what `lenext eval` writes, see test_eval_cli.py)."""
import pickle
import re

import pytest

from lenext_dist.cli import main
from lenext_dist.eval.jobs import EntropyJob, EvalError, PasskeyJob, PplJob, ScaleSweepJob


@pytest.mark.parametrize("flag,value,message", [
    ("--lengths", "32,0", "argument --lengths: must be > 0, got 0"),
    ("--threads", "0", "argument --threads: must be > 0, got 0"),
    ("--temperature", "log_fit:a=nan", "argument --temperature: a: must be finite, got 'nan'"),
    ("--temperature", "llama4:c=2", "argument --temperature: attention.temperature.c is not read by kind 'llama4' "
     "(it reads ['floor_scale', 'attn_scale'])"),
    ("--temperature", "warm", "argument --temperature: unknown attention.temperature.kind 'warm'; "
     "registered: ['llama4', 'log_fit', 'none', 'qwen_logn', 'ssmax', 'uniform']"),
    ("--scale-c", "-1", "argument --scale-c: must be > 0, got -1"),
])
def test_a_bad_option_reads_the_same_in_process_and_on_the_command_line(flag, value, message, capsys):
    kwargs = {"model": "m", "data": ["d"], "lengths": [32], flag[2:].replace("-", "_"): value}
    with pytest.raises(EvalError) as e:
        PplJob(**kwargs)
    assert str(e.value) == f"lenext eval ppl: {message}"
    with pytest.raises(SystemExit) as e:
        base = ["--lengths", "32"] if flag != "--lengths" else []
        main(["eval", "ppl", "--model", "m", "--data", "d", *base, flag, value])
    assert e.value.code == 2 and f"lenext eval ppl: error: {message}" in capsys.readouterr().err


def test_an_entropy_window_of_one_token_is_refused_by_its_flag(capsys):
    """--length 1 ran the model, then failed with numpy's "need at least one array to stack"."""
    message = "argument --length: must be >= 2 (a window of one token has nothing to measure), got 1"
    with pytest.raises(EvalError, match=re.escape(message)):
        EntropyJob(model="m", data=["d"], length=1)
    with pytest.raises(SystemExit) as e:
        main(["eval", "entropy", "--model", "m", "--data", "d", "--length", "1"])
    assert e.value.code == 2 and f"lenext eval entropy: error: {message}" in capsys.readouterr().err
    assert EntropyJob(model="m", data=["d"], length=2).length == 2


@pytest.mark.parametrize("out,says", [
    ("file", "a file where a folder is needed; pass a folder to --out"),
    ("x" * 300, "a name too long for the file system; pass a shorter --out"),
])
def test_an_out_that_cannot_be_a_results_folder_names_out(tmp_path, capsys, out, says):
    """--out a file said "<file>/ppl_last-stride.json: not a readable result (NotADirectoryError)",
    a 300-character --out "(OSError)": neither names --out nor what is wrong with it."""
    (tmp_path / "file").write_text("a file\n")
    out = str(tmp_path / out)
    assert main(["eval", "ppl", "--model", "m", "--data", "d", "--lengths", "32", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out}: {says}\n"
    assert (tmp_path / "file").read_text() == "a file\n"


def test_cross_option_checks_before_any_model_loads():
    with pytest.raises(EvalError, match="--c-min 2 > --c-max 1: swap them"):
        ScaleSweepJob(model="m", data=["d"], length=64, c_min=2.0, c_max=1.0)
    with pytest.raises(EvalError, match="--scale-c makes no sense with scale-sweep"):
        ScaleSweepJob(model="m", data=["d"], length=64, scale_c=1.2)
    with pytest.raises(EvalError, match="required: --data"):
        PplJob(model="m", lengths=[32])


def test_jobs_pickle_and_name_their_results_from_their_options(tmp_path):
    jobs = [PplJob(model="m", out=str(tmp_path), data=["d"], lengths="32,64", scale_c=1.2, window=64),
            PplJob(model="m", out=str(tmp_path), data=["d"], lengths=[64], protocol="full",
                   rope_scaling="ntk", rope_factor=4),
            PasskeyJob(model="m", out=str(tmp_path), lengths=[100], depths=5,
                       temperature="log_fit:a=0.25,layers=all"),
            EntropyJob(model="m", out=str(tmp_path), data=["d"], length=64, scale_c=1.5),
            ScaleSweepJob(model="m", out=str(tmp_path), data=["d"], length=64)]
    assert [pickle.loads(pickle.dumps(j)) for j in jobs] == jobs
    assert [j.result_path.name for j in jobs] == [
        "ppl_last-stride_c1.2_w64.json", "ppl_full_ntk4.json", "passkey_t-log_fit-a0.25-layers-all.json",
        "entropy_c1.5_64.json", "scale_sweep.json"]
    assert jobs[3].npz_path.name == "entropy_c1.5_64.npz"
    assert jobs[0].lengths == [32, 64] and jobs[2].depths == "5"
    assert not jobs[0].done()
    jobs[0].result_path.write_text("{}")
    assert jobs[0].done()
    assert PplJob(model="runs/x/", data=["d"], lengths=[8]).out_dir.as_posix() == "results/x"
