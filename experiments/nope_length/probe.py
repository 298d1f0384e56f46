"""The ordered-copy probe (`python -m experiments.nope_length.probe [--quick]`): DESIGN.md section
9's quick check that the model can learn ordered copying, trained through the project's own
megatron model (`lenext_dist.model.build_model`, our core attention). An experiment on top of the
library, like the study beside it: it imports `lenext_dist`, never the reverse.

Why: it answers in minutes whether the model path can learn what a length study needs (ordered,
far-back copying) and shows the paper's picture at CPU scale, independent of any training data:
NoPE holds past L, collapses further out, and a uniform scale c > 1 brings it back; RoPE fails
right past L. The same task with the loss on every token (`--loss all`, the control) is not learned
in the same steps: the reason for `data.task_loss: answers` (docs/design-notes.md).

A sequence of `length` + 1 tokens: random filler tokens [0, filler); at a random place the key
marker K and `copy` value tokens [filler, filler + values); it ends with the query marker Q and
the same values in order. Loss on those last `copy` tokens (`loss="answers"`) or on every token
(`loss="all"`). Accuracy: the share of fresh sequences with every answer token the argmax.
Plain AdamW in one process, fp32, no DeepSpeed: the probe tests the model, not the engine.

  python -m experiments.nope_length.probe --quick          # CI size, seconds
  python -m experiments.nope_length.probe                  # ~5 min on 2 cores -> results/probe-answers/
  python -m experiments.nope_length.probe --loss all       # the control: loss on every token
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from lenext_dist.atomic import atomic_write
from lenext_dist.flags import Parser


@dataclass(frozen=True)
class ProbePlan:
    positions: tuple[str, ...] = ("nope", "rope")
    loss: str = "answers"
    """'answers': loss on the copied tokens only; 'all': on every token (the control)."""
    steps: int = 1500
    length: int = 64
    """Training length L."""
    batch: int = 64
    filler: int = 32
    values: int = 16
    copy: int = 4
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    lr: float = 3e-3
    multiples: tuple[int, ...] = (1, 2, 4, 8)
    scales: tuple[float, ...] = (1.0, 1.2, 1.5)
    eval_sequences: int = 256
    seed: int = 0

    def __post_init__(self):
        if self.loss not in ("answers", "all"):
            raise ValueError(f"probe loss must be 'answers' or 'all', got {self.loss!r}")
        if self.length < 2 * self.copy + 3:
            raise ValueError(f"probe length {self.length} cannot hold key, query and 2 x {self.copy} values")

    @property
    def vocab(self) -> int:
        return self.filler + self.values + 2  # + K, Q

    def config(self, position: str):
        from lenext_dist.config import (AttentionConfig, ModelConfig, ParallelConfig, RunConfig,
                                        TrainConfig)

        return RunConfig(
            model=ModelConfig(num_layers=self.layers, hidden_size=self.hidden,
                              num_attention_heads=self.heads, num_query_groups=self.heads,
                              ffn_hidden_size=int(2.75 * self.hidden), vocab_size=self.vocab,
                              seq_length=self.length),
            attention=AttentionConfig(position=position), train=TrainConfig(precision="fp32"),
            parallel=ParallelConfig(zero_stage=0))


QUICK_PROBE = ProbePlan(steps=30, batch=8, eval_sequences=16, multiples=(1, 2), scales=(1.0, 1.5))


def sequences(plan: ProbePlan, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[n, length + 1] token ids; the last `plan.copy` tokens are the answers."""
    c, key, query = plan.copy, plan.filler + plan.values, plan.filler + plan.values + 1
    x = torch.randint(0, plan.filler, (n, length + 1), generator=gen)
    vals = torch.randint(plan.filler, plan.filler + plan.values, (n, c), generator=gen)
    # the key and its values end before the query (at length - c)
    at = torch.randint(0, length - 2 * c, (n,), generator=gen)
    rows = torch.arange(n)
    x[rows, at] = key
    for j in range(c):
        x[rows, at + 1 + j] = vals[:, j]
    x[:, length - c] = query
    x[:, length - c + 1:] = vals
    return x


def _positions(n: int, length: int) -> torch.Tensor:
    return torch.arange(length)[None].expand(n, -1)


def set_uniform_scale(model: torch.nn.Module, c: float) -> None:
    """lambda = c / sqrt(d) on every head of every layer of a megatron model."""
    from lenext_dist.model.core_attention import LenextCoreAttention

    for m in model.modules():
        if isinstance(m, LenextCoreAttention):
            m.set_uniform_scale(c)


@torch.no_grad()
def accuracy(model, plan: ProbePlan, length: int, c: float = 1.0) -> float:
    """Share of `plan.eval_sequences` fresh sequences (a fixed seed) with every answer right."""
    x = sequences(plan, plan.eval_sequences, length, torch.Generator().manual_seed(10_000 + plan.seed))
    set_uniform_scale(model, c)
    try:
        logits = model(x[:, :-1], _positions(len(x), length), None)  # [n, length, vocab]
    finally:
        set_uniform_scale(model, 1.0)
    right = logits[:, -plan.copy:].argmax(-1) == x[:, -plan.copy:]
    return right.all(-1).float().mean().item()


def train(plan: ProbePlan, position: str, log: Callable[[str], None] = print):
    """The probe model of `position`, trained for plan.steps (in this process, one rank; needs
    megatron's state: `init_megatron(plan.seed)`, as `run_probe` does)."""
    from lenext_dist.model import build_model

    model = build_model(plan.config(position), device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=plan.lr)
    gen = torch.Generator().manual_seed(plan.seed)
    n, L, t0 = plan.batch, plan.length, time.perf_counter()
    every = max(1, plan.steps // 6)
    for step in range(1, plan.steps + 1):
        x = sequences(plan, n, L, gen)
        loss = model(x[:, :-1], _positions(n, L), None, labels=x[:, 1:])  # [n, L] per token
        loss = loss[:, -plan.copy:].mean() if plan.loss == "answers" else loss.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == plan.steps:
            model.eval()
            log(f"[probe] {position} step {step}/{plan.steps} loss {loss.item():.3f} "
                f"accuracy at L {accuracy(model, plan, L):.2f} ({time.perf_counter() - t0:.0f} s)")
            model.train()
    return model.eval()


def run_probe(plan: ProbePlan, out: Path, log: Callable[[str], None] = print) -> dict:
    """Train every position of the plan, measure accuracy per (c, multiple of L); write
    <out>/probe.json and <out>/PROBE.md. Returns the JSON."""
    import torch.distributed as dist

    from lenext_dist.model import destroy_megatron, init_megatron, init_single_process_group

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    own = init_single_process_group()
    try:
        for position in plan.positions:
            init_megatron(plan.seed)  # the same initial weights' seed for every position
            try:
                t0 = time.perf_counter()
                model = train(plan, position, log)
                seconds = round(time.perf_counter() - t0, 1)
                for c in plan.scales:
                    rows.append({"position": position, "c": c, "seconds": seconds,
                                 "accuracy": {str(k): accuracy(model, plan, k * plan.length, c)
                                              for k in plan.multiples}})
                    log(f"[probe] {position} c={c:g}: " + ", ".join(
                        f"{k}L {a:.2f}" for k, a in rows[-1]["accuracy"].items()))
            finally:
                destroy_megatron()
    finally:
        if own:
            dist.destroy_process_group()
    result = {"plan": asdict(plan), "rows": rows}
    atomic_write(out / "probe.json", json.dumps(result, indent=1))
    atomic_write(out / "PROBE.md", render(result))
    return result


def render(result: dict) -> str:
    p = result["plan"]
    head = [f"{k}L" for k in p["multiples"]]
    on = "the copied tokens only" if p["loss"] == "answers" else "every token"
    lines = [f"# Ordered-copy probe (loss on {on}, {p['steps']} steps, L = {p['length']})",
             "", f"Every one of the {p['copy']} copied tokens right, {p['eval_sequences']} fresh "
             "sequences per cell (experiments/nope_length/probe.py; numbers from probe.json).", "",
             "| model | c | " + " | ".join(head) + " | train s |",
             "|---|---|" + "---|" * len(head) + "---|"]
    for r in result["rows"]:
        lines.append(f"| {r['position']} | {r['c']:g} | " + " | ".join(
            f"{r['accuracy'][str(k)]:.2f}" for k in p["multiples"]) + f" | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main_probe(quick: bool, out: Optional[str], loss: str = "answers") -> int:
    from dataclasses import replace

    plan = replace(QUICK_PROBE if quick else ProbePlan(), loss=loss)
    torch.set_num_threads(1)  # a tiny model: more threads only spin (tests/tiny_models.one_thread)
    folder = Path(out or f"results/probe{'-quick' if quick else ''}-{plan.loss}")
    run_probe(plan, folder)
    print(f"[probe] wrote {folder / 'PROBE.md'}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = Parser(
        prog="python -m experiments.nope_length.probe",
        description="Train NoPE and RoPE on a synthetic ordered-copying task and measure it at 1-8x L.",
        epilog="examples:\n"
               "  python -m experiments.nope_length.probe --quick      # CI size, seconds\n"
               "  python -m experiments.nope_length.probe              # ~5 minutes on 2 cores\n"
               "  python -m experiments.nope_length.probe --loss all   # the control: loss on every token",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a CI-sized run: 30 steps, 1x and 2x L")
    ap.add_argument("--loss", choices=("answers", "all"), default="answers",
                    help="loss on the copied tokens only (default), or on every token (the control)")
    ap.add_argument("--out", help="where PROBE.md and probe.json go (default results/probe[-quick]-<loss>)")
    a = ap.parse_args(argv)
    return main_probe(a.quick, a.out, a.loss)


if __name__ == "__main__":
    sys.exit(main())
