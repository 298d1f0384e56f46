"""`lenext eval ruler` end to end on a tiny export at 1024 tokens: lm-eval's RULER generators size
the prompts with the export's tokenizer, the model answers, the JSON holds a score and the
no-retrieval baseline per (task, length), and `lenext report` shows them; a task that needs a
download is refused in one line before anything loads."""
import json
import sys

import pytest

from helpers import run
from tiny_models import save_tiny_lenext

pytestmark = pytest.mark.e2e
pytest.importorskip("wonderwords", reason="lm_eval[ruler] extras (make setup installs them)")

LENGTH = 1024
TASKS = ["niah_single_1", "vt"]


def test_ruler_scores_by_task_and_length_and_the_report_shows_them(tmp_path):
    model = save_tiny_lenext(str(tmp_path / "tiny-nope"), train_length=256)
    out = tmp_path / "results"
    p = run([sys.executable, "-m", "lenext_dist", "eval", "ruler", "--model", model, "--out", str(out),
             "--lengths", str(LENGTH), "--tasks", ",".join(TASKS), "--samples", "2", "--batch-size", "2",
             "--threads", "1", "--device", "cpu"], timeout=900)
    res = json.loads((out / "ruler.json").read_text())
    assert res["kind"] == "ruler" and res["tasks"] == TASKS and res["lengths"] == [LENGTH]
    assert [(c["task"], c["length"], c["samples"]) for c in res["cells"]] == [(t, LENGTH, 2) for t in TASKS]
    for c in res["cells"]:
        assert 0.0 <= c["score"] <= 1.0 and 0.0 <= c["baseline"] <= 1.0
        assert c["tokens"][1] <= LENGTH  # prompt + generation budget within the length asked
        assert f"{c['task']:>16}  length {LENGTH:>6}  score {c['score']:.3f}" in p.stdout
    # lm-eval sized the haystack with our tokenizer: its prompts fill the length (a tokenizer
    # that counted differently would leave them far shorter or refuse)
    niah = res["cells"][0]
    assert niah["tokens"][1] > 0.85 * LENGTH
    assert all(e["answers"] for e in res["examples"])
    assert res["protocol"]["tasks"] == {"niah_single_1": "niah_single_1", "vt": "ruler_vt"}
    assert res["model"]["train_length"] == 256

    report = tmp_path / "report.md"
    run([sys.executable, "-m", "lenext_dist", "report", "--runs", str(out), "--out", str(report)])
    md = report.read_text()
    assert "## RULER (lm-eval)" in md and f"| run | task | {LENGTH} | samples |" in md
    for c in res["cells"]:
        assert f"| results | {c['task']} | {c['score']:.2f} ({c['baseline']:.2f}) | 2 |" in md


def test_a_download_needing_task_is_refused_in_one_line(tmp_path):
    p = run([sys.executable, "-m", "lenext_dist", "eval", "ruler", "--model", str(tmp_path / "absent"),
             "--lengths", "1024", "--tasks", "niah_single_1,niah_multivalue"], check=False)
    assert p.returncode == 2 and p.stdout == ""
    err = p.stderr.splitlines()  # one line: no usage block before it
    assert len(err) == 1 and err[0].startswith(
        "lenext eval ruler: error: argument --tasks: niah_multivalue needs a download (the essay "
        "haystack downloads Paul Graham's essays from the Hugging Face hub")
