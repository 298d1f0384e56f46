"""The package installed as a user gets it (a built wheel, not the editable checkout) needs nothing
from the checkout (issue 35): `lenext extend --help`, `lenext train --help` and a one-process dry
run of `python -m lenext_dist.train` with a config of the working directory, run from a folder
outside the checkout by a fresh interpreter that sees only the installed copy and the
dependencies of .venv (its site-packages on PYTHONPATH: no .pth, so no editable hook).

An audit hook in that interpreter records every file it opens or lists (imports included: they
open their source through the same hook) and every process it starts; any under the checkout
other than .venv's dependencies fails the test. About 40 s (the wheel build and one import of
torch, DeepSpeed and megatron)."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.e2e

DEPS = Path(sysconfig.get_paths()["purelib"])  # .venv's site-packages: torch, deepspeed, ...

PROBE = r'''
import json, os, runpy, sys

repo, venv, report = sys.argv[1:4]
commands = json.loads(sys.argv[4])
touched = []


def under_checkout(p):
    p = os.path.abspath(os.fsdecode(p))
    return (p == repo or p.startswith(repo + os.sep)) and not p.startswith(venv + os.sep)


def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir", "os.chdir", "subprocess.Popen", "os.exec",
                 "os.posix_spawn", "os.system"):
        for a in args:
            for x in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(x, (str, bytes, os.PathLike)) and under_checkout(x):
                    touched.append(f"{event}: {os.fsdecode(x)}")


sys.addaudithook(hook)
results = []
for module, argv in commands:
    sys.argv = [module, *argv]
    print(f"=== {module} {' '.join(argv)}", flush=True)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    results.append(code)
import lenext_dist
with open(report, "w") as f:
    json.dump({"codes": results, "touched": touched, "package": lenext_dist.__file__,
               "sys_path": sys.path}, f)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site, venv): the package's wheel installed into `site`, a fresh venv without .venv's site."""
    tmp_path = tmp_path_factory.mktemp("installed")
    # 1. a wheel of the package's own files (what a release ships), installed into a folder
    src = tmp_path / "src"
    shutil.copytree(REPO / "lenext_dist", src / "lenext_dist",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                        "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
                        str(src)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    shutil.rmtree(src)  # nothing of the sources is left but the installed copy
    assert (site / "lenext_dist" / "train" / "__main__.py").is_file()
    assert not (site / "lenext_dist" / "train" / "__main__.py").is_symlink()

    # 2. a fresh interpreter without .venv's site (no .pth files: the editable hook is inactive)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return site, venv


def _env(tmp_path, site) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"),
            "PYTHONPATH": f"{site}{os.pathsep}{DEPS}", "PYTHONNOUSERSITE": "1",
            "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), "MPLCONFIGDIR": str(tmp_path / "mpl")}


def test_the_installed_package_needs_nothing_from_the_checkout(installed, tmp_path):
    site, venv = installed
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.yaml").write_text(
        "name: tiny\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_query_groups: 2,\n"
        "  ffn_hidden_size: 176, vocab_size: 4096, seq_length: 32}\n"
        "train: {micro_batch_size: 2, global_batch_size: 4}\n")
    (work / "probe.py").write_text(PROBE)
    env = _env(tmp_path, site)
    commands = [("lenext_dist.cli", ["extend", "--help"]), ("lenext_dist.cli", ["train", "--help"]),
                ("lenext_dist.train", ["--config", "tiny.yaml", "--dry-run"])]
    report = tmp_path / "report.json"
    p = subprocess.run([str(venv / "bin" / "python"), "probe.py", str(REPO), str(REPO / ".venv"),
                        str(report), json.dumps(commands)],
                       cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and report.is_file(), p.stderr[-4000:]
    r = json.loads(report.read_text())
    assert r["codes"] == [0, 0, 0], p.stdout[-4000:] + p.stderr[-4000:]
    assert r["package"] == str(site / "lenext_dist" / "__init__.py")
    assert not [x for x in r["sys_path"] if x.startswith(str(REPO)) and not x.startswith(str(DEPS))]
    assert r["touched"] == [], r["touched"][:20]
    out = p.stdout
    assert "Extend a pretrained run to longer contexts" in out and "lenext train --nproc 2" in out
    assert "# dry run (meta device, nothing allocated)" in out and "parameters: 616,768 total" in out


def test_the_slurm_job_script_runs_the_installed_package(installed, sample_shards, tmp_path):
    """launch/slurm/pretrain.sbatch, copied out of the checkout, in a working folder that is not
    one (a user of the wheel): its checks and the srun line it would run (DRY_RUN) name the
    package's module, nothing of a checkout."""
    site, venv = installed
    work = tmp_path / "work"
    work.mkdir()
    script = work / "pretrain.sbatch"
    shutil.copy(REPO / "launch" / "slurm" / "pretrain.sbatch", script)
    tok = work / "tokenizer.model"
    shutil.copy(sample_shards["tokenizer"], tok)
    blend = ", ".join(f"{{prefix: {b['prefix']}, weight: {b['weight']}}}" for b in sample_shards["blend"])
    (work / "tiny.yaml").write_text(
        "name: tiny\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_query_groups: 2,\n"
        "  ffn_hidden_size: 176, vocab_size: 4096, seq_length: 32}\n"
        f"data: {{tokenizer: {tok}, blend: [{blend}]}}\n"
        "train: {steps: 5, micro_batch_size: 2, global_batch_size: 4}\n")
    env = {**_env(tmp_path, site), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_NTASKS_PER_NODE": "2", "SLURM_SUBMIT_DIR": str(work), "PYTHON": str(venv / "bin" / "python"),
           "CONFIG": "tiny.yaml", "DRY_RUN": "1"}
    p = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"-m lenext_dist.train --config {work}/tiny.yaml" in p.stdout
    assert str(REPO) not in p.stdout + p.stderr
