"""The training loop and its engine, in this process on one rank (real megatron model, real DeepSpeed
ZeRO-2 engine, real shards): resume == straight, accumulation == a bigger micro batch, the scheduled
lr, the HeadScale clamp on ZeRO's fp32 master, and the checkpoint markers' order in a real save.
(The multi-rank and kill -9 versions: tests/distributed, minutes; these take seconds.)"""
import contextlib
import json
import shutil

import pytest
import torch
import torch.distributed as dist

from helpers import losses, write_config
from lenext_dist.config import load_config
from lenext_dist.model import build_model, destroy_megatron, init_megatron, init_single_process_group
from lenext_dist.train import checkpoint, optim
from lenext_dist.checkpoint.layout import COMPLETE, LATEST, latest_tag, resolve, tag_for
from lenext_dist.checkpoint.weights import read_weights


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A megatron .bin/.idx shard written in-process with megatron's IndexedDatasetBuilder, as
    data_prep does, from the sample corpus encoded by the real SentencePiece model (+ EOS per
    document): seconds less than running data_prep/shard.py on this busy machine."""
    import io
    import json

    import numpy as np
    import sentencepiece as spm
    import zstandard
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from helpers import REPO
    from lenext_dist.prep.tokenizer import token_dtype

    out = tmp_path_factory.mktemp("shards") / "prose"
    tok = str(REPO / "data/sample/tokenizer.model")
    sp = spm.SentencePieceProcessor(model_file=tok)
    src = sorted((REPO / "data/sample/slimpajama").glob("chunk*/*.jsonl.zst"))[0]
    with open(src, "rb") as f:
        lines = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8")
        texts = [json.loads(line)["text"] for _, line in zip(range(12), lines)]
    builder = IndexedDatasetBuilder(str(out) + ".bin", dtype=token_dtype(sp.get_piece_size()))
    for ids in sp.encode(texts):
        builder.add_document(np.array(ids + [sp.eos_id()]), [len(ids) + 1])
    builder.finalize(str(out) + ".idx")
    return {"tokenizer": tok, "blend": [{"prefix": str(out), "weight": 1.0}], "valid_blend": []}


@contextlib.contextmanager
def one_rank():
    """A 1-rank in-memory gloo group (train() keeps one it finds) with the rank variables a launcher
    sets (DeepSpeed asserts LOCAL_RANK), torn down with everything megatron and DeepSpeed cached
    about it, so the next test starts fresh."""
    mp = pytest.MonkeyPatch()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        mp.setenv(k, v)
    from deepspeed.utils import groups

    # an engine of another test module (test_gpu_ready's bf16 engine) may have left DeepSpeed's
    # cached groups of a process group destroyed since: DeepSpeed would broadcast on those
    getattr(groups, "_release_process_group_references", lambda: None)()
    init_single_process_group()
    try:
        yield
    finally:
        mp.undo()
        import deepspeed.comm
        from deepspeed.utils import groups

        destroy_megatron()
        if dist.is_initialized():
            deepspeed.comm.destroy_process_group() if deepspeed.comm.is_initialized() \
                else dist.destroy_process_group()
        # train() destroys the group with torch's call, behind DeepSpeed's back: drop DeepSpeed's
        # cached groups too (what deepspeed.comm.destroy_process_group does after its own)
        getattr(groups, "_release_process_group_references", lambda: None)()


def run_train(cfg):
    from lenext_dist.train.loop import train

    with one_rank():
        return train(cfg)


# Straight run: ZeRO-2, 4 steps of global batch 2 as micro 1 x accumulation 2, learned head scales
# (init 1, clamp m_h >= 1) under an lr high enough to push some of them below 1 without the clamp.
STEPS, WARMUP = 4, 2
COMMON = dict(train={"steps": STEPS, "micro_batch_size": 1, "global_batch_size": 2, "eval_interval": 0},
              optim={"lr": 2e-2, "warmup_steps": WARMUP},
              checkpoint={"interval": 2, "keep_last": 0},
              attention={"head_scale": {"enabled": True, "trainable": True, "init": 1.0,
                                        "min_value": 1.0}})


def config(tmp, shards, name, **over):
    import copy

    from lenext_dist.config.load import deep_merge

    sections = copy.deepcopy(COMMON)
    deep_merge(sections, over)
    return load_config(write_config(tmp, shards, name, **sections))


@pytest.fixture(scope="module")
def straight(shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    cfg = config(tmp, shards, "straight")
    assert run_train(cfg) == {"step": STEPS, "stopped_by_signal": False}
    return tmp / "straight", cfg


def test_scheduled_lr_is_logged_per_step(straight):
    run, cfg = straight
    lr = losses(run, "lr")
    assert lr == {s: pytest.approx(optim.cosine_lr(s - 1, cfg.optim, STEPS)) for s in range(1, STEPS + 1)}
    assert lr[1] == pytest.approx(cfg.optim.lr / WARMUP) and lr[WARMUP] == pytest.approx(cfg.optim.lr)


def test_resume_two_plus_two_equals_four_straight(straight, shards, tmp_path):
    run, _ = straight
    ckpt = tmp_path / "resumed" / "checkpoints"
    ckpt.mkdir(parents=True)  # step 2 of the straight run, as if it had been stopped after it
    shutil.copytree(run / "checkpoints" / tag_for(2), ckpt / tag_for(2))
    (ckpt / LATEST).write_text(tag_for(2) + "\n")
    cfg = config(tmp_path, shards, "resumed")
    assert run_train(cfg)["step"] == STEPS
    a, b = losses(run), losses(tmp_path / "resumed")
    assert sorted(b) == [3, 4]  # only the remaining steps ran
    assert b == {s: pytest.approx(a[s], rel=1e-6, abs=0) for s in (3, 4)}
    assert losses(tmp_path / "resumed", "grad_norm") == {
        s: pytest.approx(v, rel=1e-5) for s, v in losses(run, "grad_norm").items() if s > 2}
    wa = read_weights(run / "checkpoints" / tag_for(STEPS))
    wb = read_weights(ckpt / tag_for(STEPS))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-7, msg=k)


def test_exit_at_trains_in_segments_that_add_up_to_the_straight_run(straight, shards, tmp_path, capsys):
    run, _ = straight
    assert run_train(config(tmp_path, shards, "seg", train={"exit_at": 2})) == {
        "step": 2, "stopped_by_signal": False}
    ckpt = tmp_path / "seg" / "checkpoints"
    assert (ckpt / LATEST).read_text().strip() == tag_for(2) and not (ckpt / tag_for(STEPS)).exists()
    assert losses(tmp_path / "seg", "lr") == {s: pytest.approx(v) for s, v in losses(run, "lr").items()
                                             if s <= 2}  # the schedule is still over train.steps
    assert run_train(config(tmp_path, shards, "seg"))["step"] == STEPS  # exit_at 0: to the end
    assert losses(tmp_path / "seg") == {s: pytest.approx(v, rel=1e-6, abs=0) for s, v in losses(run).items()}
    # a rerun of a segment already done builds nothing and runs no step
    assert run_train(config(tmp_path, shards, "seg", train={"exit_at": 2})) == {
        "step": STEPS, "stopped_by_signal": False}
    assert sorted(losses(tmp_path / "seg")) == list(range(1, STEPS + 1))
    # so does a relaunch of the finished run (a requeue): unless its searched head scales are
    # missing, which the engine is built once more to write
    capsys.readouterr()
    assert run_train(config(tmp_path, shards, "seg"))["step"] == STEPS
    assert "nothing to do" in capsys.readouterr().out
    scales = tmp_path / "seg" / "head_scales.json"
    kept = scales.read_text()
    scales.unlink()
    assert run_train(config(tmp_path, shards, "seg"))["step"] == STEPS
    assert "nothing to do" not in capsys.readouterr().out and scales.read_text() == kept
    assert sorted(losses(tmp_path / "seg")) == list(range(1, STEPS + 1))


def test_a_headscale_search_from_a_checkpoint_cut_at_exit_at_loads(tmp_path):
    """A checkpoint of a run in segments records its exit_at (500 of 7500): the search's config
    (200 steps) must not carry it over (exit_at > steps is refused)."""
    from lenext_dist.config import save_config
    from lenext_dist.extend.search import search_config

    ckpt = tmp_path / "step_0000500"
    ckpt.mkdir()
    save_config(load_config(None, ["train.steps=7500", "train.exit_at=500"]), ckpt / "config.yaml")
    cfg = search_config(ckpt, tmp_path / "hs", target=128, init=1.2, steps=200, lr=0.1, warmup=20,
                        global_batch=8, micro_batch=4, overshoot=1.0, min_value=1.0, zero_stage=2,
                        activation_checkpointing=False)
    assert cfg.train.steps == 200 and cfg.train.exit_at == 0


def test_a_headscale_search_from_a_staged_run_searches_the_stage_its_weights_are_of(tmp_path):
    """A checkpoint of configs/exp/smollm3-stages.yaml inside its last stage: the search is one
    stage of its own with that stage's RoPE base (the whole run's config was refused: its stages
    start past the search's 200 steps, after the export and the sweep had run)."""
    from helpers import REPO
    from lenext_dist.checkpoint.layout import run_config
    from lenext_dist.config import save_config
    from lenext_dist.extend.search import search_config

    run = load_config(REPO / "configs/exp/smollm3-stages.yaml")
    last = run.train.stages[-1]
    ckpt = tmp_path / f"step_{last.start_step + 10:07d}"
    ckpt.mkdir()
    save_config(run, ckpt / "config.yaml")
    cfg = search_config(ckpt, tmp_path / "hs", target=8192, init=1.2, steps=200, lr=0.1, warmup=20,
                        global_batch=8, micro_batch=4, overshoot=1.0, min_value=1.0, zero_stage=2,
                        activation_checkpointing=False)
    assert cfg.train.stages == [] and cfg.train.steps == 200 and cfg.model.seq_length == 8192
    assert cfg.attention.rope.base == run_config(ckpt).attention.rope.base == last.rope_base
    assert cfg.attention.rope.base != run.attention.rope.base


def test_accumulation_2_x_micro_1_equals_accumulation_1_x_micro_2(straight, shards, tmp_path):
    run, _ = straight
    run_train(config(tmp_path, shards, "micro2", train={"micro_batch_size": 2}))
    a_loss, b_loss = losses(run), losses(tmp_path / "micro2")
    a_norm, b_norm = losses(run, "grad_norm"), losses(tmp_path / "micro2", "grad_norm")
    assert b_loss == {s: pytest.approx(v, rel=1e-5) for s, v in a_loss.items()}
    assert b_norm == {s: pytest.approx(v, rel=1e-4) for s, v in a_norm.items()}


def test_loop_clamps_the_learned_scales(straight):
    run, _ = straight
    m = torch.tensor(json.loads((run / "head_scales.json").read_text())["head_scales"])  # [layers, heads]
    assert m.min().item() == 1.0  # some head was pushed down and held at exactly 1
    assert m.max().item() > 1.0  # and some moved up: the scales did train
    w = read_weights(run / "checkpoints" / tag_for(STEPS))  # the fp32 master, saved
    saved = torch.stack([v for k, v in sorted(w.items()) if k.endswith("head_scale")])
    assert saved.min().item() == 1.0


# ---- the engine alone -----------------------------------------------------------------------

def test_a_diverging_run_stops_at_the_bad_step_and_saves_nothing_after_it(shards, tmp_path):
    """lr 1e30: the first update leaves finite (huge) weights, the second step's loss is not
    finite: training stops there, `latest` stays on step 1. lr inf: the first update already
    spoils the weights, which are never saved. (The CLI's exit 2 and message: tests/e2e.)"""
    from lenext_dist.train.loop import Diverged

    over = dict(train={"steps": 4}, checkpoint={"interval": 1})
    cfg = config(tmp_path, shards, "nan", optim={"lr": 1e30, "warmup_steps": 2}, **over)
    with pytest.raises(Diverged, match="at step 2 .*the last good checkpoint is .*step_0000001"):
        run_train(cfg)
    ckpt = tmp_path / "nan" / "checkpoints"
    assert (ckpt / LATEST).read_text().strip() == tag_for(1)
    assert sorted(p.name for p in ckpt.glob("step_*")) == [tag_for(1)]
    assert max(losses(tmp_path / "nan")) == 2  # nothing trained past the bad step
    cfg = config(tmp_path, shards, "inf", optim={"lr": 1e30, "warmup_steps": 2}, **over)
    cfg.optim.lr = float("inf")  # past the config's finite check: a first update that spoils all
    with pytest.raises(Diverged, match="at step 1 .*the last good checkpoint is none"):
        run_train(cfg)
    assert not (tmp_path / "inf" / "checkpoints" / LATEST).exists()


def new_engine(cfg):
    """cfg's DeepSpeed engine on one rank (inside one_rank), as the loop builds it."""
    from lenext_dist.train.loop import skip_deepspeed_shm_op

    skip_deepspeed_shm_op()  # a minute of g++ otherwise (train/group.py)
    init_megatron(cfg.train.seed)
    model = build_model(cfg)
    optim.freeze_for_mode(model, cfg)
    return optim.build_engine(model, cfg, 1)


@pytest.fixture
def engine(shards, tmp_path):
    """A ZeRO-2 fp32 engine of a HeadScale run (all but the head scales frozen), and its config."""
    cfg = config(tmp_path, shards, "hs", train={"mode": "headscale"},
                 checkpoint={"init_from": "unused-here"})
    with one_rank():
        yield new_engine(cfg), cfg


def step(engine, cfg, lr):
    from lenext_dist.train.loop import _micro_loss

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length + 1), generator=gen)
    s = cfg.model.seq_length
    batch = {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": torch.ones(2, s),
             "position_ids": torch.arange(s).expand(2, s)}
    optim.set_lr(engine.optimizer, lr)
    for _ in range(engine.gradient_accumulation_steps()):
        engine.backward(_micro_loss(engine, batch, "cpu"))
        engine.step()


def test_headscale_step_under_zero2_changes_only_scales_and_the_clamp_reaches_the_master(engine):
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    eng, cfg = engine
    assert cfg.parallel.zero_stage == 2
    scales = [(n, p) for n, p in eng.module.named_parameters() if optim.is_head_scale(n)]
    before = {n: p.detach().clone() for n, p in eng.module.named_parameters()}
    step(eng, cfg, lr=0.5)
    for n, p in eng.module.named_parameters():
        assert torch.equal(p, before[n]) != optim.is_head_scale(n), n
    # some head went below 1 in ZeRO's fp32 master (and the module copy made from it)
    masters = torch.stack([safe_get_full_fp32_param(p) for _, p in scales])
    assert masters.min().item() < 1.0
    optim.clamp_head_scales(eng.module, 1.0)
    for _, p in scales:
        assert safe_get_full_fp32_param(p).min().item() >= 1.0  # the master itself
        assert p.data.min().item() >= 1.0  # the copy the next forward reads
    # a step at lr 0 copies the master into the module again: the clamp must have been on it
    name, p = scales[0]
    safe_set_full_fp32_param(p, torch.full_like(p.data, 0.5))
    optim.clamp_head_scales(eng.module, 1.0)
    step(eng, cfg, lr=0.0)
    assert torch.equal(p.data, torch.ones_like(p.data)), name


def test_checkpoint_markers_in_a_real_save(engine, monkeypatch):
    """`latest` is moved only after every shard and COMPLETE are on disk: a kill at that moment
    leaves the new step complete and `latest` on the previous one."""
    eng, cfg = engine
    root = checkpoint.Path(cfg.checkpoint.dir)
    checkpoint.save(eng, cfg, 2, 4)
    assert latest_tag(root) == tag_for(2)
    real_write, order = checkpoint._atomic_write, []

    def killed_at_latest(path, text):
        order.append(path.name)
        if path.name == LATEST:
            new = root / tag_for(4)
            assert (new / COMPLETE).is_file() and (new / "config.yaml").is_file()
            assert any(new.glob("*model_states.pt")) and any(new.glob("*optim_states.pt"))
            raise KeyboardInterrupt  # the kill
        real_write(path, text)

    monkeypatch.setattr(checkpoint, "_atomic_write", killed_at_latest)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(eng, cfg, 4, 8)
    assert order == [COMPLETE, LATEST]
    assert latest_tag(root) == tag_for(2)
    assert resolve(root / tag_for(4)) == root / tag_for(4)  # complete, resumable by name


def test_load_restores_the_saved_rng_state(engine):
    """The client state carries every RNG (python, numpy, torch): after a load, random draws continue
    as they would have after the save (dropout or any sampling would otherwise diverge on resume)."""
    import random

    import numpy as np

    eng, cfg = engine
    checkpoint.save(eng, cfg, 2, 4)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(7)  # the run goes on drawing
    client = checkpoint.load(eng, cfg.checkpoint.dir, tag_for(2))
    assert (client["step"], client["consumed_samples"]) == (2, 4)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_an_accelerator_run_saves_and_restores_its_generators(engine, monkeypatch):
    """Where the run has an accelerator (taken here as one: DeepSpeed's CPU accelerator, whose
    interface CUDA's shares, stands in), the client state also keeps its generator and megatron's
    tracker states, and a load hands them back to the accelerator (the CPU one's generator is
    torch's, so the call itself is what is observed)."""
    from deepspeed.accelerator import get_accelerator

    eng, cfg = engine
    acc, restored = get_accelerator(), []
    monkeypatch.setattr(checkpoint, "on_cpu", lambda: False)
    checkpoint.save(eng, cfg, 2, 4)
    saved = acc.get_rng_state().clone()
    torch.rand(5)  # the run draws on
    monkeypatch.setattr(acc, "set_rng_state", lambda s, *a, _set=acc.set_rng_state: (restored.append(s), _set(s)))
    client = checkpoint.load(eng, cfg.checkpoint.dir, tag_for(2))
    assert {"accelerator", "tracker"} <= set(client["rng"])
    assert len(restored) == 1 and torch.equal(restored[0], saved)


def settings(opt) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


@pytest.mark.parametrize("stage, precision", [(0, "fp32"), (1, "bf16"), (2, "fp32")])
def test_a_resume_trains_with_this_runs_optimizer_settings(shards, tmp_path, stage, precision):
    """torch's Optimizer.load_state_dict, inside DeepSpeed's load at every stage, put the
    checkpoint's betas, eps, weight decay and kernel back into the param groups, and ZeRO-1/2 and
    the bf16 optimizer its gradient clipping: `--optim.weight_decay=0` on resume trained on with
    0.1 (and a resume at another rank count with 0). The moments still come from the checkpoint."""
    par = dict(parallel={"zero_stage": stage}, train={"precision": precision})
    old = config(tmp_path, shards, "old", **par)
    new = config(tmp_path, shards, "new", optim={"weight_decay": 0.0, "beta2": 0.9, "eps": 1e-6,
                                                 "grad_clip": 0.5, "fused": False}, **par)
    new.checkpoint.dir = old.checkpoint.dir
    with one_rank():
        eng = new_engine(old)
        step(eng, old, lr=1e-2)
        checkpoint.save(eng, old, 2, 4)
        fresh = new_engine(new)
        want = settings(fresh.optimizer)
        assert want != settings(eng.optimizer)
        checkpoint.load(fresh, new.checkpoint.dir, tag_for(2))
        assert settings(fresh.optimizer) == want
        assert [g["weight_decay"] for g in want] == [0.0, 0.0] and want[0]["betas"] == (0.9, 0.9)
        assert getattr(fresh.optimizer, "clip_grad", 0.5) == 0.5  # ZeRO-0: the engine's, from the config
        base = getattr(fresh.optimizer, "optimizer", fresh.optimizer)
        assert base.state and {float(st["step"]) for st in base.state.values()} == {1.0}
        for e in (eng, fresh):
            optim.release_engine(e)


def cut_as_saved_by(sd: dict, dp: int) -> list[dict]:
    """A 1-rank BF16_Optimizer's optimizer state as `dp` ranks save it: each group's vector zero-
    padded to a multiple of 2 x dp (bf16_optimizer.py, nccl_start_alignment_factor x DP) and cut
    into dp pieces, every piece saved with its padding; the last rank records the padding."""
    from deepspeed.checkpoint.constants import BASE_OPTIMIZER_STATE as BASE
    from deepspeed.checkpoint.constants import GROUP_PADDINGS as PADS
    from deepspeed.checkpoint.constants import SINGLE_PARTITION_OF_FP32_GROUPS as MASTERS

    ranks = [{**sd, MASTERS: [], PADS: [], BASE: {**sd[BASE], "state": {}}} for _ in range(dp)]
    for i, (masters, pad) in enumerate(zip(sd[MASTERS], sd[PADS])):
        n = masters.numel() - pad
        size = -(-n // (2 * dp)) * 2 * dp
        assert size - n < size // dp  # only the last rank holds padding, as in a real model's groups

        def pieces(t):
            padded = torch.zeros(size, dtype=t.dtype)
            padded[:n] = t.reshape(-1)[:n]
            return [c.clone() for c in padded.chunk(dp)]

        for r, piece in enumerate(pieces(masters)):
            ranks[r][MASTERS].append(piece)
            ranks[r][PADS].append(size - n if r == dp - 1 else 0)
        for key, v in sd[BASE]["state"][i].items():
            cut = pieces(v) if v.dim() else [v] * dp
            for r in range(dp):
                ranks[r][BASE]["state"].setdefault(i, {})[key] = cut[r]
    return ranks


def test_a_bf16_zero1_checkpoint_reshards_to_another_rank_count(shards, tmp_path):
    """ZeRO-1 with bf16 (fp32 accumulation, our bf16 config) runs DeepSpeed's BF16_Optimizer, not
    the ZeRO-1/2 one: its partitions are `fp32_groups_flat_partition`, saved with their padding. A
    resume at another rank count failed with an AttributeError on every rank. Its 1-rank checkpoint,
    cut as 3 ranks save it (padding to 2 x 3), reshards back to 1 rank: the same masters and moments."""
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

    from lenext_dist.train.reshard import check_dp_size, optim_files

    cfg = config(tmp_path, shards, "z1", parallel={"zero_stage": 1}, train={"precision": "bf16"})
    step_dir = checkpoint.Path(cfg.checkpoint.dir) / tag_for(2)
    with one_rank():
        eng = new_engine(cfg)
        assert type(eng.optimizer).__name__ == "BF16_Optimizer"
        step(eng, cfg, lr=1e-2)
        checkpoint.save(eng, cfg, 2, 4)
        parts = eng.optimizer.fp32_groups_flat_partition
        want = [(p.clone(), {k: v.clone() for k, v in eng.optimizer.optimizer.state[p].items()}) for p in parts]
        [f] = optim_files(step_dir)
        whole = torch.load(f, weights_only=False)
        sd = whole[OPTIMIZER_STATE_DICT]
        # the padding of 3 ranks is not 1 rank's: saved pieces joined with it would not fit
        assert any(-(-(p.numel() - pad) // 6) * 6 > p.numel() for p, pad in zip(parts, sd["group_paddings"]))
        for r, saved in enumerate(cut_as_saved_by(sd, 3)):
            # bf16_zero_pp_rank_<r>_mp_rank_00_optim_states.pt: the bf16 optimizer's names
            name = f.name.replace("pp_rank_0_", f"pp_rank_{r}_")
            torch.save({**whole, OPTIMIZER_STATE_DICT: saved}, f.with_name(name))
        assert check_dp_size(step_dir, 1, 1)
        fresh = new_engine(cfg)
        checkpoint.load(fresh, cfg.checkpoint.dir, tag_for(2), reshard=True)
        for p, (master, state) in zip(fresh.optimizer.fp32_groups_flat_partition, want):
            assert torch.equal(p, master)
            got = fresh.optimizer.optimizer.state[p]
            assert got.keys() == state.keys() and all(torch.equal(got[k], v) for k, v in state.items())
        for e in (eng, fresh):
            optim.release_engine(e)


def test_a_resumed_headscale_search_keeps_the_frozen_kerple_values_exact(shards, tmp_path, capsys):
    """KERPLE's r1/r2 are fp32 parameters a bf16 forward reads exactly (train/fp32_params.py).
    Frozen in a HeadScale search, they came back bf16-rounded on resume: no optimizer master, a bf16
    module file, and init_from (their exact source) skipped. The resumed steps' losses then left
    those of the uninterrupted search."""
    kerple = {"position": "kerple_log"}
    run_train(config(tmp_path, shards, "src", attention=kerple, train={"steps": 2}))  # trained r1/r2
    search = dict(attention=kerple, checkpoint={"init_from": str(tmp_path / "src" / "checkpoints")})
    run_train(config(tmp_path, shards, "straight", train={"mode": "headscale", "precision": "bf16"}, **search))
    seg = dict(train={"mode": "headscale", "precision": "bf16", "exit_at": 2}, **search)
    run_train(config(tmp_path, shards, "seg", **seg))
    capsys.readouterr()
    seg["train"]["exit_at"] = 0
    # (the scales' group has no decay: a changed weight_decay only shows in the line below)
    assert run_train(config(tmp_path, shards, "seg", optim={"weight_decay": 0.0}, **seg))["step"] == STEPS
    assert "optimizer settings changed since the checkpoint (this run's apply): optim.weight_decay: 0.1 -> 0.0" \
        in capsys.readouterr().out
    a = losses(tmp_path / "straight")
    assert losses(tmp_path / "seg") == {s: pytest.approx(v, rel=1e-6, abs=0) for s, v in a.items()}
    # what export reads: the exact values, not the module file's bf16 ones
    src, got = (read_weights(tmp_path / r / "checkpoints") for r in ("src", "seg"))
    kerple = [k for k in src if ".position." in k]
    assert kerple and all(torch.equal(got[k], src[k]) for k in kerple), kerple


def test_no_stage_engine_outlives_its_stage(shards, tmp_path):
    """A two-stage run (32 -> 64 tokens at step 2) leaves no DeepSpeed engine behind: the
    optimizer's gradient hooks kept each engine, with its weights, fp32 master and Adam states,
    alive after `del` and gc, so on a GPU stage 2 trained beside stage 1's states."""
    import gc

    from deepspeed import DeepSpeedEngine

    gc.collect()
    before = sum(isinstance(o, DeepSpeedEngine) for o in gc.get_objects())
    cfg = config(tmp_path, shards, "staged", train={"stages": [{"start_step": 2, "seq_length": 64}]},
                 attention={"head_scale": {"enabled": False, "trainable": False}})
    assert run_train(cfg) == {"step": STEPS, "stopped_by_signal": False}
    gc.collect()
    assert sum(isinstance(o, DeepSpeedEngine) for o in gc.get_objects()) == before


def test_a_staged_run_without_resume_goes_on_from_its_boundary(shards, tmp_path):
    """checkpoint.resume false (a fresh run_dir) declines an earlier run's checkpoint, not the one
    its own stage boundary saves: stage 1 continues from step 2 (weights, LR schedule, data
    position, metrics), where it once started over from step 0 with fresh weights."""
    cfg = config(tmp_path, shards, "staged", train={"stages": [{"start_step": 2, "seq_length": 64}]},
                 checkpoint={"resume": False},
                 attention={"head_scale": {"enabled": False, "trainable": False}})
    assert run_train(cfg) == {"step": STEPS, "stopped_by_signal": False}
    run = tmp_path / "staged"
    assert sorted(losses(run)) == list(range(1, STEPS + 1))  # each step once, none started over
    assert losses(run, "stage") == {1: 0, 2: 0, 3: 1, 4: 1}
    assert losses(run, "lr") == {s: pytest.approx(optim.cosine_lr(s - 1, cfg.optim, STEPS))
                                 for s in range(1, STEPS + 1)}
    assert not list(run.glob("metrics.dropped*"))


@pytest.fixture(scope="module")
def answer_shards(tmp_path_factory):
    """Passkey and copy documents (shard.py --format tasks) read under data.task_loss=answers: a
    32-token window holds anything from no answer token to a whole copied span."""
    from prep_helpers import SLIMPAJAMA, TOKENIZER, shard
    from lenext_dist.prep.task_source import task_spec

    out = tmp_path_factory.mktemp("answers")
    shard(sorted(SLIMPAJAMA)[:1], out, "tasks", fmt="tasks",
          tasks=task_spec("passkey,copy", ["length=64:72"], seed=0, passes=1))
    blend = [{"prefix": str(out / "tasks_train"), "weight": 1.0}]
    return {"tokenizer": TOKENIZER, "blend": blend, "valid_blend": blend}


def test_per_token_loss_is_the_global_batch_token_mean_under_accumulation(answer_shards, tmp_path):
    """train.per_token_loss: micro 1 x accumulation 4 trains as one micro-batch of 4 does (whose
    mean is over every answer token of the batch): losses, grad norms and validation; without it
    (megatron's mean of micro-batch means) it does not, on these windows of unequal answer counts."""
    def run(name, micro, per_token):
        cfg = config(tmp_path, answer_shards, name, data={"task_loss": "answers"},
                     train={"micro_batch_size": micro, "global_batch_size": 4, "eval_interval": 2,
                            "per_token_loss": per_token},
                     attention={"head_scale": {"enabled": False, "trainable": False}})
        run_train(cfg)
        return {k: losses(tmp_path / name, k) for k in ("loss", "grad_norm", "valid_loss")}

    whole = run("whole", 4, False)
    tokens = run("tokens", 1, True)
    means = run("means", 1, False)
    assert sorted(whole["valid_loss"]) == [2, 4]
    for k, tol in (("loss", 1e-5), ("grad_norm", 1e-4), ("valid_loss", 1e-5)):
        assert tokens[k] == {s: pytest.approx(v, rel=tol) for s, v in whole[k].items()}, k
    assert means["loss"][1] != pytest.approx(whole["loss"][1], rel=1e-3)
