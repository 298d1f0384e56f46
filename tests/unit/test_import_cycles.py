"""Dependencies run one way (issue 16): no module of lenext_dist imports a module that imports it
back, directly or through others. Imports inside functions count too (a lazy import that only
hides a cycle is still a cycle). Read from the source with `ast`: nothing is imported."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "lenext_dist"



def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for p in root.rglob("*.py"):
        name = ".".join(p.relative_to(root.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _targets(mod: str, path: Path, node, mods: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    base = node.module or ""
    if node.level:
        parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """module -> the package modules it imports (a package's own submodules' parents excluded)."""
    mods = _modules(root)
    g: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for t in _targets(m, p, node, mods):
                while t and t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != m and not m.startswith(t + "."):
                    g[m].add(t)
    return g


def cycles(g: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], 0
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_the_check_finds_a_planted_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")  # a lazy import still counts
    (pkg / "c.py").write_text("from pkg import a\n")
    assert cycles(import_graph(pkg)) == [frozenset({"pkg.a", "pkg.b"})]


def test_no_module_imports_one_that_imports_it_back():
    found = cycles(import_graph())
    assert not found, f"import cycles: {[' <-> '.join(sorted(c)) for c in found]}"


def test_dependencies_run_one_way_model_train_eval():
    """model <- train <- eval <- extend (issue 16): the lower layers never import the upper."""
    g = import_graph()
    upper = {"lenext_dist.model": ("lenext_dist.train", "lenext_dist.eval", "lenext_dist.extend"),
             "lenext_dist.train": ("lenext_dist.eval", "lenext_dist.extend"),
             "lenext_dist.eval": ("lenext_dist.extend",)}
    bad = sorted((m, t) for m, targets in g.items() for low, ups in upper.items()
                 if m == low or m.startswith(low + ".") for t in targets if t.startswith(ups))
    assert bad == [], bad


def test_the_library_never_imports_an_experiment():
    """torchtitan's rule: experiments depend on the core, never the reverse (experiments/)."""
    bad = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{p.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "experiments"]
    assert not bad, bad
