"""The real data_prep/shard.py command: kill -9 then resume, Slurm array + merge, errors."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARD = os.path.join(REPO, "data_prep", "shard.py")
SAMPLE = os.path.join(REPO, "data", "sample")
TOKENIZER = os.path.join(SAMPLE, "tokenizer.model")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def _cmd(inputs, out, *more):
    return [sys.executable, SHARD, "--input", inputs, "--format", "slimpajama", "--tokenizer",
            TOKENIZER, "--out", str(out), "--name", "sp", "--valid-fraction", "0.05",
            "--no-progress", *more]


def _outputs(out):
    return {os.path.basename(p): open(p, "rb").read()
            for p in sorted(glob.glob(os.path.join(str(out), "sp_*.*")))}


@pytest.fixture
def many_inputs(tmp_path):
    """24 real input files (the sample's 8, three times), so a run lasts long enough to kill."""
    src = sorted(glob.glob(os.path.join(SAMPLE, "slimpajama", "chunk*", "*.jsonl.zst")))
    for copy in range(3):
        for p in src:
            d = tmp_path / "in" / f"chunk{copy}{os.path.basename(os.path.dirname(p))}"
            d.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, d / os.path.basename(p))
    return str(tmp_path / "in" / "chunk*" / "*.jsonl.zst")


@pytest.mark.e2e
def test_sigkill_then_rerun_is_byte_identical(tmp_path, many_inputs):
    ref = tmp_path / "ref"
    subprocess.run(_cmd(many_inputs, ref), check=True, env=_env(), capture_output=True)
    want = _outputs(ref)
    assert set(want) == {"sp_train.bin", "sp_train.idx", "sp_valid.bin", "sp_valid.idx"}

    out = tmp_path / "killed"
    parts = out / "sp.parts"
    proc = subprocess.Popen(_cmd(many_inputs, out), env=_env(), stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not glob.glob(str(parts / "*.done.json")):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(glob.glob(str(parts / "*.done.json")))
    assert 1 <= done < 24, "the kill must land mid-run"
    assert not os.path.exists(out / "sp_train.bin")

    rerun = subprocess.run(_cmd(many_inputs, out), env=_env(), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{done} already done, {24 - done} to do" in rerun.stderr
    assert _outputs(out) == want
    assert not glob.glob(str(parts / "*tmp-*"))  # the killed run's temp files were cleaned


@pytest.mark.e2e
def test_slurm_array_env_then_merge(tmp_path):
    inputs = os.path.join(SAMPLE, "slimpajama", "chunk1", "*.jsonl.zst")
    out = tmp_path / "arr"
    for task in ("5", "6"):  # --array=5-6: index is relative to SLURM_ARRAY_TASK_MIN
        r = subprocess.run(_cmd(inputs, out), env=_env(SLURM_ARRAY_TASK_ID=task,
                           SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_TASK_MIN="5"),
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert f"task {int(task) - 4}/2: 2 of 4 units of 4 input files" in r.stderr and "merge" in r.stderr
    assert not os.path.exists(out / "sp_train.bin")
    r = subprocess.run([sys.executable, SHARD, "merge", "--out", str(out), "--name", "sp"],
                       env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "done. read" in r.stderr
    # (byte equality of array vs single runs is tested in-process in tests/unit/test_prep_shard.py)
    manifest = json.load(open(out / "sp.manifest.json"))
    assert len(manifest["inputs"]) == 4 and len(manifest["commands"]) == 3  # 2 tasks + merge
    assert set(_outputs(out)) == {"sp_train.bin", "sp_train.idx", "sp_valid.bin", "sp_valid.idx"}


def test_help_and_clear_errors(tmp_path):
    r = subprocess.run([sys.executable, SHARD, "--help"], capture_output=True, text=True, env=_env())
    assert r.returncode == 0
    for flag in ("--input", "--format", "--workers", "--valid-fraction", "--skip-bad",
                 "--exclude-sets", "--languages", "--task-index", "--num-tasks", "truncated_stream"):
        assert flag in r.stdout
    r = subprocess.run(_cmd(str(tmp_path / "nope" / "*.jsonl.zst"), tmp_path / "o"),
                       capture_output=True, text=True, env=_env())
    assert r.returncode == 2 and r.stderr.startswith("error: --input") and "matches no" in r.stderr
    r = subprocess.run([sys.executable, SHARD, "merge", "--out", str(tmp_path), "--name", "x"],
                       capture_output=True, text=True, env=_env())
    assert r.returncode == 2 and "run the shard step" in r.stderr
