"""`make wheelhouse` (issue 39): built here for this machine's Python (the tests run against this
torch), at most 64 MiB, installed by `make gpu-site` with --no-index --no-deps into a fresh folder;
that folder plus the packages of the GPU node (NODE_HAS and their dependencies, taken from .venv
as a folder of links: no .venv site-packages, no editable hook, `python -S`) imports lenext_dist,
DeepSpeed, megatron-core and transformers from the folder and runs the installed `lenext train
--dry-run` of the TinyLlama config from a directory outside the checkout.

Downloads from PyPI (allowed here and in CI); the wheelhouse is built once per session. ~1-2 min."""
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
PYVER = f"{sys.version_info.major}.{sys.version_info.minor}"
BIN = str(Path(sys.executable).parent)


def _make(repo, *args, timeout=600):
    p = subprocess.run(["make", "-o", "setup", "--no-print-directory", f"BIN={BIN}", *args], cwd=repo,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.fixture(scope="session")
def wheelhouse(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("wheelhouse") / f"py{PYVER}"
    stdout = _make(repo, "wheelhouse", f"PYVER={PYVER}", f"WHEELHOUSE={out}")
    return out, stdout


def _node_view(dest: Path) -> Path:
    """A folder of links to .venv's files of the node's packages and their dependencies only."""
    from lenext_dist.gpu.wheelhouse import CARRY_ANYWAY, NODE_HAS, closure, marker_env

    dest.mkdir()
    node = closure(NODE_HAS, marker_env(PYVER), stop=set(CARRY_ANYWAY))
    for name in CARRY_ANYWAY:
        node.pop(name)
    for name in node:
        dist = md.distribution(name)
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if (site / top).exists() and not (dest / top).exists():
                (dest / top).symlink_to(site / top)
    return dest


def test_wheelhouse_fits_and_carries_no_torch(wheelhouse):
    from lenext_dist.gpu.wheelhouse import LIMIT_BYTES

    out, stdout = wheelhouse
    size = sum(f.stat().st_size for f in out.iterdir())
    assert size <= LIMIT_BYTES and f"{size / 2**20:.1f} MiB" in stdout
    wheels = {f.name.split("-")[0].lower() for f in out.glob("*.whl")}
    assert {"deepspeed", "megatron_core", "transformers", "lenext_dist", "zstandard"} <= wheels
    assert not {"torch", "numpy", "sentencepiece", "safetensors"} & wheels
    reqs = [x for x in (out / "requirements.txt").read_text().splitlines() if not x.startswith("#")]
    assert len(reqs) == len(list(out.glob("*.whl")))  # every wheel named, nothing else
    assert next(f for f in out.glob("deepspeed-*.whl")).name.endswith("py3-none-any.whl")


def test_installs_offline_beside_the_node_torch_and_dry_runs(repo, wheelhouse, tmp_path):
    out, _ = wheelhouse
    site = tmp_path / "gpu-site"
    _make(repo, "gpu-site", f"GPU_PY={sys.executable}", f"WHEELHOUSE={out}", f"GPU_SITE={site}")
    node = _node_view(tmp_path / "node")
    work = tmp_path / "work"  # outside the checkout: its lenext_dist cannot be imported
    shutil.copytree(repo / "configs", work / "configs")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{node}", DS_ACCELERATOR="cpu")
    where = subprocess.run(
        [sys.executable, "-S", "-c", "import lenext_dist, deepspeed, megatron.core, transformers, torch;"
         "print('\\n'.join(m.__file__ for m in (lenext_dist, deepspeed, megatron.core, transformers, torch)))"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    *ours, torch_file = where.stdout.split()
    assert all(f.startswith(str(site)) for f in ours), ours
    assert torch_file.startswith(str(node))
    p = subprocess.run([sys.executable, "-S", str(site / "bin" / "lenext"), "train", "--dry-run",
                        "--config", "configs/exp/tinyllama-1.1b-nope.yaml"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "# dry run (meta device" in p.stdout and "22 layers" in p.stdout
