"""Dependencies run one way (issues 16, 35): no module of lenext_dist imports a module that imports
it back, directly or through others; no package (train, eval, ...) imports one that imports it
back; and packages import only the ones before them in the pipeline. Imports inside functions
count too (a lazy import that only hides a cycle is still a cycle). Read from the source with
`ast`: nothing is imported."""
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


def package_edges(g: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(package, package) -> the module imports behind it, a package being the first name under
    lenext_dist (lenext_dist.train.loop -> train, lenext_dist.errors -> errors)."""
    def top(m: str) -> str:
        return m.split(".")[1] if "." in m else m

    edges: dict[tuple[str, str], list[str]] = {}
    for m, targets in g.items():
        for t in sorted(targets):
            if top(m) != top(t):
                edges.setdefault((top(m), top(t)), []).append(f"{m} -> {t}")
    return edges


def package_cycles(root: Path = PKG) -> list[str]:
    """One line per package-level cycle, naming the module imports of each of its edges."""
    edges = package_edges(import_graph(root))
    pg: dict[str, set[str]] = {}
    for a, b in edges:
        pg.setdefault(a, set()).add(b)
        pg.setdefault(b, set())
    return [" | ".join(f"{a} -> {b}: {', '.join(edges[a, b])}" for a, b in sorted(edges)
                       if a in c and b in c) for c in cycles(pg)]


def test_the_package_check_finds_a_planted_cycle(tmp_path):
    """Two packages importing each other through different modules: no module-level cycle."""
    for path, text in {"__init__.py": "", "x/__init__.py": "", "y/__init__.py": "",
                       "x/a.py": "from pkg.y import b\n", "x/c.py": "",
                       "y/b.py": "", "y/d.py": "def f():\n    from pkg.x import c\n"}.items():
        (tmp_path / "pkg" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / path).write_text(text)
    assert cycles(import_graph(tmp_path / "pkg")) == []
    assert package_cycles(tmp_path / "pkg") == ["x -> y: pkg.x.a -> pkg.y.b | y -> x: pkg.y.d -> pkg.x.c"]


def test_no_package_imports_one_that_imports_it_back():
    """Package-level (issue 35): prep importing eval while eval imports prep is no module cycle,
    yet the two packages can no longer be read, tested or shipped one without the other."""
    found = package_cycles()
    assert not found, "package import cycles:\n" + "\n".join(found)


# The pipeline a run goes through; a package may import only the ones before it. model and
# checkpoint are what training builds and writes, read again by convert (and, through it, eval).
PIPELINE = ("prep", "data", "model", "checkpoint", "train", "convert", "eval", "extend")


def test_dependencies_run_one_way_along_the_pipeline():
    """prep -> data -> train -> convert -> eval -> extend (issues 16, 35): no package imports a
    later one (the report is eval's; extend runs the whole pipeline again)."""
    rank = {p: i for i, p in enumerate(PIPELINE)}
    bad = [f"{a} -> {b}: {', '.join(mods)}" for (a, b), mods in sorted(package_edges(import_graph()).items())
           if a in rank and b in rank and rank[b] > rank[a]]
    assert bad == [], "imports against the pipeline:\n" + "\n".join(bad)


def test_the_library_never_imports_an_experiment():
    """torchtitan's rule: experiments depend on the core, never the reverse (experiments/)."""
    bad = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{p.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "experiments"]
    assert not bad, bad
