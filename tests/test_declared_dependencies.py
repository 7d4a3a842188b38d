"""Every third-party module the package imports is declared in ``pyproject.toml``.

The walk reads the source of every module the package installs (the folders
``[tool.setuptools] package-dir`` maps into it: ``taso_egg/``, ``rules/``,
``extract/``) with ``ast`` and collects every absolute import, at module level and
inside functions (plus ``importlib.import_module("name")`` with a literal name). The
standard library (``sys.stdlib_module_names``) and the package itself are dropped;
imports under ``if TYPE_CHECKING:`` never run and are dropped too. Each import name is
mapped to the distribution that provides it with
``importlib.metadata.packages_distributions()`` (``z3`` -> ``z3-solver``,
``google.protobuf`` -> ``protobuf``), or, for one not installed here, with
``FALLBACK`` (``cupy`` -> any ``cupy-*`` distribution).

An import passes when its distribution is in ``[project] dependencies``. One whose
distribution is only in an optional extra (``[project.optional-dependencies]``) passes
only where the code handles its absence: the import sits in a ``try`` whose ``except``
catches ``ImportError``, so that it runs only where its feature runs and a user
without the extra meets a message rather than a traceback. An unguarded import of an
extra's module, at module level or inside a function, fails: being inside a function
is not enough (``taso_egg/onnx_io/dim_relations.py`` imported sympy, then only in the
``peers`` extra, inside functions that run for every model with a symbolic dim).
``ALREADY_IMPORTED`` lists the few unguarded ones that run only after a guarded import
of the same module succeeded.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

from test_layers import ROOT, package_dirs

# Import name (or dotted prefix) -> the distribution to declare for it, then other
# name patterns (PEP 503 normalized, fnmatch) that provide it too: for the modules
# not installed here (the optional ones, absent from a plain install), those whose
# distribution is named otherwise, and those that several distributions provide.
FALLBACK = {
    "cupy": ("cupy-cuda12x", "cupy*"),  # cupy-cuda11x, cupy-rocm-*: whichever fits the GPU
    "z3": ("z3-solver",),
    "yaml": ("pyyaml",),
    "google.protobuf": ("protobuf",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-*"),  # onnxruntime-gpu: the same module
    "numpy": ("numpy",),
    "sympy": ("sympy",),
    "highspy": ("highspy",),
    "egglog": ("egglog",),
    "tqdm": ("tqdm",),
    "threadpoolctl": ("threadpoolctl",),
    "matplotlib": ("matplotlib",),
    "ray": ("ray",),
    "onnxsim": ("onnxsim",),
    "onnxslim": ("onnxslim",),
    "torch": ("torch",),
}

# (import name, the function it sits in) -> why it may import an extra's module
# without a guard. Each entry must still match an import (a stale one fails).
ALREADY_IMPORTED = {
    ("ray", "fetch"): "fetch() reads a Ray object ref, which exists only after "
                      "ray_workers() imported ray through its guarded _import_ray()",
}

IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def normalize(name: str) -> str:
    """PEP 503: runs of ``-``, ``_``, ``.`` as one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- pyproject.toml ------------------------------------------------------------------


def requirement_name(requirement: str) -> str:
    """``"z3-solver[foo]>=4.12; python_version>'3'"`` -> ``"z3-solver"`` (normalized)."""
    match = re.match(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)", requirement)
    assert match, f"cannot read a distribution name from requirement {requirement!r}"
    return normalize(match.group(1))


def declared(root: Path = ROOT) -> tuple[set[str], dict[str, set[str]]]:
    """(``[project] dependencies``, extra -> its distributions), names normalized."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    required = {requirement_name(r) for r in project.get("dependencies", [])}
    extras = {extra: {requirement_name(r) for r in reqs}
              for extra, reqs in project.get("optional-dependencies", {}).items()}
    return required, extras


# --- the walk ------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    name: str                # the dotted module imported (``google.protobuf.message``)
    where: str               # ``file:line``
    module_level: bool       # runs when the module is imported (not inside a def/lambda)
    guarded: bool            # inside a ``try`` that catches ImportError
    function: str | None     # the innermost def it sits in

    @property
    def top(self) -> str:
        return self.name.split(".")[0]


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(t, (ast.Name, ast.Attribute)) and
               (t.id if isinstance(t, ast.Name) else t.attr) in IMPORT_ERRORS for t in types):
            return True
    return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_in(tree: ast.AST, where) -> list[Import]:
    out: list[Import] = []

    def visit(node, function, guarded):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # the body runs when called: a try around the def guards nothing in it
            name = getattr(node, "name", function or "<lambda>")
            for child in ast.iter_child_nodes(node):
                visit(child, name, False)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the body never runs
                visit(child, function, guarded)
            return
        if isinstance(node, ast.Try | getattr(ast, "TryStar", ast.Try)):
            inner = guarded or _catches_import_error(node)
            for child in node.body:
                visit(child, function, inner)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, function, guarded)
            return
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and \
                getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__") \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and not node.args[0].value.startswith("."):
            names = [node.args[0].value]
        for name in names:
            out.append(Import(name, f"{where}:{node.lineno}", function is None, guarded, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function, guarded)

    visit(tree, None, False)
    return out


def walk_imports(root: Path = ROOT) -> list[Import]:
    """Every third-party import in the folders ``package-dir`` maps into the package."""
    dirs = package_dirs(root)
    own = {name.split(".")[0] for name in dirs}
    out = []
    for folder in sorted(set(dirs.values())):
        for path in sorted(folder.rglob("*.py")):
            where = path.relative_to(root)
            out += [i for i in _imports_in(ast.parse(path.read_text(), str(path)), where)
                    if i.top not in sys.stdlib_module_names and i.top not in own]
    return out


# --- import name -> distribution -----------------------------------------------------


@cache
def _installed() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions(name: str) -> list[str] | None:
    """The distribution names (patterns) that may provide module ``name``, the one to
    declare first: the installed ones that do, and ``FALLBACK``'s; None when neither
    knows it."""
    parts = name.split(".")
    found = _installed().get(parts[0], [])
    if len(found) > 1 and len(parts) > 1:
        # a namespace package (google): the distributions that ship the submodule
        ships = [d for d in found
                 if any(f.parts[:2] == tuple(parts[:2]) for f in metadata.files(d) or [])]
        found = ships or found
    out = [normalize(d) for d in found]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FALLBACK:
            fallback = FALLBACK[".".join(parts[:n])]
            out = [fallback[0], *(p for p in [*out, *fallback[1:]] if p != fallback[0])]
            break
    return out or None


def _matches(patterns: list[str], names: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


# --- the check -----------------------------------------------------------------------


def problems(imports: list[Import], required: set[str], extras: dict[str, set[str]],
             exempt=ALREADY_IMPORTED, used: set | None = None) -> list[str]:
    """One line per import that a plain ``pip install`` (no extras) would not satisfy."""
    out = []
    for i in imports:
        patterns = distributions(i.name)
        if patterns is None:
            out.append(f"{i.name} imported at {i.where}: no installed distribution provides it and "
                       f"FALLBACK in tests/test_declared_dependencies.py does not name one; add it "
                       f"there and declare the distribution in pyproject.toml's [project] dependencies")
            continue
        dist = patterns[0]
        if _matches(patterns, required):
            continue
        in_extras = sorted(e for e, names in extras.items() if _matches(patterns, names))
        if not in_extras:
            out.append(f"{i.name} imported at {i.where} is not in [project] dependencies: "
                       f"add {dist} to [project] dependencies in pyproject.toml")
            continue
        if i.guarded:
            continue
        if (i.top, i.function) in exempt:
            if used is not None:
                used.add((i.top, i.function))
            continue
        extra = ", ".join(in_extras)
        where = "at module level" if i.module_level else f"inside {i.function}() without a guard"
        out.append(f"{i.name} imported at {i.where} is not in [project] dependencies ({dist} is only "
                   f"in the optional extra [{extra}]) and is imported {where}: add {dist} to "
                   f"[project] dependencies if the package needs it wherever it runs, or import it "
                   f"only where its feature runs, in a try/except ImportError that says one line "
                   f"(pip install 'taso-egg[{in_extras[0]}]')")
    return out


@pytest.fixture(scope="module")
def imports():
    return walk_imports()


def test_every_third_party_import_is_declared(imports):
    required, extras = declared()
    used: set = set()
    found = problems(imports, required, extras, used=used)
    if found:
        pytest.fail("imports that `pip install taso-egg` (no extras) does not satisfy:\n  "
                    + "\n  ".join(found), pytrace=False)
    stale = sorted(set(ALREADY_IMPORTED) - used)
    assert not stale, f"ALREADY_IMPORTED entries that match no unguarded import any more: {stale}; " \
        "drop them from tests/test_declared_dependencies.py"


def test_the_walk_sees_the_package_imports(imports):
    tops = {i.top for i in imports}
    assert {"onnx", "numpy", "onnxruntime", "egglog", "z3"} <= tops, sorted(tops)
    assert len(imports) > 50, len(imports)
    # both kinds of import are seen: at module level and inside functions
    assert any(i.module_level for i in imports) and any(not i.module_level for i in imports)


# --- the checker itself --------------------------------------------------------------


def _fake_project(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "fake"\nversion = "0"\n'
        'dependencies = ["NumPy>=1.26", "z3_solver"]\n'
        '[project.optional-dependencies]\n'
        'peers = ["sympy>=1.12 ; python_version >= \'3.8\'"]\n'
        'gpu = ["cupy-cuda12x>=13"]\n'
        '[tool.setuptools]\npackage-dir = { "fakepkg" = "fakepkg", "fakepkg.more" = "more" }\n')
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _check(root: Path) -> list[str]:
    required, extras = declared(root)
    return problems(walk_imports(root), required, extras, exempt={})


def test_the_checker_passes_declared_and_guarded_imports(tmp_path):
    root = _fake_project(tmp_path, {
        "fakepkg/__init__.py": "import os\nimport numpy as np\nfrom fakepkg import more\n",
        "fakepkg/core.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import onnx\n"
                            "try:\n    import sympy\nexcept ImportError:\n    sympy = None\n"
                            "def f():\n    from z3 import Solver\n"
                            "def g():\n    try:\n        import cupy\n"
                            "    except (ImportError, OSError):\n        raise SystemExit('no cupy')\n"),
        "more/__init__.py": "from .core import f\n",
    })
    assert _check(root) == []
    tops = {i.top for i in walk_imports(root)}
    assert tops == {"numpy", "sympy", "z3", "cupy"}  # os, fakepkg, relative, TYPE_CHECKING dropped


def test_the_checker_catches_undeclared_and_unguarded_imports(tmp_path):
    root = _fake_project(tmp_path, {
        "fakepkg/__init__.py": "",
        "fakepkg/a.py": "import numpy\nimport onnx.helper\n",  # onnx: declared nowhere
        "more/b.py": "def f():\n    import sympy\n",  # an extra's module, unguarded in a function
        "more/c.py": "import sympy\n",  # an extra's module at module level
        "more/d.py": ("try:\n    def h():\n        import cupy\n"  # a try around a def guards nothing
                      "except ImportError:\n    pass\n"
                      "def k():\n    import importlib\n    importlib.import_module('not_a_module_anywhere_xyz')\n"),
    })
    found = _check(root)
    assert len(found) == 5, found
    assert found[0].startswith("onnx.helper imported at fakepkg/a.py:2 is not in [project] dependencies: "
                               "add onnx to [project] dependencies")
    assert found[1].startswith("sympy imported at more/b.py:2 is not in [project] dependencies")
    assert "only in the optional extra [peers]" in found[1] and "inside f() without a guard" in found[1]
    assert found[2].startswith("sympy imported at more/c.py:1 ") and "at module level" in found[2]
    assert found[3].startswith("cupy imported at more/d.py:3 ") and "[gpu]" in found[3]
    # a module that nothing here knows (imported by name) is caught too
    assert found[4].startswith("not_a_module_anywhere_xyz imported at more/d.py:8: no installed distribution")
