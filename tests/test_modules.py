"""One job per module, as far as a test can see it: no module of the package over
MAX_LINES lines, and no two with one name (a name should say the module's job, and
``cli.py`` in five folders says none)."""

from __future__ import annotations

from collections import defaultdict

from test_layers import ROOT, find_modules, package_dirs

MAX_LINES = 600


def _sources():
    return [path for path, _ in find_modules(package_dirs()).values()]


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along a seam): {long}"


def test_no_two_modules_share_a_name():
    by_name = defaultdict(list)
    for p in _sources():
        if p.name != "__init__.py":
            by_name[p.name].append(str(p.relative_to(ROOT)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules that share a name (rename each to say its job): {shared}"
