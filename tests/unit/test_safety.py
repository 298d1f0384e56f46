"""Hostile and careless input, fast tier (issue 15): YAML alias bombs and bad includes, the one
error wrapper of every command (exit 2, one line, --debug for the traceback), eval flags, a
truncated result JSON and shards, a malicious pickle given as head scales, one-process runs
without MPI."""
import contextlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from helpers import tiny_shard
from lenext_dist.config import ConfigError, load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _limited(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `code` in a child with 1.5 GB of address space: an expanding alias bomb dies there
    (MemoryError / timeout) instead of filling the shared machine."""
    prelude = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))\n"
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": REPO})


# 10 levels of 9 references: 9**9 (387 million) leaves once expanded, in under 1 kB of YAML
BOMB = "a: &a {k0: 1, k1: 1, k2: 1, k3: 1, k4: 1, k5: 1, k6: 1, k7: 1, k8: 1}\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} {{" + ", ".join(f"k{j}: *{chr(97 + i)}" for j in range(9)) + "}\n"
    for i in range(8))


def test_yaml_alias_bomb_is_refused_before_any_walk(tmp_path):
    assert len(BOMB) < 1000
    (tmp_path / "bomb.yaml").write_text(BOMB)
    code = textwrap.dedent(f"""
        import time
        from lenext_dist.config import ConfigError, load_config
        t = time.time()
        try:
            load_config({str(tmp_path / 'bomb.yaml')!r})
        except ConfigError as e:
            print("REFUSED", round(time.time() - t, 2), e)
    """)
    try:
        p = _limited(code, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb was expanded (still running after 30 s)")
    assert "REFUSED" in p.stdout, p.stderr[-2000:]
    assert "alias" in p.stdout and "bomb.yaml" in p.stdout
    assert float(p.stdout.split()[1]) < 5


def test_alias_bomb_in_an_override_and_a_huge_file_are_refused(tmp_path):
    flow = "{" + BOMB.replace("\n", ", ").rstrip(", ") + "}"
    with pytest.raises(ConfigError, match="override train: .*alias"):
        load_config(None, [f"train={flow}"])
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="big.yaml: .*bytes, over"):
        load_config(big)
    # a few ordinary anchors still work
    ok = tmp_path / "ok.yaml"
    ok.write_text("optim: &o {lr: 0.01}\n")
    assert load_config(ok).optim.lr == 0.01


@pytest.mark.parametrize("value", ["5", "[3]", "{a: b}"])
def test_include_of_a_non_file_name_is_a_config_error(tmp_path, value):
    p = tmp_path / "inc.yaml"
    p.write_text(f"include: {value}\n")
    with pytest.raises(ConfigError, match="inc.yaml: include: expected a file name"):
        load_config(p)


def _cmd(*args, env=None):
    e = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", **(env or {})}
    e.pop("LENEXT_DEBUG", None) if not env or "LENEXT_DEBUG" not in env else None
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=e)


def test_user_errors_are_one_line_exit_2_and_debug_shows_the_traceback(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    p = _cmd("launch/pretrain.py", "--config", missing, "--dry-run")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == f"error: {missing}: config file not found"
    p = _cmd("launch/pretrain.py", "--config", missing, "--dry-run", "--debug")
    assert p.returncode != 0 and "Traceback" in p.stderr and "ConfigError" in p.stderr
    p = _cmd("launch/pretrain.py", "--config", missing, "--dry-run", env={"LENEXT_DEBUG": "1"})
    assert "Traceback" in p.stderr
    # convert and lenext: a missing checkpoint / model folder
    p = _cmd("-m", "lenext_dist.convert", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "Traceback" not in p.stderr and str(tmp_path) in p.stderr
    p = _cmd("-m", "lenext_dist", "eval", "ppl", "--model", str(tmp_path), "--data", missing,
             "--lengths", "64")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "no config.json" in p.stderr


# every numeric eval flag of finding 6 (and their kin): exit 2 naming the flag, before any work
BAD_FLAGS = [
    ("passkey", ["--depths", "0"], "--depths"), ("passkey", ["--depths", "0.5,1.5"], "--depths"),
    ("passkey", ["--keys", "0"], "--keys"), ("passkey", ["--batch-size", "-1"], "--batch-size"),
    ("passkey", ["--batch-size", "0"], "--batch-size"),
    ("passkey", ["--max-new-tokens", "0"], "--max-new-tokens"),
    ("ppl", ["--budget-tokens", "0"], "--budget-tokens"), ("ppl", ["--max-docs", "0"], "--max-docs"),
    ("ppl", ["--stride", "0"], "--stride"), ("entropy", ["--samples", "0"], "--samples"),
    ("scale-sweep", ["--c-step", "0"], "--c-step"), ("scale-sweep", ["--c-step", "-0.1"], "--c-step"),
    ("scale-sweep", ["--samples", "0"], "--samples"), ("ppl", ["--scale-c", "nan"], "--scale-c"),
    ("passkey", ["--lengths", "0"], "--lengths"), ("ppl", ["--lengths", "64,0"], "--lengths"),
]


@pytest.mark.parametrize("cmd,flag,name", BAD_FLAGS, ids=[f"{c}{' '.join(f)}" for c, f, _ in BAD_FLAGS])
def test_bad_eval_flags_exit_2_naming_the_flag(tmp_path, capsys, cmd, flag, name):
    from lenext_dist.cli import main

    need = {"ppl": ["--data", "x", "--lengths", "64"], "passkey": ["--lengths", "256"],
            "entropy": ["--data", "x", "--length", "64"], "scale-sweep": ["--data", "x", "--length", "64"]}
    base = [a for a in need[cmd] if a not in flag] if "--lengths" in flag else need[cmd]
    with pytest.raises(SystemExit) as e:
        main(["eval", cmd, "--model", str(tmp_path), *base, *flag])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {name}" in err and "Traceback" not in err


def test_c_min_above_c_max_names_both_flags(tmp_path, capsys):
    from lenext_dist.cli import main

    assert main(["eval", "scale-sweep", "--model", str(tmp_path), "--data", "x", "--length", "64",
                 "--c-min", "3", "--c-max", "2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --c-min 3 > --c-max 2: swap them"


def test_report_refuses_a_truncated_result_json(tmp_path, capsys):
    from lenext_dist.cli import main

    run = tmp_path / "run"
    run.mkdir()
    full = json.dumps({"kind": "passkey", "lengths": [256], "accuracy_by_length": [1.0]})
    (run / "passkey.json").write_text(full[: len(full) // 2])
    assert main(["report", "--runs", str(run), "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert "passkey.json: not valid JSON" in err and "truncated" in err
    assert not (tmp_path / "r.md").exists()


class Evil:
    """Unpickling this runs `touch <marker>`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_head_scales_pt_is_refused_and_runs_nothing(tmp_path):
    from lenext_dist.convert.export import head_scales_from
    from lenext_dist.errors import CheckpointError

    marker = tmp_path / "PWNED"
    f = tmp_path / "scales.pt"
    torch.save({"head_scales": torch.ones(2, 4), "x": Evil(marker)}, f)
    with pytest.raises(CheckpointError, match=r"scales.pt: refused to load: .*posix.system"):
        head_scales_from(f, 2, 4)
    assert not marker.exists()
    f.write_bytes(f.read_bytes()[:100])  # truncated: named, no traceback from torch
    with pytest.raises(CheckpointError, match="scales.pt: cannot be read .* truncated"):
        head_scales_from(f, 2, 4)


def test_one_process_env_only_without_a_launcher_or_mpi():
    from lenext_dist.train.loop import one_process_env

    env = {}
    assert one_process_env(env)
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and int(env["MASTER_PORT"]) > 0
    for launched in ({"RANK": "1"}, {"OMPI_COMM_WORLD_SIZE": "2"}, {"PMI_SIZE": "2"},
                     {"SLURM_STEP_NUM_TASKS": "2"}, {"SLURM_STEP_NUM_TASKS": "1", "PMIX_RANK": "0"}):
        env = dict(launched)
        assert not one_process_env(env) and env == launched
    # a one-task srun step (srun --pty bash, salloc) is a shell: one process, no MPI discovery
    env = {"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}
    assert one_process_env(env) and env["WORLD_SIZE"] == "1"


def test_ranks_started_by_mpi_without_mpi4py_are_a_one_line_error(monkeypatch):
    import sys

    from lenext_dist.config import ConfigError
    from lenext_dist.train.group import _discover_rendezvous

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # not installed: its import fails
    monkeypatch.setenv("PMIX_RANK", "0")
    with pytest.raises(ConfigError, match="PMIX_RANK set.* pip install mpi4py"):
        _discover_rendezvous(29500)


def test_a_busy_rendezvous_port_is_a_one_line_error():
    """In a process of its own (this one may hold a group already): rank 0's store on a port
    another process listens on is a ConfigError naming the port, not a DistNetworkError."""
    import socket
    import subprocess
    import sys

    from helpers import env

    code = ("from lenext_dist.config import ConfigError, load_config\n"
            "from lenext_dist.train.group import init_distributed\n"
            "try:\n    init_distributed(load_config(None, []))\n"
            "except ConfigError as e:\n    print('ConfigError:', e)\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        e = {**env(), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port)}
        p = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert f"ConfigError: MASTER_PORT {port}: in use on this host" in p.stdout, p.stdout + p.stderr[-2000:]


def test_a_truncated_shard_is_named_before_megatron_reads_it(tmp_path):

    from lenext_dist.config import BlendItem
    from lenext_dist.data.gpt_data import check_prefixes

    prefix = tiny_shard(str(tmp_path / "s_train"), [torch.arange(n) for n in (50, 70, 30)])
    items = [BlendItem(prefix=prefix)]
    check_prefixes(items, "data.blend")  # whole: fine
    whole = {ext: open(prefix + ext, "rb").read() for ext in (".bin", ".idx")}
    for ext in (".bin", ".idx"):
        with open(prefix + ext, "wb") as f:
            f.write(whole[ext][: len(whole[ext]) - 9])
        with pytest.raises(ConfigError, match=rf"data.blend: {prefix}{ext}: .*truncated"):
            check_prefixes(items, "data.blend")
        with open(prefix + ext, "wb") as f:
            f.write(whole[ext])


def test_a_pickle_planted_in_the_data_cache_is_refused_and_never_run(tmp_path, gloo_1rank):
    """megatron loads its cached sample indices with numpy.load(allow_pickle=True): a resumed run
    folder whose <run_dir>/data_cache/*.npy is a pickle (or holds Python objects) is refused with
    one line naming the file, and nothing in it runs."""
    import pickle

    from megatron.core.datasets import gpt_dataset

    from lenext_dist.config import BlendItem
    from lenext_dist.data.gpt_data import build_datasets
    from lenext_dist.data.sample_cache import no_pickle

    prefix = tiny_shard(str(tmp_path / "s_train"))
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", "train.steps=4", "train.eval_interval=0"])
    cfg.data.blend = [BlendItem(prefix=prefix)]
    build_datasets(cfg, 1)  # the first start: megatron caches its sample indices in the run folder
    cache = tmp_path / "run" / "data_cache"
    npys = sorted(cache.glob("*.npy"))
    assert len(npys) == 3
    marker = tmp_path / "PWNED"
    for f in npys:
        good = f.read_bytes()
        f.write_bytes(pickle.dumps(Evil(marker)))
        with pytest.raises(ConfigError, match=rf"^data.cache_dir: {f}: not a plain numpy array .*refused"):
            build_datasets(cfg, 1)  # the resume
        f.write_bytes(good)
    good = npys[0].read_bytes()
    with open(npys[0], "wb") as f:  # numpy's own format, holding Python objects
        np.save(f, np.array([Evil(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(ConfigError, match=f"{npys[0].name}: not a plain numpy array"):
        build_datasets(cfg, 1)
    npys[0].write_bytes(good[:-40])  # a good header over truncated data: damaged, one line
    with pytest.raises(ConfigError, match=rf"^data.cache_dir: {npys[0]}: damaged .*delete it"):
        build_datasets(cfg, 1)
    os.remove(npys[0])
    os.mkfifo(npys[0])  # a FIFO would block a reader forever: refused before anything opens it
    with pytest.raises(ConfigError, match=f"{npys[0]}: not a regular file"):
        build_datasets(cfg, 1)
    os.remove(npys[0])
    npys[0].write_bytes(good)
    # megatron's own loads refuse a pickle too (one planted after the check, or a new code path)
    late = tmp_path / "late.npy"
    late.write_bytes(pickle.dumps(Evil(marker)))
    with no_pickle(str(tmp_path / "none")):
        with pytest.raises(ConfigError, match=f"{late}: not a plain numpy array"):
            gpt_dataset.numpy.load(str(late), allow_pickle=True, mmap_mode="r")
        assert gpt_dataset.numpy.int64 is np.int64
        fifo = tmp_path / "fifo.npy"
        os.mkfifo(fifo)  # refused before it is opened (opening a FIFO blocks)
        with pytest.raises(ConfigError, match=f"{fifo}: not a regular file"):
            gpt_dataset.numpy.load(str(fifo), allow_pickle=True, mmap_mode="r")
    assert gpt_dataset.numpy is np and not marker.exists()
    build_datasets(cfg, 1)  # the cache, as megatron wrote it, loads


@pytest.mark.parametrize("new_dp", [1, 2, 4, 5])
def test_reshard_cuts_the_saved_partitions_again_for_another_dp_size(new_dp):
    """ZeRO-1/2 at DP 3 -> `new_dp`: a group of 10 values is padded to 12 and saved as 3 pieces of
    4 (the last holds 2 values + 2 padding, GROUP_PADDINGS [0, 0, 2]); the pieces, unpadded and
    joined, are the group again, and cut for new_dp ranks they tile it in order, zero-padded."""
    from lenext_dist.errors import CheckpointError
    from lenext_dist.train.reshard import partition, unpadded

    full = torch.arange(1, 11, dtype=torch.float32)  # no zeros: padding shows
    saved = torch.cat([full, torch.zeros(2)]).view(3, 4)  # exp_avg of ranks 0..2, padded
    paddings = [0, 0, 2]
    joined = torch.cat([unpadded(saved[r], paddings[r]) for r in range(3)])
    assert torch.equal(joined, full)
    n = -(-10 // new_dp)
    part = torch.empty(n, dtype=torch.float64)
    pieces = [partition(joined, part, r, new_dp, "ckpt") for r in range(new_dp)]
    assert all(p.shape == (n,) and p.dtype == torch.float64 for p in pieces)
    got = torch.cat(pieces)
    assert torch.equal(got[:10], full.double()) and not got[10:].any()
    with pytest.raises(CheckpointError, match="ckpt: a param group has 10 values"):
        partition(joined, torch.empty(n - 1), 0, new_dp, "ckpt")
    # exactly full (10 = 2 x 5) is fine
    assert torch.equal(partition(joined, torch.empty(5), 1, 2, "ckpt"), full[5:])


def test_every_torch_load_inside_weights_only_loads_is_weights_only(tmp_path):
    """DeepSpeed's own torch.load(..., weights_only=False) calls are forced weights_only too, while
    the allow-list still loads what our checkpoints hold (numpy RNG state, DeepSpeed's enums)."""
    from lenext_dist.errors import CheckpointError
    from lenext_dist.checkpoint import safe_load

    marker = tmp_path / "PWNED"
    f = tmp_path / "optim_states.pt"
    torch.save({"x": Evil(marker)}, f)
    with pytest.raises(CheckpointError, match=r"step_9: refused to load"):
        with safe_load.weights_only_loads(tmp_path / "step_9"):
            torch.load(f, weights_only=False)  # as DeepSpeed calls it
    assert not marker.exists()
    # what DeepSpeed's optimizer files hold besides tensors (numpy's types are also allowed by
    # megatron.core's import, process-wide: DeepSpeed's are ours alone)
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    good = tmp_path / "client.pt"
    rng = np.random.get_state()
    torch.save({"rng": rng, "a": np.arange(3, dtype=np.uint32), "t": torch.ones(2),
                "zero_stage": ZeroStageEnum(2), "scaler": DynamicLossScaler(8, 1000, 1, 1, False)}, good)
    got = safe_load.load(good)
    assert got["rng"][0] == rng[0] and np.array_equal(got["rng"][1], rng[1])
    assert got["a"].dtype == np.uint32 and torch.equal(got["t"], torch.ones(2))
    assert got["zero_stage"] == ZeroStageEnum(2) and got["scaler"].cur_scale == 8


def test_weights_only_loads_work_with_the_users_force_no_weights_only_switch(tmp_path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (a DeepSpeed workaround) beside ours made torch.load
    raise RuntimeError: a good file was called truncated. Unset inside, restored after."""
    from lenext_dist.checkpoint import safe_load
    from lenext_dist.errors import CheckpointError

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    good = tmp_path / "good.pt"
    torch.save({"t": torch.ones(2)}, good)
    assert torch.equal(safe_load.load(good)["t"], torch.ones(2))
    marker = tmp_path / "PWNED"
    torch.save({"x": Evil(marker)}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="refused to load"):
        safe_load.load(tmp_path / "evil.pt")
    assert not marker.exists()
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ


def test_convert_out_guard_refuses_what_is_not_a_previous_export(tmp_path):
    """--out: empty or absent is fine; non-empty needs --overwrite, which replaces only files a
    previous export listed in its marker; a folder holding the checkpoint being read is refused."""
    from lenext_dist.convert.outdir import MARKER, OutputError, check_out

    out = tmp_path / "hf"
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    assert check_out(out, False, [ckpt]) == []
    out.mkdir()
    assert check_out(out, False, [ckpt]) == []
    (out / "config.json").write_text("{}")
    (out / MARKER).write_text(json.dumps({"files": ["config.json"]}))
    with pytest.raises(OutputError, match="exists and is not empty .*--overwrite"):
        check_out(out, False, [ckpt])
    assert sorted(p.name for p in check_out(out, True, [ckpt])) == sorted(["config.json", MARKER])
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"not from an export \(notes.txt\)"):
        check_out(out, True, [ckpt])
    with pytest.raises(OutputError, match="contains .*checkpoints, which this export reads"):
        check_out(tmp_path / "run", True, [ckpt])


@pytest.mark.parametrize("fails, says", [
    ("", None), ("aside", "hf is unchanged, nothing was written"),
    ("in", "the previous export is back in .*hf, the new one left in .*.hf.partial$"),
    ("in+back", "the new export is in .*.hf.partial, the previous one in .*.hf.old; move one"),
    ("delete", None)])
def test_overwrite_keeps_an_export_whichever_step_of_the_swap_fails(tmp_path, monkeypatch, capsys,
                                                                    fails, says):
    """--overwrite deleted the previous export, then renamed the new one in, in one try: an rmtree
    failing halfway (EBUSY on NFS) deleted the finished new export too and said nothing was
    written, and a kill between the two left only .partial, which the next run deletes. Now the
    previous export is renamed aside and deleted last; a failed rename puts it back."""
    import errno
    import shutil
    from pathlib import Path

    from lenext_dist.convert import outdir

    out, tmp, old = tmp_path / "hf", tmp_path / ".hf.partial", tmp_path / ".hf.old"
    out.mkdir()
    (out / "config.json").write_text("old")
    (out / outdir.MARKER).write_text(json.dumps({"files": ["config.json"]}))
    replaces = outdir.check_out(out, True, [])
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def busy(p):
        return OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(p))

    def replace(src, dst):
        if {(out, old): "aside", (tmp, out): "in", (old, out): "back"}[Path(src), Path(dst)] in fails.split("+"):
            raise busy(src)
        real_replace(src, dst)

    def rmtree(p, **kw):
        if Path(p) == old and fails == "delete":
            raise busy(p)
        real_rmtree(p, **kw)

    monkeypatch.setattr(outdir.os, "replace", replace)
    monkeypatch.setattr(outdir.shutil, "rmtree", rmtree)
    with pytest.raises(outdir.OutputError, match=says) if says else contextlib.nullcontext() as e:
        with outdir.staged(out, replaces) as t:
            (t / "config.json").write_text("new")
    if says:
        assert "\n" not in str(e.value)
    else:
        assert ("could not delete the previous export" in capsys.readouterr().err) == (fails == "delete")
    read = [(d / "config.json").read_text() if d.exists() else None for d in (out, tmp, old)]
    assert read == {"": ["new", None, None], "aside": ["old", None, None], "in": ["old", "new", None],
                    "in+back": [None, "new", "old"], "delete": ["new", None, "old"]}[fails]


def test_reshard_reads_the_ranks_in_number_order_and_refuses_zero3(tmp_path):
    """12 saved ranks: rank 10 comes after rank 9 (not after rank 1, as names sort); resharding is
    needed only when the saved DP size differs, never for ZeRO-0 (no partitions saved); ZeRO-3
    at another size is refused before anything is built."""
    from lenext_dist.errors import CheckpointError
    from lenext_dist.train.reshard import check_dp_size, optim_files

    step = tmp_path / "step_0000002"
    step.mkdir()
    assert not check_dp_size(step, 0, 4)  # ZeRO-0: module weights only
    for r in range(12):
        (step / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"")
    (step / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert [int(p.name.split("_")[3]) for p in optim_files(step)] == list(range(12))
    assert not check_dp_size(step, 2, 12) and check_dp_size(step, 2, 4) and check_dp_size(step, 1, 1)
    with pytest.raises(CheckpointError, match="ZeRO-3 optimizer partitions of 12 ranks; this run has 4"):
        check_dp_size(step, 3, 4)


def test_a_yaml_node_that_contains_itself_is_refused(tmp_path):
    f = tmp_path / "loop.yaml"
    f.write_text("train: &t {steps: 2, again: *t}\n")
    with pytest.raises(ConfigError, match="loop.yaml: .*alias"):
        load_config(f)
