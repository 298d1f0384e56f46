"""What a study runs: the `StudyPlan` (quick and full presets) and its evaluation cells.

A *run* is one pretraining (position variant x seed). A *cell* is one model folder evaluated one
way: a run's export, optionally with eval-time options (RoPE+PI/NTK/YaRN with factor s,
sliding window, log-length scale, a uniform scale c). `cells()` lists every cell of the study;
the HeadScale cells come from `lenext extend` (see pipeline.py).

Every cell is also evaluated for retrieval by length (the LongLoRA passkey and the task-format
documents of the training generators, 1x..16x L).

Presets (measured on 2 shared CPU cores, see STUDY.md of each run for the real timings):
  quick  configs/study/quick.yaml, 1 seed, NoPE + RoPE + every other registered variant,
         small eval budgets: ~5 minutes (CI)
  full   configs/study/full.yaml, 2 seeds of NoPE and RoPE, + other trained variants registered
         in lenext_dist/attention/registry.py (1 seed), larger budgets: ~95 minutes alone
         (docs/study/timings.json: 78 min pretraining 6 runs two at a time beside other work,
         ~66 alone; 25 min evaluation)
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

ABLATIONS: dict[str, tuple[str, dict]] = {
    "no_bound": ("w/o bound m_h >= 1", {"min_value": None}),
    "init_1": ("w/o fit init (m_h = 1)", {"init": 1.0}),
}
"""HeadScale ablations (paper section 4.5, Table 4): name -> (label, ExtendOptions changes)."""

REGIME_RECORD = "docs/regime"
"""The regime search's record in the repository: regime.json and the JSON its rows cite, what the
full study's STUDY.md shows (StudyPlan.regime); `python -m lenext_dist.study --regime --publish`
merges a search's rows into it (regime.publish)."""
PASSKEY_MIN = 128
"""Shortest retrieval length: a passkey prompt with one filler sentence (eval/passkey.py, sample
tokenizer); a task document of the sample's generators with filler fits too."""
ROPE_EXTENSIONS = {"pi": "PI", "ntk": "NTK", "yarn": "YaRN"}
"""RoPE's eval-time extensions (attention/rope.py; `rope_scaling`) -> their table label."""


@dataclass
class StudyPlan:
    name: str
    config: str
    """Pretraining config (configs/study/*.yaml); position and seed are set per run."""
    seeds: list[int]
    """Seeds of the NoPE and RoPE runs (train.seed; the data order stays the config's)."""
    extra_variants: list[str] = field(default_factory=list)
    """Other trained position variants (registry names), one run each with the first seed;
    a name the registry does not hold is skipped with a note."""
    factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """Evaluation lengths as multiples of L."""
    uniform_c: list[float] = field(default_factory=lambda: [0.8, 1.0, 1.2, 1.5])
    rope_factors: list[int] = field(default_factory=lambda: [2, 4, 8])
    """RoPE+PI / NTK / YaRN extension factors s (each evaluated at every length)."""
    headscale_targets: list[int] = field(default_factory=lambda: [2, 4, 8])
    """HeadScale targets as multiples of L (`lenext extend` per NoPE seed)."""
    headscale_ablations: list[str] = field(default_factory=lambda: list(ABLATIONS))
    """The paper's two HeadScale ablations (Table 4; ABLATIONS), each a search at the largest
    target for the first NoPE seed."""
    headscale_seeds: int = 1
    """How many NoPE seeds get the HeadScale search (the first ones)."""
    headscale_steps: int = 200
    budget_tokens: int = 10000
    """Scored tokens per PPL cell (sliding window, last-stride protocol, stride L/2)."""
    curve_windows: int = 100
    """Full-protocol windows of 8L for the per-position loss curves (Figure 1)."""
    entropy_samples: int = 16
    sweep_c: tuple[float, float, float] = (0.8, 2.0, 0.05)
    """(min, max, step) of the uniform-scale sweep; the grid holds c = 1 (the fit's anchor) and the
    uniform_c cells."""
    sweep_samples: int = 32
    passkey_keys: int = 5
    passkey_depths: int = 5
    retrieval_factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """Lengths (multiples of L, those >= 128 tokens: a prompt with filler) of the retrieval
    evaluations of every cell: the LongLoRA passkey and the task-format documents."""
    task_docs: int = 32
    """Task-format documents per generator and length (`lenext eval tasks`)."""
    workers: int = 2
    """Parallel lanes (training runs side by side with 1 rank x 1 thread each; eval workers)."""
    train_ranks: int = 1
    """Ranks per training run (deepspeed --num_gpus); 1 rank x `workers` runs side by side was
    faster here than 2 ranks one run after another (DESIGN section 9: ~5%; also fewer launches)."""
    data: list[str] = field(default_factory=lambda: ["data/sample/heldout/books.jsonl.zst"])
    overrides: list[str] = field(default_factory=list)
    """Extra `--a.b=value` overrides for every pretraining run (e.g. --train.steps=2000)."""
    regime: Optional[str] = None
    """The regime search's record this study's config was chosen from (a folder holding
    regime.json and the JSON its rows cite); STUDY.md shows its table and choice."""

    def to_dict(self) -> dict:
        return asdict(self)


QUICK = StudyPlan(
    name="quick", config="configs/study/quick.yaml", seeds=[1],
    extra_variants=["alibi", "kerple_log", "kerple_power", "sandwich", "xpos"],
    uniform_c=[0.8, 1.2, 1.5], rope_factors=[2, 4], headscale_targets=[2, 4],
    headscale_steps=20, budget_tokens=2048, curve_windows=20, entropy_samples=4,
    sweep_c=(0.8, 2.0, 0.1), sweep_samples=8, passkey_keys=2, passkey_depths=3,
    retrieval_factors=[1, 2], task_docs=4)

FULL = StudyPlan(  # the defaults above; 102 min here beside other work (docs/study/timings.json)
    name="full", config="configs/study/full.yaml", seeds=[1, 2],
    extra_variants=["alibi", "kerple_log"], regime=REGIME_RECORD)

PRESETS = {"quick": QUICK, "full": FULL}

ABLATIONS: dict[str, tuple[str, dict]] = {
    "no_bound": ("w/o bound m_h >= 1", {"min_value": None}),
    "init_1": ("w/o fit init (m_h = 1)", {"init": 1.0}),
}
"""HeadScale ablations (paper section 4.5, Table 4): name -> (label, ExtendOptions changes)."""


def preset(name: str, **changes) -> StudyPlan:
    base = PRESETS[name]
    return replace(base, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class Run:
    position: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.position}-s{self.seed}"


def runs(plan: StudyPlan, registered: set[str]) -> tuple[list[Run], list[str]]:
    """The pretraining runs, and notes on variants skipped because they are not registered."""
    out = [Run(p, s) for s in plan.seeds for p in ("nope", "rope")]
    notes = []
    for v in plan.extra_variants:
        if v in registered:
            out.append(Run(v, plan.seeds[0]))
        else:
            notes.append(f"variant `{v}` skipped: `attention.position` does not accept it "
                         f"(registered: {', '.join(sorted(registered))})")
    return out, notes


@dataclass(frozen=True)
class Cell:
    """One evaluation: `method` names the row of the tables, `run` the pretraining run."""
    name: str
    run: str
    method: str
    position: str
    scale_c: Optional[float] = None
    """Eval-time options of the cell's jobs (lenext_dist.eval.jobs), applied to the loaded export:
    a uniform scale c, a sliding window, a RoPE extension (scaling, factor s), a log-length scale."""
    window: Optional[int] = None
    rope_scaling: Optional[str] = None
    rope_factor: Optional[float] = None
    log_scale_a: Optional[float] = None
    curve: bool = False
    """Also the per-position loss curve (full windows of 8L) and the attention entropy."""
    matched_factor: Optional[int] = None
    """For per-length methods (s = T/L): the only length factor this cell belongs to in the
    'matched' table (None: every length)."""
    headscale_target: Optional[int] = None
    """For a HeadScale cell: its target length T; the model is `lenext extend`'s export of that
    search (ExtendOptions.export_dir), evaluated after the searches."""
    ablation: Optional[str] = None
    """For a HeadScale ablation cell: its ABLATIONS name (a search of its own)."""


def _fmt_c(c: float) -> str:
    return f"{c:g}"


def cells(plan: StudyPlan, run_list: list[Run], L: int,
          fitted: Optional[dict[str, dict]] = None) -> list[Cell]:
    """Every eval-time cell. fitted: per NoPE run name, {"a": a} from its scale sweep (the
    fitted-scale cells are only listed once the sweep exists)."""
    out: list[Cell] = []
    for r in run_list:
        n = r.name
        base_curve = True
        out.append(Cell(n, n, r.position, r.position, curve=base_curve))
        out.append(Cell(f"{n}-window", n, f"{r.position} + window L", r.position,
                        window=L))
        if r.position == "rope":
            for s in plan.rope_factors:
                for kind, label in ROPE_EXTENSIONS.items():
                    out.append(Cell(f"{n}-{kind}{s}", n, f"rope + {label}",
                                    "rope", rope_scaling=kind, rope_factor=float(s),
                                    matched_factor=s))
        if r.position == "nope":
            for c in plan.uniform_c:
                if c == 1.0:
                    continue
                out.append(Cell(f"{n}-c{_fmt_c(c)}", n, f"nope c={_fmt_c(c)}", "nope", scale_c=c,
                                curve=True))
            fit = (fitted or {}).get(n)
            if fit and fit.get("a") is not None:
                a = fit["a"]
                for f in plan.factors:
                    if f == 1:
                        continue
                    c = round(1.0 + a * math.log(f), 4)
                    out.append(Cell(f"{n}-fit{f}", n, "nope c(T) fitted", "nope", scale_c=c,
                                    matched_factor=f))
                out.append(Cell(f"{n}-logscale", n, "nope log scale 1+a ln(i/L)", "nope",
                                log_scale_a=round(a, 4),
                                curve=True))
    nope = [r for r in run_list if r.position == "nope"][: plan.headscale_seeds]
    for r in nope:
        for f in plan.headscale_targets:
            out.append(Cell(f"{r.name}-hs{L * f}", r.name, "nope HeadScale", "nope",
                            matched_factor=f, headscale_target=L * f))
        f = max(plan.headscale_targets)
        for a in plan.headscale_ablations:
            out.append(Cell(f"{r.name}-hs{L * f}-{a}", r.name, f"nope HeadScale {ABLATIONS[a][0]}",
                            "nope", matched_factor=f, headscale_target=L * f, ablation=a))
    return out
