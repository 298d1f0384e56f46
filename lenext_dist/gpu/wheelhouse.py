"""`make wheelhouse`: the wheels a GPU node without network lacks, built here, at most 64 MiB.

    python -m lenext_dist.gpu.wheelhouse --python-version 3.12 --out wheelhouse/py3.12

The node brings its own torch (never carried, never replaced) and a few packages (NODE_HAS);
what this package needs beyond them travels: megatron-core, transformers, zstandard and the
others as binary wheels for the node's Python (`pip download --only-binary :all:
--python-version`), DeepSpeed as the py3 wheel its sdist builds to (`pip wheel --no-deps
--no-build-isolation`, against this environment's torch), and this package. The list is the
dependency closure of pyproject.toml's dependencies, read from this environment's installed
metadata (the tested versions, pinned), minus the closure of NODE_HAS. `<out>/requirements.txt`
names every wheel; the node installs exactly those with `pip install --no-index --no-deps
--find-links <out> --target <folder> -r <out>/requirements.txt` (make gpu-check).
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from lenext_dist.flags import Parser

LIMIT_BYTES = 64 * 2**20
"""What may travel to the node with the working tree."""
NODE_HAS = ("torch", "sentencepiece", "safetensors", "tensorboard", "mpi4py", "tokenizers",
            "numpy", "pyyaml", "packaging", "tqdm", "regex")
"""The GPU node's packages (DESIGN.md section 8: torch 2.11, transformers 5.17, sentencepiece,
safetensors, tensorboard, mpi4py) and those its transformers 5.17 requires in the same ranges as
our 5.23 (tokenizers >= 0.23.1, < 0.24; regex >= 2025.10.22; numpy, pyyaml, packaging, tqdm):
present there, with their own dependencies. Not typer: its dependencies changed between
releases (this environment's pulls pydantic), so it travels with its closure."""
CARRY_ANYWAY = {"huggingface-hub": "transformers 5.23 needs >= 1.31 (checked when it is imported); "
                "the node's transformers 5.17 asked only >= 1.5"}
"""Packages in the node's closure whose node version may be too old for what we carry."""
NOT_NEEDED = {"pyarrow": "data prep reads parquet on a CPU machine; a 40 MB wheel",
              "matplotlib": "plots are drawn from the results elsewhere (a HeadScale run writes its "
                            "head_scales.json without its heatmap there)"}
"""Dependencies of this package that the GPU check and training do not import."""
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
BUILT = ("deepspeed",)
"""Packages without a wheel on PyPI: built here from their sdist (py3-none-any)."""


def marker_env(pyver: str) -> dict:
    return {"python_version": pyver, "python_full_version": pyver + ".0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def requirements(names, env: dict) -> list[str]:
    return [Requirement(r).name for r in names
            if not Requirement(r).marker or Requirement(r).marker.evaluate(env)]


def closure(roots, env: dict, stop=()) -> dict[str, str]:
    """{canonical name: installed version} of roots and everything they require under `env`
    (this environment's metadata); names in `stop` are included but not followed."""
    seen: dict[str, str] = {}
    todo = [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"wheelhouse: {name} is required but not installed here; "
                             "run `make setup` first") from None
        seen[name] = dist.version
        if name not in stop:
            todo += [canonicalize_name(n) for n in requirements(dist.requires or [], env)]
    return seen


def project(repo: Path) -> dict:
    """pyproject.toml's [project] table (its dependencies and version: their one home)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]


def plan(pyver: str, repo: Path) -> dict[str, str]:
    """{name: version} to carry (this package excluded: it is built from `repo`)."""
    env = marker_env(pyver)
    roots = [n for n in requirements(project(repo)["dependencies"], env)
             if canonicalize_name(n) not in NOT_NEEDED]
    node = closure(NODE_HAS, env, stop=set(CARRY_ANYWAY))
    for name in CARRY_ANYWAY:
        node.pop(name, None)
    return {n: v for n, v in sorted(closure(roots, env).items()) if n not in node}


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DS_BUILD_OPS": "0"})
    if p.returncode:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [""]
        raise SystemExit(f"wheelhouse: `{' '.join(cmd)}` failed: {tail[0]}")


def build(pyver: str, out: Path, repo: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    carry = plan(pyver, repo)
    binary = [f"{n}=={v}" for n, v in carry.items() if n not in BUILT]
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    _pip("download", "-q", "--no-deps", "--only-binary", ":all:", "--python-version", pyver,
         "--implementation", "cp", *plat, "-d", str(out), *binary)
    for n in BUILT:
        if not list(out.glob(f"{n}-{carry[n]}-*.whl")):  # built once per version
            _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), f"{n}=={carry[n]}")
    ours = "lenext_dist"
    for old in out.glob(f"{ours}-*.whl"):
        old.unlink()  # this package changes with the tree: always rebuilt
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(repo))
    lines = [f"{n}=={v}" for n, v in carry.items()] + [f"{ours}=={project(repo)['version']}"]
    (out / "requirements.txt").write_text(
        "# make gpu-check installs exactly these, --no-deps, beside the node's torch\n" + "\n".join(lines) + "\n")
    keep = {f"{canonicalize_name(line.split('==')[0])}=={line.split('==')[1]}" for line in lines}
    for whl in out.glob("*.whl"):  # wheels of versions no longer carried (an earlier build)
        name, ver = whl.name.split("-")[:2]
        if f"{canonicalize_name(name)}=={ver}" not in keep:
            whl.unlink()
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    return {"packages": lines, "bytes": size}


HELP = """Build the wheels a GPU node without network lacks (it keeps its own torch), at most 64 MiB.

Binary wheels for the node's Python of what this package needs beyond the node's packages,
DeepSpeed built to a py3 wheel, and this package; requirements.txt names them. On the node,
`make gpu-check` installs them offline beside its torch. See docs/cluster.md (GPU check).

example:
  python -m lenext_dist.gpu.wheelhouse --python-version 3.12 --out wheelhouse/py3.12
"""


def main(argv=None) -> int:
    ap = Parser(prog="python -m lenext_dist.gpu.wheelhouse", description=HELP,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python-version", default="3.12", help="the node's Python (default 3.12)")
    ap.add_argument("--out", required=True, help="the wheelhouse folder (gitignored: wheelhouse/)")
    ap.add_argument("--repo", default=".", help="this package's source tree (pyproject.toml)")
    args = ap.parse_args(argv)
    got = build(args.python_version, Path(args.out), Path(args.repo).resolve())
    mib = got["bytes"] / 2**20
    if got["bytes"] > LIMIT_BYTES:
        print(f"wheelhouse: {args.out} is {mib:.1f} MiB > {LIMIT_BYTES // 2**20} MiB; drop a package "
              "the node has (NODE_HAS in lenext_dist/gpu/wheelhouse.py)")
        return 1
    print(f"wheelhouse: {len(got['packages'])} wheels, {mib:.1f} MiB in {args.out} "
          f"(<= {LIMIT_BYTES // 2**20} MiB): {', '.join(got['packages'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
