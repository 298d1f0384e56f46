"""From the study's result files to one `summary.json`: every number of STUDY.md with the JSON
file it came from.

Definitions (also written into the summary and STUDY.md):

- PPL table: `lenext eval ppl`, last-stride protocol, stride L/2, `budget_tokens` scored tokens
  per cell, held-out books; per method the mean over seeds and the min..max spread.
- Loss inflection s*_loss: on the per-position loss of full-protocol windows of 8L (mean over
  windows), smoothed by a centred moving average of half-width max(2, round(0.1 (p+1)));
  ref = the minimum of the smoothed curve over positions [L/2, L); s*_loss = (p*+1)/L for the
  first position p* >= L (past the training length) where the smoothed loss stays above
  ref + 0.05 nats over [p*, 1.25 p*]. None: no such rise within 8L. s*_loss = 1 + 1/L means the
  loss was already above ref + 0.05 at L (the rise started inside L).
- Entropy inflection s*_ent: the mean attention entropy (all layers and heads) per position; its
  in-L trend H = alpha + beta ln(p+1) is fitted over [L/4, L) (entropy grows like ln i even
  without any failure, so its in-L minimum is no baseline); s*_ent = (p*+1)/L for the first
  p* >= L where the smoothed entropy stays above that trend + 0.05 nats over [p*, 1.25 p*].
- The two coincide when both exist and max(s*)/min(s*) <= 1.25.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .plan import ROPE_EXTENSIONS, Cell

DELTA_LOSS = 0.05
DELTA_ENT = 0.05
PERSIST = 1.25
COINCIDE = 1.25


def _load(p: Path) -> Optional[dict]:
    try:
        return json.loads(Path(p).read_text())
    except (OSError, ValueError):
        return None


def smooth(y: np.ndarray) -> np.ndarray:
    y = np.asarray(y, float)
    c = np.concatenate([[0.0], np.cumsum(np.nan_to_num(y))])
    n = np.concatenate([[0], np.cumsum(~np.isnan(y))])
    out = np.full(len(y), np.nan)
    for p in range(len(y)):
        w = max(2, round(0.1 * (p + 1)))
        a, b = max(0, p - w), min(len(y), p + w + 1)
        if n[b] - n[a]:
            out[p] = (c[b] - c[a]) / (n[b] - n[a])
    return out


def _first_persistent(mask: np.ndarray, start: int) -> Optional[int]:
    N = len(mask)
    for p in range(start, N):
        q = min(N, int(math.ceil(PERSIST * (p + 1))))
        if mask[p:max(q, p + 1)].all():
            return p
    return None


def loss_inflection(curve: Sequence[Optional[float]], L: int, delta: float = DELTA_LOSS) -> dict:
    y = np.array([np.nan if v is None else v for v in curve], float)
    s = smooth(y)
    lo = L // 2
    j = lo + int(np.nanargmin(s[lo:L]))
    ref = float(s[j])
    p = _first_persistent(s > ref + delta, max(j + 1, L))
    return {"ref_position": j, "ref_loss": ref, "delta": delta, "position": p,
            "s": None if p is None else (p + 1) / L, "max_s": len(y) / L}


def entropy_inflection(h: np.ndarray, L: int, delta: float = DELTA_ENT) -> dict:
    h = np.asarray(h, float)
    x = np.log(np.arange(len(h)) + 1.0)
    lo = max(1, L // 4)
    beta, alpha = np.polyfit(x[lo:L], h[lo:L], 1)
    resid = smooth(h) - (alpha + beta * x)
    p = _first_persistent(resid > delta, L)
    return {"trend": {"alpha": float(alpha), "beta": float(beta), "fit_range": [lo, L]},
            "delta": delta, "position": p, "s": None if p is None else (p + 1) / L,
            "max_s": len(h) / L}


def _spread(vals: list[float]) -> dict:
    v = [x for x in vals if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": float(np.mean(v)), "min": float(min(v)), "max": float(max(v)), "n": len(v)}


def _method_key(c: Cell) -> str:
    """A table row: the cell's method, and its extension factor for per-length methods."""
    return c.method + ("" if c.matched_factor is None else f" (s={c.matched_factor})")


class Analysis:
    """Reads <out>/eval, <out>/extend; `summary()` returns the dict written to summary.json."""

    def __init__(self, study):
        self.s, self.L, self.out = study, study.L, study.out
        self.cells: list[Cell] = study.cells()
        self.N = self.L * max(study.plan.factors)

    def rel(self, p: Path) -> str:
        try:
            return str(Path(p).relative_to(self.out))
        except ValueError:
            return str(p)

    def _ppl(self, cell: Cell) -> tuple[Optional[dict], Path]:
        f = self.s.cell_jobs(cell)["ppl"].result_path
        return _load(f), f

    # ---------------------------------------------------------------- tables
    def table(self) -> list[dict]:
        rows: dict[str, dict] = {}
        for c in self.cells:
            j, f = self._ppl(c)
            if j is None:
                continue
            key = _method_key(c)
            row = rows.setdefault(key, {"method": key, "family": c.method, "factor": c.matched_factor,
                                        "runs": {}})
            row["runs"][c.run] = {"ppl": {str(r["length"]): r["ppl"] for r in j["results"]},
                                  "source": self.rel(f), "scale_c": c.scale_c}
        for row in rows.values():
            row["stats"] = {str(W): _spread([r["ppl"].get(str(W)) for r in row["runs"].values()])
                            for W in self.s.lengths}
        return list(rows.values())

    def matched(self, table: list[dict]) -> list[dict]:
        """Per-length methods, each length with its own s = T/L (RoPE+PI/NTK/YaRN, fitted c(T),
        HeadScale(T)); at L the base model."""
        base = {r["method"]: r for r in table if r["factor"] is None}
        out = []
        fams = [(f"rope + {label}", "rope") for label in ROPE_EXTENSIONS.values()]
        for fam, base_name in fams + [("nope c(T) fitted", "nope"), ("nope HeadScale", "nope")]:
            cols = {}
            for W in self.s.lengths:
                f = W // self.L
                src = base.get(base_name) if f == 1 else next(
                    (r for r in table if r["family"] == fam and r["factor"] == f), None)
                if src is not None:
                    cols[str(W)] = {**src["stats"][str(W)], "from": src["method"]}
            out.append({"method": fam + " (s = T/L)", "cols": cols})
        return out

    # ---------------------------------------------------------------- diagnostics
    def context(self) -> dict:
        out = {}
        for c in self.cells:
            if c.name != c.run:
                continue
            j, f = self._ppl(c)
            if j is None:
                continue
            d = {x["length"]: x for x in j.get("diagnostics", [])}
            at_L = d.get(self.L, {}).get("context_use", {})
            out[c.run] = {"position": c.position, "gain": at_L.get("gain"),
                          "loss_short_context": at_L.get("loss_short_context"),
                          "loss_full_context": at_L.get("loss_full_context"),
                          "gain_unpaired": at_L.get("gain_unpaired"),
                          "penalty_mean": {str(W): x.get("penalty_mean") for W, x in d.items() if W > self.L},
                          "penalty_by_s": d.get(self.N, {}).get("penalty_by_s", []),
                          "source": self.rel(f)}
        return out

    def inflections(self) -> dict:
        out = {}
        for c in self.cells:
            if not c.curve:
                continue
            jobs = self.s.cell_jobs(c)
            rec: dict = {"run": c.run, "method": c.method, "scale_c": c.scale_c}
            j = _load(jobs["curve"].result_path)
            if j is not None:
                curve = j["results"][0]["position_curve"]["loss"]
                rec["loss"] = {**loss_inflection(curve, self.L),
                               "source": self.rel(jobs["curve"].result_path)}
            npz = jobs["entropy"].npz_path if "entropy" in jobs else None
            if npz is not None and npz.exists():
                ent = np.load(npz)["entropy"].mean((0, 1))
                rec["entropy"] = {**entropy_inflection(ent, self.L), "source": self.rel(npz)}
                if j is not None:  # rise past L of loss vs entropy, correlated over log bins
                    y = smooth(np.array([np.nan if v is None else v for v in curve], float))
                    e = smooth(ent)
                    edges = np.unique(np.geomspace(self.L, self.N, 17).round().astype(int))
                    ly = [np.nanmean(y[a:b]) for a, b in zip(edges[:-1], edges[1:])]
                    le = [np.nanmean(e[a:b]) for a, b in zip(edges[:-1], edges[1:])]
                    if len(ly) > 2 and np.std(ly) > 0 and np.std(le) > 0:
                        rec["r_loss_entropy_past_L"] = float(np.corrcoef(ly, le)[0, 1])
            out[c.name] = rec
        return out

    def fits(self) -> dict:
        out = {}
        for r in self.s.runs:
            f = self.s.sweep_job(r.name).result_path
            j = _load(f)
            if j is not None:
                out[r.name] = {**j["fit"], "best_c_mean": j.get("best_c_mean"),
                               "best_c_beyond_L": j.get("best_c_beyond_L"),
                               "bins": [{"s": b["s"], "best_c": b["best_c"]} for b in j["bins"]],
                               "source": self.rel(f)}
        return out

    def passkey(self) -> dict:
        """Per cell: the LongLoRA passkey's accuracy by length and depth."""
        out = {}
        for c in self.cells:
            if "passkey" in (jobs := self.s.cell_jobs(c)):
                f = jobs["passkey"].result_path
                if (j := _load(f)) is not None:
                    out[c.name] = {"method": _method_key(c), "run": c.run, **self._pk(j, f)}
        return out

    def _pk(self, j: dict, f: Path) -> dict:
        return {"mean": j["mean_accuracy"], "lengths": j["lengths"], "depths": j["depths"],
                "accuracy": j["accuracy"], "by_length": j["accuracy_by_length"],
                "keys": len(j["keys"]), "source": self.rel(f)}

    def tasks(self) -> dict:
        """Per cell: task-format retrieval by length (documents right, answer tokens right),
        per task generator."""
        out = {}
        for c in self.cells:
            if "tasks" in (jobs := self.s.cell_jobs(c)):
                f = jobs["tasks"].result_path
                if (j := _load(f)) is not None:
                    tok: dict = {}
                    for x in j["cells"]:
                        tok.setdefault(x["task"], []).append(x["token_accuracy"])
                    out[c.name] = {"method": _method_key(c), "run": c.run, "lengths": j["lengths"],
                                   "accuracy": j["accuracy"], "token_accuracy": tok,
                                   "docs": j.get("docs"), "source": self.rel(f)}
        return out

    @staticmethod
    def retrieval(tasks: dict, task: str = "passkey") -> list[dict]:
        """Per method (over its seeds): task-format accuracy of `task` by length, documents right
        and answer tokens right, mean [min..max]."""
        by: dict[str, list[dict]] = {}
        for rec in tasks.values():
            if task in rec["accuracy"]:
                by.setdefault(rec["method"], []).append(rec)
        out = []
        for method, recs in by.items():
            lengths = recs[0]["lengths"]
            out.append({"method": method, "task": task, "lengths": lengths,
                        "runs": [r["run"] for r in recs],
                        "exact": [_spread([r["accuracy"][task][i] for r in recs])
                                  for i in range(len(lengths))],
                        "tokens": [_spread([r["token_accuracy"][task][i] for r in recs])
                                   for i in range(len(lengths))],
                        "sources": [r["source"] for r in recs]})
        return out

    def headscale(self) -> dict:
        """Per NoPE run and target T: the HeadScale cell's PPL and m_h, the fitted uniform c(T)
        cell (the search's initialization) for comparison, the learned scales' file."""
        out: dict = {}
        by_name = {c.name: c for c in self.cells}
        for c in self.cells:
            if c.headscale_target is None or c.ablation is not None:
                continue
            T = self.L * c.matched_factor
            rec: dict = {}
            j, f = self._ppl(c)
            if j is not None:
                rec["ppl"] = {str(x["length"]): x["ppl"] for x in j["results"]}
                rec["source"] = self.rel(f)
                if j.get("model", {}).get("head_scale"):
                    rec["m_h"] = j["model"]["head_scale"]
            run = next(r for r in self.s.runs if r.name == c.run)
            hsj = self.s.extend_options(run).search_dir(T) / "head_scales.json"
            if hsj.exists():
                rec["head_scales_source"] = self.rel(hsj)
            uni = by_name.get(f"{c.run}-fit{c.matched_factor}")
            if uni is not None and (ju := self._ppl(uni)[0]) is not None:
                rec["uniform_c"] = uni.scale_c
                rec["uniform_ppl"] = {str(x["length"]): x["ppl"] for x in ju["results"]}
                rec["uniform_source"] = self.rel(self._ppl(uni)[1])
            if rec:
                out.setdefault(c.run, {})[str(T)] = rec
        return out

    def ablations(self, tasks: dict) -> dict:
        """Per HeadScale ablation cell: PPL by length, task-format passkey by length, m_h, beside
        the full HeadScale cell of the same run and target."""
        out: dict = {}
        by_name = {c.name: c for c in self.cells}
        for c in self.cells:
            if c.ablation is None:
                continue
            full = by_name.get(f"{c.run}-hs{c.headscale_target}")
            rec: dict = {"run": c.run, "ablation": c.ablation, "method": c.method,
                         "target": c.headscale_target, "full": full and full.name}
            for key, cell in (("ablated", c), ("headscale", full)):
                j, f = self._ppl(cell) if cell is not None else (None, None)
                if j is None:
                    continue
                t = tasks.get(cell.name, {})
                rec[key] = {"ppl": {str(x["length"]): x["ppl"] for x in j["results"]},
                            "m_h": j.get("model", {}).get("head_scale"), "source": self.rel(f),
                            "passkey": (t.get("accuracy") or {}).get("passkey"),
                            "passkey_tokens": (t.get("token_accuracy") or {}).get("passkey"),
                            "tasks_source": t.get("source")}
            out[c.name] = rec
        return out

    def training(self) -> dict:
        out = {}
        for r in self.s.runs:
            f = self.s.run_dir(r.name) / "metrics.jsonl"
            if not f.exists():
                continue
            lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
            tr = [x for x in lines if "loss" in x]
            va = [x for x in lines if "valid_loss" in x]
            out[r.name] = {"final_loss": tr[-1]["loss"] if tr else None,
                           "valid_loss": va[-1]["valid_loss"] if va else None,
                           "tokens": tr[-1]["tokens"] if tr else None,
                           "tokens_per_s_median": float(np.median([x["tokens_per_s"] for x in tr[1:]]))
                           if len(tr) > 1 else None,
                           "source": self.rel(f)}
        return out

    def summary(self) -> dict:
        table, tasks = self.table(), self.tasks()
        return {"L": self.L, "lengths": self.s.lengths, "plan": self.s.plan.to_dict(),
                "runs": [r.name for r in self.s.runs], "notes": self.s.notes,
                "definitions": {"delta_loss": DELTA_LOSS, "delta_entropy": DELTA_ENT,
                                "persist": PERSIST, "coincide_ratio": COINCIDE,
                                "text": __doc__},
                "training": self.training(), "table": table, "matched": self.matched(table),
                "context": self.context(), "inflection": self.inflections(), "fit": self.fits(),
                "passkey": self.passkey(), "tasks": tasks,
                "retrieval": {t: self.retrieval(tasks, t) for t in self.s.task_names},
                "headscale": self.headscale(), "ablations": self.ablations(tasks),
                "timings": self.s.timings}
