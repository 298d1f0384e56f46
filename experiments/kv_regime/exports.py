"""What a grid run trains on, by name (its shards, its blend), and which finished run an exported
model is: the facts sweep.py (which trains and scores the runs) and study.py (which measures them)
share. An export's folder says what it is (config.json: position, window, the checkpoint's tag;
lenext_run_config.yaml: its training data)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from experiments.nope_length.study import Model

from .analysis import TRAIN_MIX
from .data import skip_name
from .grids import L, Run


KEPT = "kept.json"
"""What `sweep keep` writes into a kept run's folder: which run, checkpoint and work folder it is."""


def exported(models: Path) -> list[Path]:
    """The exported models under `models` (one folder each, <name>/config.json); none is an error."""
    found = sorted(p.parent for p in Path(models).glob("*/config.json"))
    if not found:
        raise SystemExit(f"error: {models} holds no exported model (<name>/config.json)")
    return found


def shard_name(mix: tuple[str, ...], bos: bool = False, length: int = L, fill: str = "uniform") -> str:
    """The shards of a mixture (the seeds grid's keep their first name); with BOS the documents
    are one token shorter (BOS is added when samples are built); `_l<n>` for documents of n != L;
    `_<fill>` over a filler other than the uniform one."""
    name = "kvmix" if mix == TRAIN_MIX else "kv_" + "_".join(
        p.replace("=", "").replace(":", "-") for p in mix)
    return (name + (f"_l{length}" if length != L else "") + ("_bos" if bos else "")
            + (f"_{fill}" if fill != "uniform" else ""))


def shard_sets(r: Run) -> list[tuple[tuple[str, ...], bool, int, str]]:
    """The shards a run reads: (mix, bos, document length, filler) of each stage."""
    return [(r.mix, r.bos, L, r.fill)] + ([(r.warm.mix, r.bos, r.warm.length, r.fill)] if r.warm else [])


def first_shards(r: Run) -> str:
    """The kv shard of a run's first stage (first_blend adds its text beside it)."""
    return shard_name(*shard_sets(r)[-1])


def blend(shard: str, r: Run) -> list[tuple[str, float]]:
    """A training blend of run r, (shard, weight) each: the kv shard, and the run's skip-bigram
    text at weight r.lm beside it."""
    kv = f"{shard}_train"
    return [(kv, round(1 - r.lm, 6)), (f"{skip_name(r.lm_text)}_train", r.lm)] if r.lm else [(kv, 1.0)]


def first_blend(r: Run) -> list[tuple[str, float]]:
    """The blend of a run's first stage: what its export records as its data."""
    return blend(first_shards(r), r)


def trained_on(pairs: list[tuple[str, float]]) -> str:
    """A training blend in words: its shards, each with its weight where there are several."""
    return " + ".join(n if len(pairs) == 1 else f"{n} ({w:g})" for n, w in pairs)


def model_of(folder: Path) -> tuple[Model, str]:
    """The study's Model of an exported grid run (<position>-s<seed>) and its checkpoint's tag."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {folder}/config.json: {e}") from None
    window = (cfg.get("attention_options") or {}).get("window")
    seed = folder.name.rsplit("-s", 1)[-1]
    if "position" not in cfg or not seed.isdigit():
        raise SystemExit(f"error: {folder} is not an export of a kv regime run "
                         "(a lenext model named <position>-s<seed>)")
    tag = (cfg.get("lenext_source") or {}).get("tag")
    if not tag:
        raise SystemExit(f"error: {folder}/config.json names no checkpoint (lenext_source.tag)")
    return Model(folder.name, cfg["position"], int(seed),
                 (f"--attention.window={window}",) if window else ()), tag


def trained_blend(folder: Path) -> str:
    """The shards a model was trained on, with their weights (its export's run config: its first
    stage's data.blend), in trained_on's words."""
    import yaml

    try:
        cfg = yaml.safe_load((folder / "lenext_run_config.yaml").read_text())
        found = [(Path(b["prefix"]).name, float(b.get("weight", 1.0))) for b in cfg["data"]["blend"]]
        if not found:
            raise IndexError("an empty blend")
        return trained_on(found)
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise SystemExit(f"error: {folder}/lenext_run_config.yaml names no training data ({e}): "
                         "not an export of a kv regime run") from None


def is_run(m: Model, trained: str, tag: str, r: Optional[Run]) -> bool:
    """Is the exported model `m`, trained on the shards `trained` (its first stage's blend, in
    trained_on's words) to the checkpoint `tag`, the finished grid run `r`: its position, its
    window, its training data (the kv shards and any text beside them) and its last step (a run cut
    short is not the regime; grids may share everything but steps)?"""
    return (r is not None and r.position == m.position and trained == trained_on(first_blend(r))
            and tag == f"step_{r.steps:07d}"
            and m.overrides == ((f"--attention.window={r.window}",) if r.window else ()))


def finished_run(f: Path, runs: dict[str, Run], grids: str, hint: str) -> tuple[Model, str]:
    """(Model, checkpoint tag) of the exported model in folder f, a finished run of `runs` (grids:
    their name, hint: what to do, for the error): a sitting cut short exports its latest
    checkpoint into the run's folder, which, scored, studied or kept, would stand for the run."""
    m, tag = model_of(f)
    trained, r = trained_blend(f), runs.get(m.name)  # grids share run names: the data tells
    if not is_run(m, trained, tag, r):
        window = f", window {m.overrides[0].split('=')[1]}" if m.overrides else ""
        want = (f"its {m.name}: {r.position}, {trained_on(first_blend(r))}, step_{r.steps:07d}" if r
                else f"no run named {m.name}")
        raise SystemExit(f"error: {f} ({m.position}{window}, trained on {trained}, checkpoint {tag}) "
                         f"is no finished run of {grids} ({want}): {hint}")
    return m, tag


def finished(models: Path, runs: dict[str, Run], grids: str, hint: str,
             named: bool = False) -> list[tuple[Path, Model, str]]:
    """(folder, Model, checkpoint tag) of every exported model under `models`, each a finished run
    (finished_run); named: only the folders named as runs of `runs` (a folder that keeps the runs
    of a grid and of its others grid, scored one grid at a time). A kept model (`sweep keep`:
    weights and config, KEPT) gets this checkout's modeling code here, before anything loads it
    (written each time: code written back by an older checkout would stand for this one's)."""
    from lenext_dist.convert.export import ship_code

    found = []
    for f in exported(models):
        if named and f.name not in runs:
            continue
        m, tag = finished_run(f, runs, grids, hint)
        if (f / KEPT).is_file():
            ship_code(f)
        found.append((f, m, tag))
    return found
