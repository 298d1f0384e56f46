"""Benchmark numbers are published as a table generated from the run's JSON, headed by the machine
and the date that JSON records (benchmarks/run_all.py; docs/benchmarks.md)."""
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run_all():
    spec = importlib.util.spec_from_file_location("_bench_run_all", REPO / "benchmarks" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_render_writes_the_table_with_machine_and_date(tmp_path):
    res = {"machine": {"platform": "Linux-test", "processor": "x86_64", "cores": 2, "python": "3.11.9",
                       "cpu_model": "Test CPU", "mem_total_gb": 7.7, "loadavg_at_start": [1.0, 0.5, 0.2],
                       "torch": "2.13.0+cpu"},
           "created": "2000-01-02T03:04:05+0000",
           "eval_ppl": {"returncode": 0, "result": {"speedup_wall": 3.5, "speedup_cpu": 3.25,
                                                    "identical_within_1e-5": True}},
           "train_step": {"returncode": 1, "error": ["boom"]}}
    src = tmp_path / "all.json"
    src.write_text(json.dumps(res))
    assert _run_all().main(["--render", str(src)]) == 0
    md = (tmp_path / "all.md").read_text()
    assert "2000-01-02T03:04:05+0000" in md and "Test CPU, 2 cores" in md and "torch 2.13.0+cpu" in md
    assert "| eval_ppl | speed-up 3.50x wall, 3.25x CPU; PPL agree True | >= 3x |" in md
    assert "| train_step | FAILED (exit 1) | |" in md
