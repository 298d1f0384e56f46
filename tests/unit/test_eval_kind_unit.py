"""Issue 44, item 2: an eval kind is one unit. A toy kind, declared and registered here and nowhere
else, appears in `lenext eval --help`, runs through `lenext eval toy` on a real tiny model (its
JSON and plot written by the job's own `_run`), and has its section in `lenext report`."""
import json
from dataclasses import dataclass
from typing import ClassVar

import pytest

from lenext_dist.cli import main
from lenext_dist.eval import jobs
from tiny_models import save_tiny_model


@dataclass(kw_only=True)
class ToyJob(jobs.EvalJob):
    """The mean logit of BOS at each of --lengths positions (a stand-in for a new measurement)."""
    kind: ClassVar[str] = "toy"
    help: ClassVar[str] = "a toy measurement registered by a test"
    description: ClassVar[str] = "The mean next-token logit at each length (tests only)."
    example: ClassVar[str] = "lenext eval toy --model hf/tiny --lengths 8,16"
    lengths: list[int] = jobs.option(None, jobs.ints, "positions", required=True)

    @staticmethod
    def section(pairs, label):
        return ["## Toy logits", ""] + [f"- {label(r, j)}: {j['means']}" for r, j in pairs] + [""]

    @property
    def stem(self):
        return self._stem(f"toy{self.suffix}")

    def _run(self):
        import torch

        model, L, meta = self._setup()
        means = {}
        with torch.no_grad():
            for n in self.lengths:
                ids = torch.zeros(1, n, dtype=torch.long, device=model.device)
                means[n] = float(model(input_ids=ids).logits.float().mean())
        return [jobs.write_json({**meta, "kind": "toy", "means": means}, str(self.stem) + ".json")]


@pytest.fixture
def toy():
    yield jobs.register(ToyJob)
    del jobs.JOBS["toy"]  # registered for this test only


def test_a_kind_registered_in_one_place_is_in_help_runs_and_reports(toy, tmp_path, capsys):
    model = save_tiny_model(str(tmp_path / "tiny"), train_length=16)
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "toy          a toy measurement registered by a test" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["eval", "toy", "--help"])
    assert "lenext eval toy --model hf/tiny --lengths 8,16" in capsys.readouterr().out
    out = tmp_path / "r"
    assert main(["eval", "toy", "--model", model, "--lengths", "8,16", "--out", str(out)]) == 0
    res = json.loads((out / "toy.json").read_text())
    assert set(res["means"]) == {"8", "16"} and res["args"]["lengths"] == [8, 16]
    assert main(["report", "--runs", str(out), "--out", str(tmp_path / "report.md")]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Toy logits" in report and f"- r: {res['means']}" in report


def test_kind_names_are_unique(toy):
    with pytest.raises(ValueError, match="registered already"):
        jobs.register(ToyJob)
