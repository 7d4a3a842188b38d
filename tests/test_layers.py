"""Layers without cycles: every import in the package points down.

The walk reads the source of every module the package installs (``taso_egg/`` and the
repository folders ``pyproject.toml`` maps into it with ``package-dir``) with ``ast``:
imports inside functions count, relative imports are resolved, and the commands
``taso_egg.cli`` plugs in by name (``PLUGGED_COMMANDS``) count as imports of the CLI.
It fails, naming the cycle and the import lines, if modules import each other in a
circle, or if folders do (a module directly in ``taso_egg/`` counts as a folder of
its own: ``taso_egg.product.optimize_graph``, ``taso_egg.cost`` and ``taso_egg.egraph`` are three units).
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# --- the walk ------------------------------------------------------------------------


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Import name -> folder, from pyproject.toml's ``package-dir``."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: root / folder for name, folder in config["package-dir"].items()}


def find_modules(dirs: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package's ``__init__``)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join([package, *parts])
            # a folder mapped as a package of its own is walked under that name
            if any(name.startswith(other + ".") or name == other for other in dirs
                   if other != package and other.startswith(package + ".")):
                continue
            modules[name] = (path, is_package)
    return modules


def _known(name: str | None, modules) -> str | None:
    """The innermost module of ours that ``name`` (a dotted import) lands in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node, module: str, is_package: bool, modules) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module
        # ``from pkg import name``: the submodule pkg.name when there is one
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                 for alias in node.names]
    return [t for t in (_known(n, modules) for n in names) if t is not None]


def _plugged(tree, modules) -> list[str]:
    """Modules named as strings in a ``PLUGGED_COMMANDS`` assignment, or passed as a
    literal to ``importlib.import_module``."""
    out = []
    for node in ast.walk(tree):
        literal = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PLUGGED_COMMANDS"
                                                for t in node.targets):
            literal = node.value
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                == "import_module" and node.args:
            literal = node.args[0]
        if literal is not None:
            out += [c.value for c in ast.walk(literal)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in modules]
    return out


def import_edges(modules) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) -> where: ``file:line`` of each import making the edge."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in sorted(set(_imported(node, module, is_package, modules))):
                    if target != module:
                        edges[module, target].append(f"{where}:{node.lineno}")
        for target in sorted(set(_plugged(tree, modules))):
            if target != module:
                edges[module, target].append(f"{where} (plugged in by name)")
    return dict(edges)


def folder_of(module: str, modules) -> str:
    """The unit of the folder-level check: the package directly below the top one that
    holds ``module``, or the module itself when it sits in the top package."""
    parts = module.split(".")
    top = ".".join(parts[:2])
    return top if len(parts) >= 2 and modules.get(top, (None, False))[1] else module


def folder_edges(edges, modules) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (a, b), where in edges.items():
        fa, fb = folder_of(a, modules), folder_of(b, modules)
        if fa != fb:
            out[fa, fb] += [f"{a} -> {b} ({w})" for w in where]
    return dict(out)


# --- cycles --------------------------------------------------------------------------


def find_cycles(edges) -> list[list[str]]:
    """One cycle (a list of nodes, the first repeated at the end) per strongly
    connected component of more than one node (Tarjan, iterative)."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(edges):
        graph[a].append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return [_cycle_through(c, graph) for c in components]


def _cycle_through(component: list[str], graph) -> list[str]:
    """A shortest cycle from the component's first node back to it (breadth first)."""
    members, start = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in members and w not in came_from and w != start:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # Tarjan said there is


def describe(cycle: list[str], edges) -> str:
    hops = [f"  {a} -> {b}: {', '.join(edges[a, b])}" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "\n" + "\n".join(hops)


# --- the package ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def walk():
    modules = find_modules(package_dirs())
    edges = import_edges(modules)
    return modules, edges


def test_the_walk_covers_every_installed_folder(walk):
    modules, _ = walk
    assert {"taso_egg.cli", "taso_egg.rules.syntax", "taso_egg.extract.extractor", "taso_egg.profiles",
            "taso_egg.cost.model"} <= set(modules)
    assert not any(".rules." in m and not m.startswith("taso_egg.rules.") for m in modules)


def test_no_module_imports_itself_in_a_circle(walk):
    _, edges = walk
    cycles = find_cycles(edges)
    assert not cycles, "modules import each other in a circle:\n" + \
        "\n".join(describe(c, edges) for c in cycles)


def test_no_folder_imports_itself_in_a_circle(walk):
    modules, edges = walk
    folders = folder_edges(edges, modules)
    cycles = find_cycles(folders)
    assert not cycles, "folders import each other in a circle:\n" + \
        "\n".join(describe(c, folders) for c in cycles)


# --- the checker itself --------------------------------------------------------------


def test_the_cycle_finder_finds_cycles():
    assert find_cycles({("a", "b"), ("b", "c")}) == []
    cycles = find_cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d")})
    assert sorted(map(tuple, cycles)) == [("a", "b", "c", "a"), ("d", "e", "d")]
    # a longer way round is not reported when a short one exists
    assert find_cycles({("a", "b"), ("b", "a"), ("b", "c"), ("c", "a")}) == [["a", "b", "a"]]


def test_the_walk_sees_function_level_relative_and_plugged_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "extra").mkdir()
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "def f():\n    from .sub.high import g\n",        # a hidden back edge
        "pkg/sub/__init__.py": "",
        "pkg/sub/high.py": "from .. import low\nfrom pkg.sub import other\n",
        "pkg/sub/other.py": "import pkg.extra.thing\n",
        "pkg/cli.py": "PLUGGED_COMMANDS = [('x', 'pkg.extra.thing', 'help')]\n",
        "extra/__init__.py": "",
        "extra/thing.py": "from ..cli import main\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    modules = find_modules({"pkg": pkg, "pkg.extra": tmp_path / "extra"})
    edges = import_edges(modules)
    assert {("pkg.low", "pkg.sub.high"), ("pkg.sub.high", "pkg.low"), ("pkg.sub.high", "pkg.sub.other"),
            ("pkg.sub.other", "pkg.extra.thing"), ("pkg.cli", "pkg.extra.thing"),
            ("pkg.extra.thing", "pkg.cli")} <= set(edges)
    assert sorted(map(tuple, find_cycles(edges))) == [("pkg.cli", "pkg.extra.thing", "pkg.cli"),
                                                      ("pkg.low", "pkg.sub.high", "pkg.low")]
    folders = folder_edges(edges, modules)
    assert ("pkg.low", "pkg.sub") in folders and ("pkg.sub", "pkg.low") in folders
    assert find_cycles(folders)
