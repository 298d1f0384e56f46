"""`lenext eval ...` / `lenext report` end to end on a tiny random model (in process)."""
import json

import pytest

from lenext_dist.cli import main
from tiny_models import REPO, save_tiny_model


DATA = f"{REPO}/data/sample/heldout/code.jsonl.zst"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("m") / "tiny"), train_length=32)


def run(*argv):
    assert main(list(argv)) == 0


def test_ppl_cli(model_dir, tmp_path):
    out = tmp_path / "r"
    run("eval", "ppl", "--model", model_dir, "--data", DATA, "--lengths", "32,64",
        "--stride", "8", "--budget-tokens", "64", "--batch-size", "4", "--out", str(out),
        "--no-progress")
    j = json.loads((out / "ppl_last-stride.json").read_text())
    assert j["protocol"] == "last-stride" and j["train_length"] == 32
    assert [r["length"] for r in j["results"]] == [32, 64]
    assert all(r["scored_tokens"] == 64 for r in j["results"])
    assert j["data"]["files"][0]["tokens"] > 70000
    assert j["model"]["attention_layout"] == "llama"
    d = j["diagnostics"][-1]
    assert d["length"] == 64 and d["penalty_by_s"] and d["context_use"]["gain"] is not None
    assert (out / "ppl_last-stride.png").stat().st_size > 1000
    assert (out / "penalty_last-stride.png").exists()
    run("eval", "ppl", "--model", model_dir, "--data", DATA, "--lengths", "64",
        "--protocol", "yarn", "--stride", "16", "--max-docs", "1", "--scale-c", "1.2",
        "--no-penalty", "--out", str(out), "--no-progress")
    j = json.loads((out / "ppl_yarn_c1.2.json").read_text())
    assert j["model"]["scale_c"] == 1.2 and j["model"]["head_scale"]["min"] == pytest.approx(1.2)
    assert j["results"][0]["scored_tokens"] == j["data"]["documents"][0]["tokens"] - 1
    run("eval", "passkey", "--model", model_dir, "--lengths", "100,140", "--depths", "2",
        "--keys", "2", "--max-new-tokens", "3", "--out", str(out), "--no-progress")
    j = json.loads((out / "passkey.json").read_text())
    assert j["depths"] == [0.0, 1.0] and len(j["accuracy"]) == 2
    assert (out / "passkey.png").exists()
    run("eval", "entropy", "--model", model_dir, "--data", DATA, "--length", "64",
        "--samples", "2", "--out", str(out), "--no-progress")
    j = json.loads((out / "entropy_64.json").read_text())
    assert j["samples"] == 2 and len(j["per_head"]) == 2 and (out / "entropy_64.png").exists()
    run("eval", "scale-sweep", "--model", model_dir, "--data", DATA, "--length", "64",
        "--c-min", "0.8", "--c-max", "1.2", "--c-step", "0.2", "--samples", "1",
        "--out", str(out), "--no-progress")
    j = json.loads((out / "scale_sweep.json").read_text())
    assert j["grid"] == [0.8, 1.0, 1.2] and j["fit"]["n_points"] >= 1
    assert (out / "scale_sweep.png").exists()
    rep = tmp_path / "report.md"
    run("report", "--runs", str(out), "--out", str(rep))
    text = rep.read_text()
    for s in ("## Perplexity", "| r | last-stride |", "r (c=1.2)", "## Passkey",
              "## Attention entropy", "## Uniform-scale sweep", "](r/passkey.png)"):
        assert s in text


def test_results_of_other_options_are_never_overwritten(model_dir, tmp_path, capsys):
    """Issue 40, F8: a second evaluation into the same folder with other options (here other
    --lengths and --stride: another protocol of the same file name) is refused in one line before
    the model loads, naming the file and the options; a rerun with the same options overwrites
    (resume), and an option that changes nothing measured (--batch-size) is not a difference."""
    out = tmp_path / "r"
    args = ["eval", "ppl", "--model", model_dir, "--data", DATA, "--stride", "8",
            "--budget-tokens", "32", "--no-penalty", "--out", str(out), "--no-progress"]
    run(*args, "--lengths", "32")
    first = (out / "ppl_last-stride.json").read_text()
    capsys.readouterr()
    code = main([*args[:7], "16", *args[8:], "--lengths", "64"])
    msg = capsys.readouterr().err.strip()
    assert code != 0 and len(msg.splitlines()) == 1, msg
    assert "Loading weights" not in msg  # refused before the model loads
    assert "ppl_last-stride.json holds results made with other options" in msg
    assert "--lengths [32] there, [64] here" in msg and "--stride 8 there, 16 here" in msg
    assert (out / "ppl_last-stride.json").read_text() == first  # nothing lost
    run(*args, "--lengths", "32", "--batch-size", "2")  # the same measurement: may be redone
    # a result recorded in bfloat16 (a GPU's default) is another measurement than the default
    # here (float32): not done, and refused rather than overwritten
    from lenext_dist.eval.jobs import PplJob

    rec = json.loads(first)
    rec["args"]["dtype"] = "bfloat16"
    (out / "ppl_last-stride.json").write_text(json.dumps(rec))
    job = PplJob(model=model_dir, data=[DATA], lengths=[32], stride=8, budget_tokens=32, no_penalty=True,
                 out=str(out), no_progress=True)
    assert not job.done()
    assert main([*args, "--lengths", "32"]) != 0
    assert "--dtype bfloat16 there, float32 here" in capsys.readouterr().err


def test_a_long_task_set_list_names_a_file_the_system_can_write(model_dir, tmp_path):
    """Issue 40, F8: twenty --task-set values made a name past 255 bytes, refused by the file
    system only when the results were written, after the whole run."""
    from lenext_dist.eval.jobs import NAME_MAX, TasksJob

    sets = [f"kv.values={2 + i % 3}:{5 + i % 3}" for i in range(20)] + ["kv.distractors=1"]
    argv = ["eval", "tasks", "--model", model_dir, "--data", DATA, "--lengths", "128", "--tasks", "kv",
            "--docs", "1", "--max-docs", "2", "--out", str(tmp_path), "--no-progress"]
    run(*argv, *[x for s in sets for x in ("--task-set", s)])
    (name,) = [p.name for p in tmp_path.glob("tasks*.json")]
    assert len(name) <= NAME_MAX + len(".json")
    job = TasksJob(model=model_dir, data=[DATA], lengths=[128], tasks=["kv"], docs=1, max_docs=2,
                   out=str(tmp_path), task_set=sets)
    assert job.result_path.name == name and job.done()
    other = TasksJob(model=model_dir, data=[DATA], lengths=[128], tasks=["kv"], out=str(tmp_path),
                     task_set=sets[:-1] + ["kv.distractors=2"])
    assert other.result_path.name != name  # the hash keeps the full list apart


def test_a_result_of_an_older_protocol_is_not_taken_as_done(model_dir, tmp_path, capsys):
    """`lenext eval tasks` drew its documents and baseline otherwise before protocol version 1:
    a result without the version (or another one) is neither done nor overwritten."""
    from lenext_dist.eval.jobs import TasksJob

    argv = ["eval", "tasks", "--model", model_dir, "--data", DATA, "--lengths", "128", "--tasks", "kv",
            "--docs", "1", "--max-docs", "2", "--out", str(tmp_path), "--no-progress"]
    run(*argv)
    job = TasksJob(model=model_dir, data=[DATA], lengths=[128], tasks=["kv"], docs=1, max_docs=2,
                   out=str(tmp_path))
    rec = json.loads(job.result_path.read_text())
    assert rec["args"]["protocol_version"] == TasksJob.protocol_version == 2 and job.done()
    del rec["args"]["protocol_version"]  # as every result before it
    job.result_path.write_text(json.dumps(rec))
    assert not job.done()
    capsys.readouterr()
    assert main(argv) != 0
    assert "protocol version 0 there" in capsys.readouterr().err
    assert "protocol_version" not in json.loads(job.result_path.read_text())["args"]  # nothing lost


@pytest.mark.parametrize("length", ["1", "32"])
def test_a_scale_sweep_within_the_training_length_is_refused(model_dir, tmp_path, capsys, length):
    """The sweep's result is its fit past L: at --length <= L it had no point and exited 0."""
    out = tmp_path / "r"
    assert main(["eval", "scale-sweep", "--model", model_dir, "--data", DATA, "--length", length,
                 "--samples", "1", "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"--length {length}: the fit c(s) = 1 + a ln s is over the positions past the training "
        "length L = 32; give --length > 32 (e.g. 128)")
    assert not (out / "scale_sweep.json").exists()
