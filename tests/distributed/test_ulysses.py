"""DeepSpeed-Ulysses sequence parallelism (parallel.ulysses_size) on gloo: on 2 ranks, ulysses 2
(data parallel 1) gives the loss curve and gradient norms of ulysses 1 (data parallel 2) at the
same global batch, for every position variant, a window, GQA with fewer KV heads than ranks,
ZeRO 0-3, HeadScale training (equal head scales) and train.per_token_loss; on 4 ranks, ulysses 2 x data parallel 2.
Real loop, real megatron model, real DeepSpeed engine; all runs of one test share one torchrun
launch (tests/distributed/ulysses_worker.py).

On 2 ranks ulysses 2 leaves one data-parallel group, so ZeRO there partitions over the 2 ranks of
the sequence group (DeepSpeed's sequence-data-parallel group); the 4-rank test has both."""
import json
import subprocess
import sys

import pytest

from helpers import LAUNCHER, REPO, env, free_port, losses, write_config

pytestmark = pytest.mark.distributed

CASES = {
    "nope_z1": dict(attention={"position": "nope"}, parallel={"zero_stage": 1}),
    "rope_z0": dict(attention={"position": "rope"}, parallel={"zero_stage": 0}),
    "alibi": dict(attention={"position": "alibi"}),
    "kerple": dict(attention={"position": "kerple_log"}),
    "xpos": dict(attention={"position": "xpos", "xpos": {"blockwise": True}}),
    "window_logscale": dict(attention={"position": "rope", "window": 8, "temperature": {
                                "kind": "log_fit", "a": 0.5, "layers": "all"}},
                            model={"train_length": 16}),
    "gqa1": dict(attention={"position": "rope"}, model={"num_query_groups": 1}),  # KV repeated
    "headscale": dict(attention={"position": "rope", "head_scale": {"enabled": True,
                                                                     "trainable": True}},
                      optim={"lr": 3.0e-2}),
    "documents": dict(attention={"position": "rope"}, data={"document_mask": True}),
    # the step's loss tokens counted over every rank: a group's ranks each count whole sequences
    "per_token": dict(attention={"position": "rope"}, train={"per_token_loss": True}),
    # ZeRO-3: DeepSpeed's reduce-scatter averages over the world; model/ulysses.py backward_factor
    "nope_z3": dict(attention={"position": "nope"}, parallel={"zero_stage": 3}),
}


def _launch(paths, timeout=600, ranks=2):
    cmd = [sys.executable, "-m",
           "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(REPO / "tests/distributed/ulysses_worker.py"),
           *map(str, paths)]
    p = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-6000:]
    return p


@pytest.mark.parametrize("group", [("nope_z1", "rope_z0", "alibi", "kerple", "xpos"),
                                   ("window_logscale", "gqa1", "headscale", "documents", "nope_z3",
                                    "per_token")])
def test_ulysses2_matches_ulysses1(group, sample_shards, tmp_path):
    common = {"train": {"steps": 3, "eval_interval": 0}, "checkpoint": {"interval": 0}}
    paths = []
    for n in (1, 2):  # every ulysses-1 run first: DeepSpeed keeps the last mpu process-wide
        for case in group:
            sec = json.loads(json.dumps(CASES[case]))
            sec.setdefault("parallel", {})["ulysses_size"] = n
            sec.setdefault("train", {}).update(common["train"])
            paths.append(write_config(tmp_path, sample_shards, f"{case}_u{n}",
                                      checkpoint=common["checkpoint"], **sec))
    p = _launch(paths)
    assert "ulysses 2, micro 2 x accum 2 x dp 1" in p.stdout
    for case in group:
        ref, got = losses(tmp_path / f"{case}_u1"), losses(tmp_path / f"{case}_u2")
        assert sorted(ref) == [1, 2, 3] and len(set(ref.values())) > 1, (case, ref)
        assert got == pytest.approx(ref, rel=2e-5, abs=0), (case, ref, got)
        # AdamW hides a gradient scaled by a constant from the loss curve; the norm does not
        gref, ggot = (losses(tmp_path / f"{case}_u{n}", "grad_norm") for n in (1, 2))
        assert sorted(gref) == [1, 2, 3], (case, gref)
        assert ggot == pytest.approx(gref, rel=1e-4, abs=0), (case, gref, ggot)
        if case == "headscale":
            a, b = (json.loads((tmp_path / f"{case}_u{n}" / "head_scales.json").read_text())
                    ["head_scales"] for n in (1, 2))
            a, b = sum(a, []), sum(b, [])  # [layers x heads] flattened
            assert len(set(a)) > 2  # the scales moved, differently per head
            assert b == pytest.approx(a, rel=1e-5), (a, b)


def test_ulysses_times_data_parallel_on_4_ranks(sample_shards, tmp_path):
    """4 ranks on 2 cores (oversubscribed, still exact): ulysses 2 x data parallel 2 against
    ulysses 1 x data parallel 4, global batch 8, under ZeRO-1 (all-reduce, divided by W / N) and
    ZeRO-3 (reduce-scatter over W, corrected by ulysses.backward_factor)."""
    paths = []
    for n in (1, 2):
        for z in (1, 3):
            paths.append(write_config(
                tmp_path, sample_shards, f"z{z}_u{n}", checkpoint={"interval": 0},
                attention={"position": "rope"}, parallel={"ulysses_size": n, "zero_stage": z},
                train={"steps": 3, "eval_interval": 0, "global_batch_size": 8}))
    p = _launch(paths, ranks=4)
    assert "ulysses 2, micro 2 x accum 2 x dp 2" in p.stdout
    for z in (1, 3):
        for key, rel in (("loss", 2e-5), ("grad_norm", 1e-4)):
            ref, got = (losses(tmp_path / f"z{z}_u{n}", key) for n in (1, 2))
            assert sorted(ref) == [1, 2, 3], (z, key, ref)
            assert got == pytest.approx(ref, rel=rel, abs=0), (z, key, ref, got)


def test_kill9_and_resume_under_ulysses_is_bitwise(sample_shards, tmp_path):
    """The machinery of test_resume.py under ulysses 2 (ZeRO-3 over the sequence group: the
    partitioned parameters and optimizer state come back)."""
    import random

    from helpers import kill9, pretrain_cmd, run, start, wait_for

    steps = 6
    sec = dict(train={"steps": steps, "eval_interval": 0},
               parallel={"ulysses_size": 2, "zero_stage": 3},
               attention={"position": "alibi"})  # head-sliced bias rows across the restart
    ref = write_config(tmp_path, sample_shards, "ref", checkpoint={"interval": 0}, **sec)
    run(pretrain_cmd(ref, LAUNCHER, 2, free_port()))
    expected = losses(tmp_path / "ref")
    cfg = write_config(tmp_path, sample_shards, "kill", checkpoint={"interval": 2}, **sec)
    kill_after = random.Random().randint(3, steps - 1)  # past the first checkpoint
    proc = start(pretrain_cmd(cfg, LAUNCHER, 2, free_port()), tmp_path / "kill.log")
    metrics = tmp_path / "kill" / "metrics.jsonl"
    assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= kill_after,
                    timeout=240), (tmp_path / "kill.log").read_text()[-3000:]
    kill9(proc)
    p = run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
    assert "resumed from" in p.stdout and "ulysses 2" in p.stdout
    assert losses(tmp_path / "kill") == expected  # float equality: bitwise identical curve
