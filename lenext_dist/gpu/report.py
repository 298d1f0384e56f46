"""One JSON + a markdown table per check, under benchmarks/results/gpu/ (machine, versions and date
inside each file; the file name carries the date and device, so no result overwrites another)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from lenext_dist.atomic import atomic_write

COLUMNS = ("case", "ok", "kernel", "tokens/s", "MFU", "peak GiB", "budget GiB", "largest alloc MiB",
           "s", "note")


def stem(result: dict) -> str:
    m = result["machine"]
    device = re.sub(r"[^A-Za-z0-9]+", "-", str(m.get("device") or "cpu")).strip("-").lower()
    date = m["date"].replace(" UTC", "").replace(":", "").replace(" ", "T").replace("-", "")
    return f"gpu_check-{'dry-' if result['mode'] == 'dry' else ''}{date}-{device}"


def _gib(x) -> str:
    return "" if x is None else f"{x / 2**30:.2f}"


def row(case: dict) -> list[str]:
    r = case.get("result") or {}
    plan = case.get("plan") or {}
    kernel = r.get("kernel") or ", ".join(plan.get("kernels", [])) or plan.get("kernel", "")
    mfu = r.get("mfu")
    note = r.get("error") or plan.get("error") or r.get("note", "")
    return [case["name"], {True: "ok", False: "FAILED", None: "planned"}[case.get("ok")], str(kernel),
            str(r.get("tokens_per_s", "")), "" if mfu is None else f"{100 * mfu:.1f}%",
            _gib(r.get("peak_bytes")),
            _gib(r.get("budget_bytes", plan.get("budget_bytes", plan.get("memory_estimate_bytes")))),
            "" if r.get("largest_alloc_bytes") is None else f"{r['largest_alloc_bytes'] / 2**20:.0f}",
            str(r.get("seconds", "")), str(note).replace("|", "/")[:160]]


def markdown(result: dict) -> str:
    m = result["machine"]
    head = [f"# make gpu-check ({result['mode']}): {m.get('device')} x{m.get('gpus')}, {m['date']}", "",
            "machine: " + ", ".join(f"{k} {v}" for k, v in m.items() if k != "date"), "",
            f"MFU floor {100 * result['mfu_floor']:.0f}%: {result['mfu_floor_why']}", "",
            f"verdict: {'ok' if result['ok'] else 'FAILED'}" if result["mode"] != "dry" else
            "dry plan: nothing ran on a GPU", "",
            "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(head + ["| " + " | ".join(row(c)) + " |" for c in result["cases"]]) + "\n"


def write(result: dict, out_dir: str | Path) -> Path:
    """Write <stem>.json and <stem>.md; returns the JSON path (rewritten after every case, so a
    killed check leaves what it measured)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (result.setdefault("stem", stem(result)) + ".json")
    atomic_write(path, json.dumps(result, indent=1, default=str))
    atomic_write(path.with_suffix(".md"), markdown(result))
    return path
