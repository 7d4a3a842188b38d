"""The design document stays a design (issue 32): docs/architecture.md at most 400
lines, with no session numbers or commit hashes (history goes to docs/history.md);
its module table lists every module on disk and no other; every file path the design
and the how-to name in backticks exists (history.md names files that once did). Reads
text only (well under a second)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
# What pyproject.toml maps into the package (test_layers reads the same mapping).
CODE_FOLDERS = ("taso_egg", "rules", "extract", "profiles")
# Paths the docs name that a run makes, or that do not exist yet (a gap says so).
NOT_YET = {"profiles/gpu-h200.json", "build/gpu-bundle/"}


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def documented_modules() -> list[str]:
    table = _section(ARCHITECTURE.read_text(), "Package layout")
    modules = []
    for line in table.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            modules += re.findall(r"`([^`]+\.py)`", first_cell)
    return modules


def modules_on_disk() -> set[str]:
    return {str(p.relative_to(ROOT)) for folder in CODE_FOLDERS for p in (ROOT / folder).rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def test_architecture_is_short_and_holds_no_history():
    text = ARCHITECTURE.read_text()
    lines = text.splitlines()
    assert len(lines) <= 400, f"docs/architecture.md has {len(lines)} lines (at most 400; history goes to history.md)"
    sessions = [n for n, line in enumerate(lines, 1) if re.search(r"\bsessions?\s+\d", line, re.I)]
    assert not sessions, f"session numbers on lines {sessions}"
    hashes = [(n, h) for n, line in enumerate(lines, 1)
              for h in re.findall(r"(?<![\w./-])[0-9a-f]{7,40}(?![\w])", line)
              if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"commit hashes (line, hash): {hashes}"


def test_the_module_table_lists_every_module_once():
    listed = documented_modules()
    repeated = sorted({m for m in listed if listed.count(m) > 1})
    assert not repeated, f"listed twice: {repeated}"
    listed = {m for m in listed if not m.endswith("__init__.py")}
    on_disk = modules_on_disk()
    assert not on_disk - listed, f"modules missing from architecture.md's table: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"architecture.md lists modules that do not exist: {sorted(listed - on_disk)}"


def _exists(name: str) -> bool:
    for base in (ROOT, ROOT / "taso_egg"):
        if any(ch in name for ch in "*?["):
            if any(base.glob(name)):
                return True
        elif (base / name).exists():
            return True
    return False


def test_every_path_the_design_and_the_howto_name_exists():
    missing = []
    for doc in (ARCHITECTURE, DOCS / "howto.md"):
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for token in re.findall(r"`([^`\s]+)`", line):
                path = token.split("::")[0].rstrip(",.")
                if "/" not in path or path.startswith(("http", "$", "~", ".")) or path in NOT_YET:
                    continue
                if re.search(r"(^|/)[A-Z]+\.\w+$", path):  # a placeholder: extract/NAME.py
                    continue
                if re.fullmatch(r"[\w./*-]+\.(py|rules|json|sh|md|toml|ipynb)|[\w./-]+/", path) and not _exists(path):
                    missing.append(f"{doc.name}:{n}: {path}")
    assert not missing, "paths named in docs/ that do not exist:\n" + "\n".join(missing)
