"""The demo's table (lenext_dist/eval/demo_table.py) is generated from `lenext eval tasks` JSON:
rows per model and scale, lengths as multiples of L, the no-retrieval baseline row; --into
replaces only the text between the markers, and a page without them is a one-line error."""
import json

from lenext_dist.eval.demo_table import END, START, main, table


def _result(folder, position, c, accs, base=0.0):
    folder.mkdir(parents=True, exist_ok=True)
    cells = [{"task": "kv", "length": 64 * k, "accuracy": a, "documents": 64,
              "baseline": {"accuracy": base}} for k, a in zip((1, 2, 4, 8), accs)]
    (folder / f"tasks_c{c:g}.json").write_text(json.dumps({
        "kind": "tasks", "tasks": ["kv"], "cells": cells, "created": "2026-01-01T00:00:00",
        "model": {"train_length": 64, "scale_c": c, "position": position,
                  "config": {"position": position}}}))


def test_table_rows_and_baseline(tmp_path):
    _result(tmp_path / "nope", "nope", 1.0, [0.97, 0.83, 0.12, 0.0])
    _result(tmp_path / "nope", "nope", 1.5, [0.56, 0.64, 0.61, 0.72])
    _result(tmp_path / "rope", "rope", 1.0, [1.0, 0.0, 0.0, 0.0], base=0.01)
    md = table([str(tmp_path / "nope"), str(tmp_path / "rope")])
    assert "| model | task | c | 1L | 2L | 4L | 8L |" in md
    assert "| nope | kv | 1 | 0.97 | 0.83 | 0.12 | 0.00 |" in md
    assert "| nope | kv | 1.5 | 0.56 | 0.64 | 0.61 | 0.72 |" in md
    assert "| rope | kv | 1 | 1.00 | 0.00 | 0.00 | 0.00 |" in md
    assert "| no retrieval (baseline) | kv | - | 0.00 | 0.00 | 0.00 | 0.00 |" in md


def test_into_replaces_between_the_markers_only(tmp_path, capsys):
    _result(tmp_path / "nope", "nope", 1.0, [1.0, 0.5, 0.0, 0.0])
    page = tmp_path / "page.md"
    page.write_text(f"before\n{START}\nold table\n{END}\nafter\n")
    assert main(["--runs", str(tmp_path / "nope"), "--into", str(page)]) == 0
    text = page.read_text()
    assert text.startswith(f"before\n{START}\n") and text.endswith(f"{END}\nafter\n")
    assert "old table" not in text and "| nope | kv | 1 | 1.00 | 0.50 |" in text
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    assert main(["--runs", str(tmp_path / "nope"), "--into", str(bare)]) == 2
    assert "no <!-- demo-results:start -->" in capsys.readouterr().err
    assert main(["--runs", str(tmp_path / "missing")]) == 2


def test_a_stock_export_without_a_position_is_named_by_its_folder(tmp_path):
    """A stock export has no lenext attention, so its JSON has no `position`, nor its (Llama)
    config: the lookup's eager default made that `error: 'position'`."""
    _result(tmp_path / "nope", "nope", 1.0, [1.0, 0.5, 0.0, 0.0])
    f = tmp_path / "stock" / "tasks_c1.json"
    _result(f.parent, "nope", 1.0, [0.9, 0.4, 0.0, 0.0])
    j = json.loads(f.read_text())
    j["model"] = {"train_length": 64, "scale_c": 1.0, "path": "/w/hf/nope-stock",
                  "config": {"model_type": "llama"}}
    f.write_text(json.dumps(j))
    md = table([str(tmp_path / "nope"), str(f.parent)])
    assert "| nope-stock | kv | 1 | 0.90 | 0.40 | 0.00 | 0.00 |" in md and "| nope | kv | 1 |" in md
