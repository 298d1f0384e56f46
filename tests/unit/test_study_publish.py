"""The published copy of a study (docs/study/ in the repository) holds STUDY.md and what it cites."""
import pytest

from lenext_dist.study.publish import cited_files, publish

MD = """# Study
| claim | JSON |
|---|---|
| a | `eval/nope-s1/ppl_last-stride.json`, `eval/rope-s1/ppl.json` |
| b | `eval/nope-s1/ppl_last-stride.json` (again), `runs/nope-s1/metrics.jsonl` |
![fig1](fig1_loss_entropy.png)
`lenext eval ppl` is a command, not a file.
"""


def _tree(root, files):
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)


def test_cited_files_in_order_once():
    assert cited_files(MD) == ["eval/nope-s1/ppl_last-stride.json", "eval/rope-s1/ppl.json",
                               "runs/nope-s1/metrics.jsonl", "fig1_loss_entropy.png"]


def test_publish_copies_exactly_the_cited_files(tmp_path):
    out, dest = tmp_path / "results", tmp_path / "study"
    _tree(out, ["summary.json", "plan.json", "eval/nope-s1/ppl_last-stride.json",
                "runs/nope-s1/metrics.jsonl", "fig1_loss_entropy.png", "models/big.safetensors"])
    (out / "STUDY.md").write_text(MD)
    _tree(dest, ["stale.json"])  # a previous publication is replaced, not merged
    copied, missing = publish(out, dest)
    assert missing == ["timings.json", "eval/rope-s1/ppl.json"]
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == sorted(copied)
    assert (dest / "eval/nope-s1/ppl_last-stride.json").read_text() == "eval/nope-s1/ppl_last-stride.json"
    assert not (dest / "models").exists() and not (dest / "stale.json").exists()


def test_publish_refuses_paths_outside_the_results(tmp_path):
    out = tmp_path / "results"
    _tree(tmp_path, ["secret.json"])
    out.mkdir()
    (out / "STUDY.md").write_text("see `../secret.json`")
    with pytest.raises(ValueError, match="outside"):
        publish(out, tmp_path / "study")


def test_the_checked_in_study_holds_every_file_its_study_md_cites():
    from pathlib import Path

    from lenext_dist.study.publish import ALWAYS, PUBLISHED

    study = Path(__file__).resolve().parents[2] / PUBLISHED
    assert (study / "STUDY.md").is_file(), f"no published study at {study}"
    cited = cited_files((study / "STUDY.md").read_text())
    assert cited and [f for f in [*ALWAYS, *cited] if not (study / f).is_file()] == []


def test_a_refused_path_leaves_the_previous_publication_in_place(tmp_path):
    """The cited paths are checked before dest is touched; a path outside is one error line."""
    from lenext_dist.errors import UserError

    out, dest = tmp_path / "results", tmp_path / "study"
    _tree(out, ["summary.json"])
    _tree(dest, ["STUDY.md", "summary.json"])
    for bad in ("`../../etc/passwd.json`", "![x](/etc/hosts)"):
        (out / "STUDY.md").write_text(f"see `summary.json` and {bad}")
        with pytest.raises(UserError, match="outside .*nothing was published"):
            publish(out, dest)
        assert sorted(p.name for p in dest.iterdir()) == ["STUDY.md", "summary.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
