"""The regime search (`python -m lenext_dist.study --regime`): which training levers make NoPE use
its context, measured with the project's own pipeline before the study is spent on a regime.

Why: the text-only study was void (NoPE used a few tokens of context; DESIGN section 9). The levers
of issue 17 (a share of generated task documents, BOS at document starts, document masking of
packed sequences), the loss on task answers only (data.task_loss) and the training length / step
count are varied one at a time around a base
combination; per combination one seed of NoPE and of RoPE is pretrained, exported and measured:

  tokens   training tokens (steps x global batch x L)
  ppl      text PPL at L (last-stride, stride L/2, held-out books)
  gain     paired context-use gain at L (nats; eval/ppl.py: loss with 5..8 tokens of context minus
           loss with L/2+1..L tokens, same targets)
  tasks    task-format accuracy at P (eval/tasks.py: fresh documents of every task generator,
           held-out filler; every answer token right)
  task_tokens  the same documents' answer tokens right (the share of single tokens)
  passkey  the LongLoRA passkey's accuracy at P
P (`passkey_length`) is the shortest multiple of L that holds a LongLoRA prompt with filler and a
task document (plan.PASSKEY_MIN): L, except 2L for L = 64 (a passkey document needs >= 62 tokens,
and a cell's documents span 16 tokens below its length).

The gates are the study's acceptance (issue 18): NoPE passkey >= 0.9, NoPE gain >= 0.10 nats and
>= 0.7x RoPE's. The passkey gate is judged on the task-format passkey: the skill the extension
methods are to keep past L is the one the model learned at L; the LongLoRA prompt asks a CPU-scale
model for a template it never saw (both are in the table). `choose` picks the cheapest
combination (fewest training tokens) that passes all, else the one closest to passing (the largest
worst gate ratio, ties broken by the next worst). Results: <out>/regime.json and <out>/REGIME.md,
each number with the JSON it came from.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from lenext_dist.atomic import atomic_write
from lenext_dist.eval.jobs import PasskeyJob, PplJob, TasksJob
from lenext_dist.eval.options import TASK_NAMES

from .jobs import Command, Task, run_commands, run_tasks
from .plan import PASSKEY_MIN
from .publish import PublishError, inside

GATE_PASSKEY, GATE_GAIN, GATE_RATIO = 0.9, 0.10, 0.7


@dataclass(frozen=True)
class Levers:
    """One combination of the training levers (applied as overrides of the regime config)."""
    tasks: float = 0.3
    """Share of the training tokens from generated task documents (the rest: the config's text
    blend, its ratios kept)."""
    bos: bool = True
    mask: bool = True
    L: int = 128
    steps: int = 1500
    task_loss: str = "all"
    """'answers': task documents count only their answer tokens in the loss (data.task_loss)."""

    @property
    def name(self) -> str:
        loss = "-answers" if self.task_loss == "answers" else ""  # earlier rows keep their names
        return (f"t{self.tasks:g}-bos{int(self.bos)}-mask{int(self.mask)}-L{self.L}-{self.steps}st"
                f"{loss}")

    def overrides(self, blend: list, task_prefix: str) -> list[str]:
        """`--a.b=value` overrides; `blend` is the config's training blend (BlendItems)."""
        text = [b for b in blend if b.prefix != task_prefix]
        total = sum(b.weight for b in text)
        new = [{"prefix": b.prefix, "weight": round((1 - self.tasks) * b.weight / total, 6)}
               for b in text if self.tasks < 1]  # a blend weight must be > 0
        if self.tasks > 0:
            new.append({"prefix": task_prefix, "weight": self.tasks})
        every = max(1, self.steps // 3)
        return [f"--data.blend={json.dumps(new)}", f"--data.bos={str(self.bos).lower()}",
                f"--data.document_mask={str(self.mask).lower()}", f"--model.seq_length={self.L}",
                f"--data.task_loss={self.task_loss}",
                f"--train.steps={self.steps}", f"--train.eval_interval={every}",
                f"--checkpoint.interval={every}"]


def passkey_length(L: int) -> int:
    return L * math.ceil(PASSKEY_MIN / L)


@dataclass
class RegimePlan:
    name: str = "regime"
    config: str = "configs/study/regime.yaml"
    base: Levers = Levers()
    variations: list[dict] = field(default_factory=lambda: [
        {"tasks": 0.0}, {"tasks": 0.1}, {"bos": False}, {"mask": False}, {"L": 64},
        {"steps": 3000}, {"task_loss": "answers"}])
    """Each a change of `base` (one lever at a time)."""
    positions: tuple[str, ...] = ("nope", "rope")
    seed: int = 1
    task_prefix: str = "shards/sample/tasks_train"
    budget_tokens: int = 10000
    passkey_keys: int = 5
    task_docs: int = 32
    passkey_depths: int = 5
    workers: int = 2
    data: list[str] = field(default_factory=lambda: ["data/sample/heldout/books.jsonl.zst"])

    def combos(self) -> list[Levers]:
        out = [self.base]
        for v in self.variations:
            lv = replace(self.base, **v)
            if lv not in out:
                out.append(lv)
        return out


QUICK_REGIME = RegimePlan(  # CI: the machinery on two tiny combinations
    name="regime-quick", base=Levers(steps=40), variations=[{"tasks": 0.0}],
    budget_tokens=1024, passkey_keys=2, passkey_depths=2, task_docs=4)


class Regime:
    def __init__(self, plan: RegimePlan, out: Path, repo: Path, port: int = 29700,
                 log: Callable[[str], None] = print):
        from lenext_dist.config import load_config

        self.plan, self.out, self.port, self.log = plan, Path(out), port, log
        self.cfg = cfg = load_config(repo / plan.config)
        self.blend, self.batch = cfg.data.blend, cfg.train.global_batch_size
        self.runs = [(lv, pos) for lv in plan.combos() for pos in plan.positions]
        self.out.mkdir(parents=True, exist_ok=True)
        # seconds of the steps of every attempt, saved after each step (a later attempt skips
        # finished runs, so their training seconds come from here)
        self.timings_path = self.out / "timings.json"
        self.timings: dict = (json.loads(self.timings_path.read_text())
                              if self.timings_path.exists() else {})

    def run_name(self, lv: Levers, pos: str) -> str:
        return f"{lv.name}-{pos}-s{self.plan.seed}"

    def run_dir(self, name: str) -> Path:
        return self.out / "runs" / name

    def model_dir(self, name: str) -> Path:
        return self.out / "models" / name

    def jobs(self, lv: Levers, pos: str) -> dict:
        name, p, at = self.run_name(lv, pos), self.plan, passkey_length(lv.L)
        m = dict(model=str(self.model_dir(name)), out=str(self.out / "eval" / name),
                 no_progress=True, threads=1)
        return {"ppl": PplJob(**m, data=list(p.data), lengths=[lv.L], stride=max(1, lv.L // 2),
                              budget_tokens=p.budget_tokens),
                "passkey": PasskeyJob(**m, lengths=[at],
                                      depths=str(p.passkey_depths), keys=p.passkey_keys),
                "tasks": TasksJob(**m, data=list(p.data), lengths=[at], docs=p.task_docs)}

    def _trained(self, name: str, steps: int) -> bool:
        from lenext_dist.train.checkpoint import latest_tag

        return latest_tag(self.run_dir(name) / "checkpoints") == f"step_{steps:07d}"

    def shards(self) -> None:
        from .pipeline import sample_shard_commands

        cmds = sample_shard_commands(self.cfg, self.out / "logs")
        if cmds:
            self.timings["shards"] = run_commands(cmds, self.plan.workers, self.log)

    def pretrain(self) -> None:
        cmds = []
        for i, (lv, pos) in enumerate(self.runs):
            n = self.run_name(lv, pos)
            argv = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1",
                    "--master_port", str(self.port + i), "launch/pretrain.py",
                    "--config", self.plan.config, f"--attention.position={pos}",
                    f"--train.seed={self.plan.seed}", f"--name=regime-{n}",
                    f"--run_dir={self.run_dir(n)}", *lv.overrides(self.blend, self.plan.task_prefix)]
            cmds.append(Command(f"pretrain {n}", argv, self.out / "logs" / f"pretrain-{n}.log",
                                threads=1, done=lambda n=n, s=lv.steps: self._trained(n, s)))
        took = run_commands(cmds, self.plan.workers, self.log)  # 0.0: skipped (done before)
        self.timings.setdefault("pretrain", {}).update({k: v for k, v in took.items() if v})

    def export(self) -> None:
        from lenext_dist.convert import export

        for lv, pos in self.runs:
            n = self.run_name(lv, pos)
            if not (self.model_dir(n) / "config.json").exists():
                export(self.run_dir(n) / "checkpoints", self.model_dir(n), overwrite=True)

    def evaluate(self) -> None:
        tasks = []
        for lv, pos in self.runs:
            todo = [j for j in self.jobs(lv, pos).values() if not j.done()]
            if todo:
                n = self.run_name(lv, pos)
                tasks.append(Task(f"eval {n}", jobs=todo, log=self.out / "logs" / f"eval-{n}.log"))
        self.timings.setdefault("evaluate", {}).update(run_tasks(tasks, self.plan.workers, log=self.log))

    def run_all(self) -> None:
        for step in (self.shards, self.pretrain, self.export, self.evaluate):
            t0 = time.perf_counter()
            self.log(f"[regime] == {step.__name__}")
            step()
            self.timings.setdefault("steps", {})[step.__name__] = round(time.perf_counter() - t0, 1)
            atomic_write(self.timings_path, json.dumps(self.timings, indent=1))

    # ------------------------------------------------------------------ results
    def measure(self, lv: Levers, pos: str) -> dict:
        jobs = self.jobs(lv, pos)
        ppl = json.loads(jobs["ppl"].result_path.read_text())
        pk = json.loads(jobs["passkey"].result_path.read_text())
        tk = json.loads(jobs["tasks"].result_path.read_text())
        diag = {d["length"]: d for d in ppl.get("diagnostics", [])}
        return {"ppl": ppl["results"][0]["ppl"],
                "gain": diag.get(lv.L, {}).get("context_use", {}).get("gain"),
                "tasks": {k: v[0] for k, v in tk["accuracy"].items()},
                "task_tokens": task_tokens(tk, jobs["tasks"].lengths[0]),
                "passkey": pk["accuracy_by_length"][0], "passkey_length": pk["lengths"][0],
                "train_seconds": self.timings.get("pretrain", {}).get(
                    f"pretrain {self.run_name(lv, pos)}"),
                "sources": [str(j.result_path.relative_to(self.out)) for j in jobs.values()]}

    def table(self) -> list[dict]:
        rows = []
        for lv in self.plan.combos():
            r = {"levers": asdict(lv), "name": lv.name, "tokens": lv.steps * self.batch * lv.L}
            for pos in self.plan.positions:
                if all(j.done() for j in self.jobs(lv, pos).values()):
                    r[pos] = self.measure(lv, pos)
            rows.append(r)
        return rows


def task_tokens(result: dict, L: int) -> dict:
    """Per task, the share of answer tokens that are the argmax at length L (`lenext eval tasks`
    JSON): what tells rows apart while no document is wholly right."""
    return {c["task"]: c["token_accuracy"] for c in result["cells"] if c["length"] == L}


def gate_ratios(row: dict) -> Optional[dict]:
    """Each gate's measured / required (>= 1 passes); None when NoPE or RoPE is missing."""
    n, r = row.get("nope"), row.get("rope")
    if not n or not r or n["gain"] is None or r["gain"] is None:
        return None
    return {"passkey": n["tasks"]["passkey"] / GATE_PASSKEY, "gain": n["gain"] / GATE_GAIN,
            "ratio": (n["gain"] / (GATE_RATIO * r["gain"])) if r["gain"] > 0 else math.inf}


def choose(rows: list[dict]) -> tuple[Optional[dict], str]:
    scored = [(row, g) for row in rows if (g := gate_ratios(row))]
    if not scored:
        return None, "no combination measured"
    passing = [row for row, g in scored if min(g.values()) >= 1]
    if passing:
        best = min(passing, key=lambda row: row["tokens"])
        return best, f"`{best['name']}`: the cheapest combination passing every gate"
    # closest: the largest worst-gate ratio, ties (e.g. every passkey at 0) broken by the next worst
    best, g = max(scored, key=lambda x: sorted(x[1].values()))
    worst = min(g, key=g.get)
    return best, (f"`{best['name']}`: no combination passes every gate; this one is closest "
                  f"(its worst gate, {worst}, at {g[worst]:.2f} of the required)")


def table_lines(rows: list[dict]) -> list[str]:
    """The regime table (markdown lines): per row NoPE and RoPE side by side, each number's JSON."""
    def f(x, nd=3):
        return "-" if x is None else f"{x:.{nd}f}"

    def tasks(m, key="tasks"):
        t = m.get(key) or {}
        return "/".join(f(t.get(k), 2) for k in TASK_NAMES)

    kinds = "/".join(TASK_NAMES)
    md = ["| combination | tokens | NoPE ppl@L | RoPE ppl@L | NoPE gain | RoPE gain | NoPE/RoPE | "
          f"NoPE tasks@P ({kinds}) | RoPE tasks@P ({kinds}) | NoPE answer tokens@P | "
          "RoPE answer tokens@P | NoPE passkey (LongLoRA) @P | RoPE passkey (LongLoRA) | "
          "train s (NoPE, RoPE) | JSON |", "|---" * 15 + "|"]
    for row in rows:
        n, r = row.get("nope") or {}, row.get("rope") or {}
        ratio = (n["gain"] / r["gain"]) if n.get("gain") is not None and r.get("gain") else None
        srcs = ", ".join(f"`{s}`" for m in (n, r) for s in m.get("sources", []))
        md.append(f"| `{row['name']}` | {row['tokens']:,} | {f(n.get('ppl'), 2)} | {f(r.get('ppl'), 2)} | "
                  f"{f(n.get('gain'))} | {f(r.get('gain'))} | {f(ratio, 2)} | "
                  f"{tasks(n)} | {tasks(r)} | {tasks(n, 'task_tokens')} | {tasks(r, 'task_tokens')} | "
                  f"{f(n.get('passkey'), 2)} @{n.get('passkey_length', '-')} | "
                  f"{f(r.get('passkey'), 2)} | {f(n.get('train_seconds'), 0)}, "
                  f"{f(r.get('train_seconds'), 0)} | {srcs or row.get('provenance', '-')} |")
    return md


GATES = (f"Gates: NoPE task-format passkey at P >= {GATE_PASSKEY}, NoPE gain >= {GATE_GAIN} nats and "
         f">= {GATE_RATIO}x RoPE's. Tasks@P: documents of each task generator with every answer "
         "token right (`lenext eval tasks`); P: the shortest multiple of L holding a task "
         "document and a LongLoRA prompt (L; 2L for L = 64).")


def render(rows: list[dict], plan: RegimePlan) -> str:
    best, why = choose(rows)
    return "\n".join(
        [f"Regime search (`{plan.config}`, seed {plan.seed}, base `{plan.base.name}`, one lever "
         f"changed per row). {GATES}", ""] + table_lines(rows)
        + ["", f"Chosen: {why}.", ""])


def write(regime: Regime) -> Path:
    rows = regime.table()
    best, why = choose(rows)
    (regime.out / "regime.json").write_text(json.dumps(
        {"plan": asdict(regime.plan), "rows": rows, "chosen": best and best["name"], "why": why,
         "timings": regime.timings}, indent=1, default=str))
    md = regime.out / "REGIME.md"
    md.write_text("# " + regime.plan.name + "\n\n" + render(rows, regime.plan))
    return md


def publish(out: Path, dest: Path) -> list[str]:
    """Merge the measured rows of <out>/regime.json (both positions evaluated) into the record
    <dest>/regime.json: a row of the same name is replaced, the record's other rows stay with
    their provenance; the JSON each merged row cites is copied to the same relative path under
    `dest` (a path outside `out` or `dest` is refused before anything is copied). Returns the
    merged rows' names."""
    run = json.loads((Path(out) / "regime.json").read_text())
    path = Path(dest) / "regime.json"
    rec = json.loads(path.read_text()) if path.exists() else {"about": "The regime search's record.",
                                                              "rows": []}
    rows = [row for row in run["rows"] if row.get("nope") and row.get("rope")]
    what = str(Path(out) / "regime.json")
    copies = [(inside(out, rel, what), inside(dest, rel, what))  # every path checked first
              for row in rows for side in ("nope", "rope") for rel in row[side]["sources"]]
    gone = [str(src) for src, _ in copies if not src.is_file()]
    if gone:
        raise PublishError(f"{what} cites {gone[0]}, which is not there ({len(gone)} missing); "
                           "rerun the search (without --report-only); nothing was published")
    for src, dst in copies:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    merged = []
    for row in rows:
        lv = row["levers"]
        merged.append({**row, "levers": ", ".join(f"{k} {v}" for k, v in lv.items()),
                       "provenance": f"`python -m lenext_dist.study --regime` ({run['plan']['config']}, "
                                     f"seed {run['plan']['seed']})"})
    names = {r["name"] for r in merged}
    rec["rows"] = [r for r in rec["rows"] if r["name"] not in names] + merged
    Path(dest).mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(rec, indent=1))
    return [r["name"] for r in merged]
