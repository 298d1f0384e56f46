"""The kv regime's runner (experiments/kv_regime/sweep.py) without training: each grid's configs
load and validate as `lenext train` loads them, the shard command asks for the training mixture,
the skewed filler is skewed, and the table marks passing cells and reports the gate."""
import json
import os
import re
import shutil
from pathlib import Path
from collections import Counter

import numpy as np
import pytest

from experiments.kv_regime import data, exports, grids, sweep
from experiments.kv_regime.analysis import FORMATS, TRAIN_MIX
from lenext_dist.config import load_config
from lenext_dist.prep.kv_corpus import alphabet


@pytest.mark.parametrize("grid", sorted(grids.GRIDS))
def test_every_run_of_every_grid_is_a_valid_config(grid, tmp_path):
    for name, spec in grids.GRIDS[grid].items():
        f = tmp_path / f"{name}.yaml"
        f.write_text(sweep.config(name, spec, tmp_path / "sh", tmp_path, "gloo"))
        cfg = load_config(str(f), [])
        assert cfg.model.train_length == grids.L and cfg.train.global_batch_size == spec[4]
        assert cfg.attention.position == spec.position and cfg.train.seed == 1234 + spec.seed
        assert cfg.train.steps == spec.steps
        assert cfg.attention.window == (spec.window or None) and cfg.data.bos == spec.bos
        assert (spec.warm is None) == (not cfg.train.stages)
        # the run's own mix at L: the whole run, or the stage after the warm one
        seq, blend = ((cfg.train.stages[-1].seq_length, cfg.train.stages[-1].blend) if spec.warm
                      else (cfg.model.seq_length, cfg.data.blend))
        own = exports.shard_name(spec.mix, spec.bos, fill=spec.fill)
        assert seq == grids.L and blend[0].prefix.endswith(f"/{own}_train")
        # the skip-bigram text beside the kv documents at weight lm; validation on kv alone
        assert [b.weight for b in blend] == ([1 - spec.lm, spec.lm] if spec.lm else [1.0])
        assert not spec.lm or blend[1].prefix.endswith(f"/{data.skip_name(spec.lm_text)}_train")
        assert [b.prefix.rsplit("/", 1)[1] for b in cfg.data.valid_blend] == [f"{own}_valid"]
        if spec.warm:  # the first stage: the short documents, the same sequences a step
            assert cfg.model.seq_length == spec.warm.length and cfg.train.stages[0].start_step == spec.warm.steps
            assert cfg.data.blend[0].prefix.endswith(
                f"/{exports.shard_name(spec.warm.mix, spec.bos, spec.warm.length, spec.fill)}_train")
            assert cfg.train.stages[0].global_batch_size == cfg.train.global_batch_size
    assert len(grids.GRIDS[grid]) == {"pilot": 8, "seeds": 6, "distract": 6, "others": 3, "distract_bos": 6,  # <= 8:
                                      "distract_warm": 6, "distract_long": 6, "distract_lm": 6,
                                      "distract_lm_all": 6, "others_lm_all": 3, "distract_vary": 6,
                                      "others_vary": 3}[grid]  # 2 cores a run


@pytest.mark.parametrize("mix", [TRAIN_MIX, grids.DISTRACT_MIX])
@pytest.mark.parametrize("bos", [False, True])
def test_shards_are_the_training_mixture_at_L(tmp_path, mix, bos):
    """With BOS (added when samples are built) the documents are L - 1 tokens: a sample of L
    tokens is still exactly one document."""
    cmd = " ".join(sweep.shard_command(tmp_path, 2, mix, bos))
    assert all(f"--task-set kv.{p}" in cmd for p in mix) and f"kv.length={grids.L - bos} " in cmd
    assert f"--name {exports.shard_name(mix, bos)} " in cmd
    assert exports.shard_name(mix, bos) != exports.shard_name(mix, not bos)
    short = " ".join(sweep.shard_command(tmp_path, 2, mix, bos, 48))
    assert f"kv.length={48 - bos} " in short and f"--name {exports.shard_name(mix, bos, 48)} " in short
    assert exports.shard_name(mix, bos, 48) != exports.shard_name(mix, bos)


def test_the_distract_grid_is_the_seeds_grid_with_a_distractor_in_every_document():
    assert exports.shard_name(TRAIN_MIX) == "kvmix"  # the seeds grid's shards keep their name
    same = {n: r._replace(mix=TRAIN_MIX) for n, r in grids.DISTRACT.items() if n in grids.SEEDS}
    assert same == grids.SEEDS and set(grids.DISTRACT) == set(grids.SEEDS)
    assert all(r.mix == grids.DISTRACT_MIX for g in (grids.DISTRACT, grids.OTHERS) for r in g.values())
    assert {r.position for r in grids.OTHERS.values()} == {"alibi", "kerple_log", "nope"}
    assert "distractors=1:3" in grids.DISTRACT_MIX and "distractors=0:3" not in grids.DISTRACT_MIX
    assert {n: r._replace(bos=False) for n, r in grids.DISTRACT_BOS.items()} == grids.DISTRACT
    assert all(r.bos for r in grids.DISTRACT_BOS.values())
    assert {n: r._replace(warm=None) for n, r in grids.DISTRACT_WARM.items()} == grids.DISTRACT
    assert {n: r._replace(steps=grids.STEPS) for n, r in grids.DISTRACT_LONG.items()} == grids.DISTRACT
    assert {r.steps for r in grids.DISTRACT_LONG.values()} == {12000}  # the plan as written
    assert {n: r._replace(lm=0.0) for n, r in grids.DISTRACT_LM.items()} == grids.DISTRACT
    assert {r.lm for r in grids.DISTRACT_LM.values()} == {0.05}  # the plan as written
    assert {n: r._replace(lm_text="filler") for n, r in grids.DISTRACT_LM_ALL.items()} == grids.DISTRACT_LM
    assert {r.lm_text for r in grids.DISTRACT_LM_ALL.values()} == {"all"}
    assert {n: r._replace(lm=0.0, lm_text="filler") for n, r in grids.OTHERS_LM_ALL.items()} == grids.OTHERS
    assert {(r.lm, r.lm_text) for r in grids.OTHERS_LM_ALL.values()} == {(0.05, "all")}
    w = grids.WARM  # the plan as written: 2000 steps of 48-token documents the copy is worth <= 0.5 in
    assert (w.steps, w.length, w.mix) == (2000, 48, ("values=2:4", "distractors=1:2"))
    assert [s[2] for s in exports.shard_sets(grids.DISTRACT_WARM["nope-s0"])] == [grids.L, 48]


@pytest.mark.parametrize("text, size", [("filler", 32), ("all", 99)])
def test_skip_text_is_predictable_from_the_token_one_back_only(tmp_path, text, size):
    """The next word is g(the word before the current one) ~90% of the time; the best guess from
    the current word alone is right ~1/V + a little: the loss needs the read one back. The text
    over every alphabet holds every word of the kv documents."""
    kinds = data.SKIP_TEXTS[text]
    folder = data.skip_text(tmp_path / "t", kinds, files=2, words=20_000)
    words = [w for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()
             for w in json.loads(line)["text"].split()]
    assert len(words) == 40_000 and len(set(words)) == size
    assert set(words) == {w for k in kinds for w in alphabet()[k]}

    def best_map_accuracy(back: int) -> float:  # the best function of the word `back` before
        pairs = Counter(zip(words[:-back], words[back:]))
        best = {}
        for (a, _), n in pairs.items():
            best[a] = max(best.get(a, 0), n)
        return sum(best.values()) / (len(words) - back)

    assert best_map_accuracy(2) > 0.85 and best_map_accuracy(1) < 0.1
    cmd = " ".join(sweep.skip_command(tmp_path, 2, text))  # a text shard: every token trains
    assert "--format jsonl " in cmd and f"--name {data.skip_name(text)} " in cmd and "--valid-fraction" not in cmd
    assert f"/{data.skip_name(text)}-text/" in cmd
    (folder / "skip-000.jsonl").unlink()  # rewritten after a kill: the same file
    again = data.skip_text(folder, kinds, files=3, words=20_000)
    texts = {f.name: f.read_text() for f in sorted(again.glob("*.jsonl"))}
    assert len(texts) == 3 and texts == {f.name: f.read_text() for f in sorted(
        data.skip_text(tmp_path / "u", kinds, files=3, words=20_000).glob("*.jsonl"))}
    assert data.skip_name("filler") == data.SKIP != data.skip_name("all")  # its shards keep their name


def test_zipf_filler_is_skewed(tmp_path):
    path = data.zipf_filler(tmp_path / "z.jsonl", words=20_000)
    words = " ".join(json.loads(line)["text"] for line in path.read_text().splitlines()).split()
    top = Counter(words).most_common(1)[0][1] / len(words)
    assert len(words) == 20_000 and top > 0.2  # uniform over 32 syllables: ~0.03


def test_the_vary_grids_are_the_lm_all_grids_over_the_varying_filler(tmp_path):
    for vary, base in (("distract_vary", "distract_lm_all"), ("others_vary", "others_lm_all")):
        assert {n: r._replace(fill="uniform") for n, r in grids.GRIDS[vary].items()} == grids.GRIDS[base]
        assert all(r.fill == "vary" for r in grids.GRIDS[vary].values())
    r = grids.DISTRACT_VARY["nope-s2"]
    assert exports.first_shards(r) == exports.shard_name(r.mix) + "_vary" != exports.shard_name(r.mix)
    cmd = sweep.shard_command(tmp_path, 2, r.mix, fill="vary")
    assert cmd[cmd.index("--input") + 1] == str(tmp_path / data.VARY / "*.jsonl")
    assert cmd[cmd.index("--name") + 1] == exports.first_shards(r)
    uniform = sweep.shard_command(tmp_path, 2, r.mix)
    assert uniform[uniform.index("--input") + 1].endswith("/train/*.jsonl")


def test_the_vary_shards_make_the_kv_data_on_a_clean_checkout(tmp_path, monkeypatch):
    # a clean checkout has no data/kv: the vary filler's shard command must make it, as the
    # uniform one does (its tokenizer was named before it existed: shard.py refused, 29 Nov)
    monkeypatch.setattr(data, "DATA", tmp_path / "kv")
    cmd = sweep.shard_command(tmp_path / "shards", 2, grids.DISTRACT_VARY["nope-s2"].mix, fill="vary")
    tokenizer = cmd[cmd.index("--tokenizer") + 1]
    assert tokenizer == str(tmp_path / "kv" / "tokenizer.model") and Path(tokenizer).is_file()


def _entropy(counts) -> float:
    p = np.array(list(counts.values()), dtype=float) / sum(counts.values())
    return float(-(p * np.log(p)).sum())


def test_vary_filler_varies_its_records_and_none_is_as_skewed_as_the_held_out_one(tmp_path):
    folder = data.vary_filler(tmp_path / "v", files=2, words=60_000)
    records = [json.loads(line)["text"].split() for f in sorted(folder.glob("*.jsonl"))
               for line in f.read_text().splitlines()]
    assert len(records) == 120 and {w for r in records for w in r} == set(alphabet()["filler"])
    h = [_entropy(Counter(r)) for r in records]  # of 1000 draws: ~0.015 nats under the profile's
    uniform = sum(x > np.log(32) - 0.05 for x in h)
    assert 0.35 < uniform / len(h) < 0.65  # VARY_UNIFORM of them uniform, the rest skewed
    assert min(h) > data.VARY_MIN_ENTROPY - 0.1 and max(h) - min(h) > 0.2
    zipf = data.zipf_filler(tmp_path / "z.jsonl", words=20_000)
    held_out = Counter(" ".join(json.loads(line)["text"] for line in zipf.read_text().splitlines()).split())
    assert _entropy(held_out) < data.VARY_MIN_ENTROPY - 0.1 < min(h)  # more skewed than any record
    (folder / "filler-000.jsonl").unlink()  # rewritten after a kill: the same file
    again = data.vary_filler(tmp_path / "v", files=2, words=60_000)
    assert [json.loads(line)["text"].split() for f in sorted(again.glob("*.jsonl"))
            for line in f.read_text().splitlines()] == records


def test_render_marks_passing_cells_and_the_gate(tmp_path):
    cells = {f: [{"length": 96, "accuracy": 1.0, "baseline": 0.0},
                 {"length": 192, "accuracy": 0.5, "baseline": 0.0}] for f, _, _ in FORMATS}
    cells["3 distractors"][0]["accuracy"] = 0.8
    rec = {"L": 96, "docs": 8, "test_seed": 0, "formats": [list(f) for f in FORMATS],
           "cells": {"nope-s0": cells}, "note": "", "valid_loss": {"nope-s0": [[1000, 0.5]]},
           "gate": {"nope": {"verdict": "fails", "seeds": ["nope-s0"], "failures": [1]}}}
    md = sweep.render(rec)
    assert "| nope-s0 | 1.00* / 0.50 (0.00) |" in md and "0.80 / 0.50 (0.00)" in md
    assert "- nope: **fails**" in md and "| nope-s0 | 0.500 |" in md


def _call(work, out, steps):
    """A device call's $OUT as train() packs it: logs.tar.gz (summary.json, each run's logs) and
    hf*.tar.gz (each run's export)."""
    for n in ("nope-s0", "rope-s0"):
        (work / "runs" / n).mkdir(parents=True, exist_ok=True)
        (work / "runs" / n / "metrics.jsonl").write_text(json.dumps({"step": steps, "valid_loss": 0.5}) + "\n")
        (work / "hf" / n).mkdir(parents=True, exist_ok=True)
        (work / "hf" / n / "config.json").write_text(json.dumps({"step": steps}))
    (work / "summary.json").write_text(json.dumps({"wall_s": 1.0, "runs": {"nope-s0": {"latest": steps}}}))
    out.mkdir(parents=True)
    sweep._pack(work, out, ["nope-s0", "rope-s0"])
    return out


def test_collect_unpacks_the_last_call_and_keeps_every_calls_summary(tmp_path):
    first = _call(tmp_path / "w", tmp_path / "out1", "step_0004000")
    second = _call(tmp_path / "w", tmp_path / "out2", "step_0006000")  # the same work folder, resumed
    into = tmp_path / "got"
    argv = ["collect", str(first), str(second), "--into", str(into), "--device", "H100"]
    assert sweep.main(argv) == 0
    rec = json.loads((into / "train-summary.json").read_text())
    assert rec["device"] == "H100" and [c["runs"]["nope-s0"]["latest"] for c in rec["calls"]] == [
        "step_0004000", "step_0006000"]
    assert json.loads((into / "models" / "rope-s0" / "config.json").read_text())["step"] == "step_0006000"
    assert "step_0006000" in (into / "logs" / "nope-s0" / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit, match="already holds models/ or logs/"):  # nothing overwritten
        sweep.main(argv)
    with pytest.raises(SystemExit, match="has no logs.tar.gz"):
        sweep.main(["collect", str(tmp_path), "--into", str(tmp_path / "x"), "--device", "H100"])
    for f in second.glob("hf*.tar.gz"):
        f.unlink()
    with pytest.raises(SystemExit, match=r"out2 \(the last call\) has no hf\*.tar.gz"):
        sweep.main(["collect", str(first), str(second), "--into", str(tmp_path / "x"), "--device", "H100"])
    (first / "logs.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(SystemExit, match="^error: a damaged pack"):
        sweep.main(["collect", str(first), "--into", str(tmp_path / "y"), "--device", "H100"])


def test_score_of_a_folder_without_models_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: .* holds no exported model"):
        sweep.main(["score", "--grid", "distract_vary", "--models", str(tmp_path), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "results.json").exists()


def test_the_work_summary_keeps_every_sitting(tmp_path):
    """A run resumed over sessions: each sitting's summary.json replaced the last, so a published
    train-summary.json held the last sitting only (the probe's were written in by hand)."""
    sweep.write_summary(tmp_path, {"wall_s": 9, "runs": {"nope-s0": {"latest": "step_0002890"}}},
                        "distract_vary", 0.0, {"nope-s0": None})
    sweep.write_summary(tmp_path, {"wall_s": 7, "runs": {"nope-s0": {"latest": "step_0006000"}}},
                        "distract_vary", 60.0, {"nope-s0": "step_0002890"})
    rec = json.loads((tmp_path / "summary.json").read_text())
    assert rec["wall_s"] == 7 and [x["runs"] for x in rec["sittings"]] == [
        {"nope-s0": [None, "step_0002890"]}, {"nope-s0": ["step_0002890", "step_0006000"]}]
    assert rec["sittings"][0]["grid"] == "distract_vary" and rec["sittings"][0]["start"] < rec["sittings"][1]["start"]


def _provenance(f, run, tag):
    """What `lenext convert` records of a grid run in its export: the checkpoint's tag and the
    run's first-stage blend."""
    cfg = json.loads((f / "config.json").read_text()) if (f / "config.json").exists() else {}
    (f / "config.json").write_text(json.dumps({**cfg, "position": run.position, "lenext_source": {"tag": tag}}))
    (f / "lenext_run_config.yaml").write_text("data:\n  blend:\n" + "".join(
        f"  - {{prefix: /sh/{n}, weight: {w}}}\n" for n, w in exports.first_blend(run)))


def test_score_takes_finished_runs_of_its_grid_only(tmp_path):
    """A sitting cut short exports its latest checkpoint into the same folder as the finished
    run's: scored, it entered the gate as that run (nothing in results.json said which checkpoint)."""
    run = grids.GRIDS["distract_vary"]["nope-s0"]
    (tmp_path / "m" / "nope-s0").mkdir(parents=True)
    _provenance(tmp_path / "m" / "nope-s0", run, "step_0005123")
    argv = ["score", "--grid", "distract_vary", "--models", str(tmp_path / "m"), "--out", str(tmp_path / "out")]
    blend = re.escape(exports.trained_on(exports.first_blend(run)))
    with pytest.raises(SystemExit, match=rf"^error: .*nope-s0 \(nope, trained on {blend}, checkpoint step_0005123\) "
                                         rf"is no finished run of grid distract_vary "
                                         rf"\(its nope-s0: nope, {blend}, step_0006000\)"):
        sweep.main(argv)
    _provenance(tmp_path / "m" / "nope-s0", run, "step_0006000")
    with pytest.raises(SystemExit, match=r"^error: .*nope-s0 \(nope, .*, checkpoint step_0006000\) is no finished run "
                                         r"of grid distract_lm_all \(its nope-s0: nope, .*skipgram"):  # other data
        sweep.main([*argv[:2], "distract_lm_all", *argv[3:]])
    assert not (tmp_path / "out" / "results.json").exists()
    # a folder keeping the others grid's runs too is scored one grid at a time
    other = tmp_path / "o" / "alibi-s0"
    other.mkdir(parents=True)
    _provenance(other, grids.GRIDS["others_vary"]["alibi-s0"], "step_0006000")
    with pytest.raises(SystemExit, match=r"^error: .*/o holds no run of grid distract_vary \(nope-s0, "):
        sweep.main([*argv[:4], str(tmp_path / "o"), *argv[5:]])


def test_keep_takes_finished_runs_and_never_overwrites(tmp_path):
    run = grids.GRIDS["distract_vary"]["nope-s0"]
    f = tmp_path / "w" / "hf" / "nope-s0"
    f.mkdir(parents=True)
    _provenance(f, run, "step_0005123")
    argv = ["keep", "--grid", "distract_vary", "--models", str(tmp_path / "w" / "hf"), "--only", "nope-s0",
            "--summary", str(tmp_path / "w" / "summary.json"), "--into", str(tmp_path / "kept")]
    with pytest.raises(SystemExit, match=r"^error: .*checkpoint step_0005123\) is no finished run .*: "
                                         r"keep finished runs only$"):
        sweep.main(argv)
    assert not (tmp_path / "kept").exists()
    _provenance(f, run, "step_0006000")
    one = {"start": "2026-11-29T20:15:00", "end": "2026-11-29T22:52:00", "runs": {"nope-s0": [None, "step_0005600"]}}
    two = {"start": "2026-11-30T08:00:00", "end": "2026-11-30T08:20:00",
           "runs": {"nope-s0": ["step_0005600", "step_0006000"], "nope-s1": [None, "step_0000500"]}}
    (tmp_path / "w" / "summary.json").write_text(json.dumps({"sittings": [one, two]}))
    sweep.main(argv)
    rec = json.loads((tmp_path / "kept" / "nope-s0" / "kept.json").read_text())
    assert rec["checkpoint"] == "step_0006000" and [s["checkpoints"] for s in rec["sittings"]] == [
        [None, "step_0005600"], ["step_0005600", "step_0006000"]]  # when it trained what
    assert "device" not in rec  # this machine's CPU: the run config's backend says so
    shutil.rmtree(tmp_path / "kept")
    sweep.main([*argv, "--device", "NVIDIA H200"])
    assert json.loads((tmp_path / "kept" / "nope-s0" / "kept.json").read_text())["device"] == "NVIDIA H200"
    with pytest.raises(SystemExit, match=r"^error: .*kept/nope-s0 exists: a kept run is never overwritten"):
        sweep.main(argv)


@pytest.mark.e2e
def test_score_records_each_models_checkpoint_and_the_eval_protocol(tmp_path):
    """A random export as a finished run, kept (weights and config, no code) and scored from
    there, 2 documents a cell (never checks an outcome): the eval folders and results.json name
    the checkpoint, REGIME.md the grid, checkpoints and protocol, and the kept metrics."""
    from tiny_models import save_tiny_lenext

    run = grids.GRIDS["distract_vary"]["nope-s0"]
    f = tmp_path / "w" / "hf" / "nope-s0"
    save_tiny_lenext(str(f), tokenizer=str(data.kv_data() / "tokenizer.model"), position="nope",
                     vocab_size=128, train_length=grids.L)
    _provenance(f, run, "step_0006000")
    (tmp_path / "w" / "runs" / "nope-s0").mkdir(parents=True)
    (tmp_path / "w" / "runs" / "nope-s0" / "metrics.jsonl").write_text('{"step": 6000, "valid_loss": 0.5}\n')
    kept = tmp_path / "kept"
    sweep.main(["keep", "--grid", "distract_vary", "--models", str(tmp_path / "w" / "hf"),
                "--logs", str(tmp_path / "w" / "runs"), "--only", "nope-s0", "--into", str(kept)])
    assert not list(kept.rglob("*.py")) and (kept / "nope-s0" / "model.safetensors").is_file()
    assert json.loads((kept / "nope-s0" / "kept.json").read_text())["checkpoint"] == "step_0006000"
    (kept / "nope-s0" / "modeling_lenext.py").write_text("raise ImportError('an older checkout')\n")
    out = tmp_path / "out"
    rec = sweep.main(["score", "--grid", "distract_vary", "--models", str(kept), "--logs", str(kept),
                      "--out", str(out), "--docs", "2"]) or json.loads((out / "results.json").read_text())
    assert "raise ImportError" not in (kept / "nope-s0" / "modeling_lenext.py").read_text()  # this checkout's
    assert rec["valid_loss"] == {"nope-s0": [[6000, 0.5]]}
    assert rec["checkpoints"] == {"nope-s0": "step_0006000"} and rec["tasks_protocol_version"] == 2
    assert rec["grid"] == "distract_vary" and set(rec["cells"]["nope-s0"]) == {f[0] for f in FORMATS}
    assert len(list((out / "eval" / "nope-s0" / "step_0006000").glob("*/tasks*.json"))) == len(FORMATS)
    assert "Runs of grid distract_vary at their checkpoints nope-s0 step_0006000; `lenext eval tasks` " \
           "protocol version 2." in (out / "REGIME.md").read_text()


def test_an_unknown_only_run_is_one_error_line_before_any_work(tmp_path):
    # a typo in --only (gpu.sh's RUNS) would train nothing and waste a device call
    with pytest.raises(SystemExit, match=r"^error: --only nope-s9: no such run in grid distract_long"):
        sweep.main(["train", "--shards", str(tmp_path / "s"), "--work", str(tmp_path / "w"), "--out",
                    str(tmp_path / "o"), "--grid", "distract_long", "--only", "nope-s0,nope-s9"])
    assert not (tmp_path / "w").exists()


def test_cpu_sh_skips_kept_runs_and_starts_none_at_its_deadline(tmp_path):
    """cpu.sh (the CPU recipe, one run at a time): a kept run is never trained again, and no run
    starts in the deadline's last 5 minutes (both before any work: no shards, no work folder)."""
    import subprocess
    import time

    script = str(Path(sweep.__file__).parent / "cpu.sh")
    (tmp_path / "kept" / "rope-s1").mkdir(parents=True)
    env = {**os.environ, "KEPT": str(tmp_path / "kept"), "WORK": str(tmp_path / "w")}
    run = subprocess.run(["bash", script, str(int(time.time()) + 60), "distract_vary", "rope-s1", "rope-s2"],
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"[cpu.sh] rope-s1: kept already ({tmp_path}/kept/rope-s1)",
                                       "[cpu.sh] deadline: rope-s2 not started"]
    assert not (tmp_path / "w").exists()
    bad = subprocess.run(["bash", script, "0", "distract_vary"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: name the runs")
