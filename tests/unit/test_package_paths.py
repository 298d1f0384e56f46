"""The package is self-contained (issue 35): no module of lenext_dist edits sys.path or computes a
path from its own file that leaves the package (an installed, non-editable copy has no checkout
around it), and training is launched from one place. Read from the source with `ast`."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "lenext_dist"

_SAME = {"abspath", "realpath", "normpath", "resolve", "absolute", "Path", "PurePath", "fspath", "str"}


def _levels_up(node) -> int | None:
    """How many directories above `__file__` the path expression `node` is (None: not a path
    derived from __file__). `__file__` is 0; dirname / .parent add 1; .parents[k] adds k + 1."""
    if isinstance(node, ast.Name):
        return 0 if node.id == "__file__" else None
    if isinstance(node, ast.Attribute):
        inner = _levels_up(node.value)
        return None if inner is None else inner + 1 if node.attr == "parent" else None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "parents" and isinstance(node.slice, ast.Constant):
        inner = _levels_up(node.value.value)
        return None if inner is None else inner + node.slice.value + 1
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in _SAME or name == "dirname":
            arg = node.args[0] if node.args else (f.value if isinstance(f, ast.Attribute) else None)
            inner = _levels_up(arg) if arg is not None else None
            if inner is None and isinstance(f, ast.Attribute):  # Path(__file__).resolve()
                inner = _levels_up(f.value)
            return None if inner is None else inner + (name == "dirname")
    return None


def outside_paths(root: Path = PKG) -> list[str]:
    """`file:line: expression` for every path built from __file__ that climbs above `root`."""
    bad = []
    for p in sorted(root.rglob("*.py")):
        depth = len(p.relative_to(root).parts)  # levels from the file up to `root` itself
        for node in ast.walk(ast.parse(p.read_text())):
            up = _levels_up(node) if isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)) else None
            if up is not None and up > depth:
                bad.append(f"{p.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return bad


EDITS = ("sys.path.insert(", "sys.path.append(", "sys.path.extend(", "site.addsitedir(")


def sys_path_edits(root: Path = PKG) -> list[str]:
    """`file:line` of every sys.path.insert/append/extend, assignment to sys.path, site.addsitedir."""
    bad = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            code = ast.unparse(node) if isinstance(node, (ast.Call, ast.Assign, ast.AugAssign)) else ""
            if isinstance(node, ast.Call) and code.startswith(EDITS) \
                    or isinstance(node, (ast.Assign, ast.AugAssign)) and "sys.path" in code.split("=")[0]:
                bad.append(f"{p.relative_to(root.parent)}:{node.lineno}: {code}")
    return bad


def test_the_checks_find_planted_escapes(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text(
        "import os, sys\nfrom pathlib import Path\n"
        "HERE = Path(__file__).resolve().parents[1] / 'hf'\n"          # the package: fine
        "REPO = Path(__file__).resolve().parents[2]\n"                 # the checkout
        "UP = Path(__file__).parent.parent.parent\n"                   # the checkout
        "R = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
        "OK = os.path.dirname(os.path.abspath(__file__))\n"
        "sys.path.insert(0, R)\n")
    assert [b.split(": ")[0] for b in outside_paths(pkg)] == ["pkg/sub/a.py:4", "pkg/sub/a.py:5",
                                                              "pkg/sub/a.py:6"]
    assert sys_path_edits(pkg) == ["pkg/sub/a.py:8: sys.path.insert(0, R)"]


def test_no_path_into_the_checkout():
    assert outside_paths() == []


def test_no_sys_path_edits():
    assert sys_path_edits() == []


def test_training_is_launched_from_one_module():
    """One place builds the launch command (lenext_dist/train/launch.py); `lenext train`, the
    HeadScale search of `lenext extend` and the GPU check all call it."""
    found = sorted(str(p.relative_to(REPO)) for p in PKG.rglob("*.py")
                   if "deepspeed.launcher.runner" in p.read_text())
    assert found == ["lenext_dist/train/launch.py"]
    for user in ("extend/search.py", "gpu/launch_case.py", "train/cli.py"):
        assert "launch_command(" in (PKG / user).read_text(), user


def test_the_launch_command_runs_the_package_module():
    import sys

    from lenext_dist.train.launch import launch_command

    cmd = launch_command("c.yaml", 4, 29999, ["--train.steps=3", "--optim.lr", "1e-3"])
    assert cmd == [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "4",
                   "--master_port", "29999", "--module", "lenext_dist.train", "--config", "c.yaml",
                   "--train.steps=3", "--optim.lr", "1e-3"]
    free = launch_command("c.yaml", 2)
    assert int(free[free.index("--master_port") + 1]) > 0
