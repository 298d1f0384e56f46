"""Hostile and careless input on real runs (issue 15).

One real 1-process run of launch/pretrain.py (tiny model, ZeRO-2, 2 steps, ~10 s) is exported,
copied, truncated and poisoned:
- convert --overwrite never deletes what it did not write (a folder of user files, the checkpoint
  folder, the run folder, a folder with a previous export plus a user's file);
- a checkpoint whose pickle runs os.system is refused on convert, resume, checkpoint.init_from and
  --head-scales-from, and the command never runs;
- a truncated checkpoint file is named; a failed export leaves no `.partial`;
- a run whose loss or weights go non-finite stops with exit 2, `latest` on the last good step,
  and export refuses non-finite weights;
- a plain package install (no dev extra, so no mpi4py) trains a one-process run.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import REPO, env, losses, write_config

pytestmark = pytest.mark.e2e


def pretrain(cfg, *overrides, check=True):
    e = env()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        e.pop(k, None)
    p = subprocess.run([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(cfg),
                        *overrides], cwd=REPO, env=e, capture_output=True, text=True, timeout=300)
    if check and p.returncode:
        raise AssertionError(f"pretrain exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def convert_cli(*args):
    return subprocess.run([sys.executable, "-m", "lenext_dist.convert", *map(str, args)], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=300)


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def convert(capsys):
    """`python -m lenext_dist.convert ...` in this process (its main, wrapper included): the
    subprocess form (convert_cli) costs ~10 s of imports per call on this machine."""
    from lenext_dist.convert.__main__ import main

    def call(*args):
        capsys.readouterr()
        rc = main([str(a) for a in args])
        out = capsys.readouterr()
        return Result(rc, out.out, out.err)

    return call


@pytest.fixture(scope="module")
def run(sample_shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("safety")
    cfg = write_config(tmp, sample_shards, "r", parallel={"zero_stage": 2},
                       train={"steps": 2, "eval_interval": 0}, checkpoint={"interval": 0})
    pretrain(cfg)
    return {"cfg": cfg, "dir": tmp / "r", "ckpt": tmp / "r" / "checkpoints", "shards": sample_shards}


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_overwrite_never_deletes_what_convert_did_not_write(run, tmp_path, convert):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret\n")
    (home / "thesis.tex").write_text("years of work\n")
    before = {"home": tree(home), "run": tree(run["dir"])}
    p = convert_cli("--checkpoint", run["ckpt"], "--out", home, "--overwrite")  # the real command
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == (f"error: --out {home} holds files that are not from an export (.ssh, "
                                "thesis.tex); --overwrite replaces only a previous export: move them "
                                "away or choose another folder")
    for out, why in ((home, "holds files that are not from an export (.ssh, thesis.tex)"),
                     (run["ckpt"], "contains"), (run["dir"], "contains"),
                     (run["ckpt"] / "step_0000002", "contains"),
                     (run["ckpt"] / "hf", "lies inside the checkpoint folder")):
        p = convert("--checkpoint", run["ckpt"], "--out", out, "--overwrite")
        assert p.returncode == 2 and why in p.stderr and "Traceback" not in p.stderr, (out, p.stderr)
    assert tree(home) == before["home"] and tree(run["dir"]) == before["run"]
    assert (home / "thesis.tex").read_text() == "years of work\n"

    # a previous export is replaced, and the command says what it deletes
    out = tmp_path / "hf"
    assert convert("--checkpoint", run["ckpt"], "--out", out).returncode == 0
    assert (out / "lenext_export.json").is_file()
    p = convert("--checkpoint", run["ckpt"], "--out", out)
    assert p.returncode == 2 and "--overwrite" in p.stderr
    p = convert("--checkpoint", run["ckpt"], "--out", out, "--overwrite")
    assert p.returncode == 0 and f"replacing the previous export {out}" in p.stderr
    # ... but not once a user put a file of their own in it
    (out / "notes.md").write_text("mine\n")
    p = convert("--checkpoint", run["ckpt"], "--out", out, "--overwrite")
    assert p.returncode == 2 and "notes.md" in p.stderr
    assert (out / "notes.md").read_text() == "mine\n" and (out / "model.safetensors").is_file()
    # a symbolic link is not followed into someone else's folder
    (tmp_path / "link").symlink_to(home)
    p = convert("--checkpoint", run["ckpt"], "--out", tmp_path / "link", "--overwrite")
    assert p.returncode == 2 and "symbolic link" in p.stderr and tree(home) == before["home"]


def test_a_failed_export_leaves_no_partial_folder(run, tmp_path, convert):
    p = convert("--checkpoint", run["ckpt"], "--out", tmp_path / "hf", "--tokenizer",
                tmp_path / "missing.model")
    assert p.returncode == 2 and "missing.model" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == []


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def poisoned(run, tmp_path):
    """A copy of the run whose module file also holds a pickled os.system call (read with
    weights_only and numpy's RNG-state types only: the same crafting works on any version)."""
    import numpy as np

    numpy_globals = [np.ndarray, np.dtype, np._core.multiarray._reconstruct, type(np.dtype(np.uint32))]
    dst = tmp_path / "r"
    shutil.copytree(run["dir"], dst)
    cfg = tmp_path / "r.yaml"
    cfg.write_text(run["cfg"].read_text().replace(str(run["dir"]), str(dst)))
    f = dst / "checkpoints" / "step_0000002" / "mp_rank_00_model_states.pt"
    with torch.serialization.safe_globals(numpy_globals):
        state = torch.load(f, weights_only=True)
    state["evil"] = Evil(tmp_path / "PWNED")
    torch.save(state, f)
    return {"cfg": cfg, "ckpt": dst / "checkpoints", "marker": tmp_path / "PWNED"}


def test_a_malicious_checkpoint_is_refused_everywhere_and_runs_nothing(poisoned, run, tmp_path, convert):
    refused = "refused to load: it holds pickled code or objects that are not weights (posix.system)"
    p = convert("--checkpoint", poisoned["ckpt"], "--out", tmp_path / "hf")
    assert p.returncode == 2 and refused in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    p = convert("--checkpoint", run["ckpt"], "--out", tmp_path / "hf2", "--head-scales-from",
                poisoned["ckpt"])
    assert p.returncode == 2 and refused in p.stderr
    # resume (same run, two more steps) and init_from (a HeadScale run started from it)
    p = pretrain(poisoned["cfg"], "--train.steps=4", check=False)
    assert p.returncode == 2 and refused in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    hs = write_config(tmp_path, run["shards"], "hs", train={"steps": 1, "eval_interval": 0,
                                                            "mode": "headscale"},
                      attention={"head_scale": {"enabled": True, "trainable": True}},
                      checkpoint={"interval": 0, "init_from": str(poisoned["ckpt"])})
    p = pretrain(hs, check=False)
    assert p.returncode == 2 and refused in p.stderr
    assert not poisoned["marker"].exists()


def test_a_pickle_planted_in_the_data_cache_is_refused_on_resume_and_runs_nothing(run, tmp_path):
    """megatron reads <run_dir>/data_cache/*.npy with numpy.load(allow_pickle=True): a copied run
    folder whose cached sample indices are pickles is refused on resume, by one line."""
    import pickle

    dst = tmp_path / "r"
    shutil.copytree(run["dir"], dst)
    cfg = tmp_path / "r.yaml"
    cfg.write_text(run["cfg"].read_text().replace(str(run["dir"]), str(dst)))
    npys = sorted((dst / "data_cache").glob("*.npy"))
    assert len(npys) >= 3
    for f in npys:
        f.write_bytes(pickle.dumps(Evil(tmp_path / "PWNED")))
    p = pretrain(cfg, "--train.steps=4", check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]  # the first file megatron loads is the one named
    assert any(last.startswith(f"error: data.cache_dir: {f}: not a plain numpy array") for f in npys), \
        p.stderr[-2000:]
    assert not (tmp_path / "PWNED").exists()


def test_a_truncated_checkpoint_names_its_folder(run, tmp_path, convert):
    dst = tmp_path / "r"
    shutil.copytree(run["dir"], dst)
    step = dst / "checkpoints" / "step_0000002"
    f = step / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    p = convert("--checkpoint", dst / "checkpoints", "--out", tmp_path / "hf")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"{step}: a checkpoint file cannot be read" in p.stderr and "truncated" in p.stderr


def test_a_diverging_run_stops_keeps_the_last_good_checkpoint_and_is_not_exported(run, tmp_path, convert):
    cfg = write_config(tmp_path, run["shards"], "nan", parallel={"zero_stage": 2},
                       train={"steps": 6, "eval_interval": 0}, checkpoint={"interval": 1},
                       optim={"lr": 1e30, "warmup_steps": 2})
    p = pretrain(cfg, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    ckpt = tmp_path / "nan" / "checkpoints"
    assert "error: training diverged: non-finite loss, grad norm or weights at step 2" in p.stderr
    assert f"the last good checkpoint is {ckpt}/step_0000001" in p.stderr
    assert (ckpt / "latest").read_text().strip() == "step_0000001"
    assert sorted(x.name for x in ckpt.glob("step_*")) == ["step_0000001"]
    assert max(losses(tmp_path / "nan")) == 2  # nothing trained past the bad step
    # lr = inf is refused before anything starts (a first update that spoils the weights, which
    # then are never saved: tests/unit/test_train_engine.py)
    p = pretrain(cfg, "--optim.lr=.inf", "--run_dir", str(tmp_path / "inf"), check=False)
    assert p.returncode == 2 and "optim.lr: must be a finite number, got inf" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "inf").exists()

    # export refuses a checkpoint whose weights are not finite (made so here by hand)
    from lenext_dist.checkpoint.safe_load import load as safe_load

    step = ckpt / "step_0000001"
    for f in step.glob("*optim_states.pt"):
        sd = safe_load(f)
        flat = sd["optimizer_state_dict"]["single_partition_of_fp32_groups"]
        flat[0] = flat[0].detach().clone()
        flat[0][3] = float("nan")
        torch.save(sd, f)
    p = convert("--checkpoint", ckpt, "--out", tmp_path / "hf")
    assert p.returncode == 2 and "hold NaN or inf" in p.stderr and not (tmp_path / "hf").exists()


def test_a_plain_package_install_trains_one_process_without_mpi4py(run, tmp_path):
    """`pip install .` (no extras) into a fresh venv, then a one-process run.

    The venv sees the shared venv's site-packages through a .pth file (torch, DeepSpeed, ...:
    reinstalling them would take minutes and the network), and a meta-path hook makes
    `import mpi4py` fail as on a machine without the dev extra. pip installs with --no-index, so
    every dependency must already be satisfied; the run then imports the installed copy."""
    import sysconfig

    base = sysconfig.get_paths()["purelib"]
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_shared.pth").write_text(base + "\n")
    (site / "_no_mpi4py.py").write_text(
        "import importlib.abc, sys\n"
        "class _NoMPI(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'mpi4py':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoMPI())\n")
    (site / "_no_mpi4py.pth").write_text("import _no_mpi4py\n")
    src = tmp_path / "src"  # a clean copy: building in the checkout would leave build/ behind
    shutil.copytree(REPO / "lenext_dist", src / "lenext_dist",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    py = venv / "bin" / "python"
    e = {k: v for k, v in env().items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "MASTER_PORT")}
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
                    str(src)], check=True, env=e, capture_output=True, timeout=300)
    code = ("import lenext_dist, sys; assert lenext_dist.__file__.startswith(sys.prefix), lenext_dist.__file__\n"
            "try:\n    import mpi4py\nexcept ModuleNotFoundError:\n    print('no mpi4py')\n"
            "from lenext_dist.config import load_config\nfrom lenext_dist.train.loop import train\n"
            f"print(train(load_config({str(run['cfg'])!r}, ['run_dir={tmp_path / 'v'}', 'train.steps=2'])))\n")
    p = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=e, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "no mpi4py" in p.stdout and "{'step': 2" in p.stdout
    assert losses(tmp_path / "v") == losses(run["dir"])  # the same run as the checkout's


def _full_disk_cli(*args, size="300k"):
    """`lenext convert ARGS` in a user + mount namespace where /mnt is a tmpfs of `size` (a real
    file system that fills up; no root needed where user namespaces are allowed)."""
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1k tmpfs /mnt"],
            capture_output=True).returncode:
        pytest.skip("no user namespaces with tmpfs mounts here (unshare -rm)")
    cmd = " ".join([sys.executable, "-m", "lenext_dist.convert", *map(str, args)])
    return subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs /mnt "
                           f"&& {cmd}; rc=$?; ls -A /mnt; exit $rc"],
                          capture_output=True, text=True, env=env(), cwd=REPO)


@pytest.mark.parametrize("direction", ["export", "import"])
def test_a_full_disk_is_one_line_and_leaves_nothing_behind(run, tmp_path, direction):
    """Issue 40, F8: the export on a full disk died in safetensors' SafetensorError, the import in
    torch.save's "unexpected pos" RuntimeError, both as tracebacks."""
    if direction == "export":
        args = ["--checkpoint", run["ckpt"], "--out", "/mnt/hf", "--no-tokenizer"]
    else:
        hf = tmp_path / "hf"
        assert convert_cli("--checkpoint", run["ckpt"], "--out", hf, "--no-tokenizer").returncode == 0
        args = ["--from-hf", hf, "--out", "/mnt/imported"]
    p = _full_disk_cli(*args)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"error: writing /mnt/{args[3].split('/')[-1]} failed:") and "free space" in line
    assert p.stdout.strip() == ""  # `ls -A /mnt`: no partial folder left
