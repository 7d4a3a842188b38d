"""Run the hostile-input suite's cases (tests/test_hostile.py) and print its table:
case, exit code, the one error line, whether files stayed intact, and whether the
case held (the exit code it should have, one error line, no traceback).

    python scripts/hostile_table.py
"""

from __future__ import annotations

import importlib.util
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Capture:
    """What pytest's capsys gives run_case: stdout and stderr since the last read."""

    def __enter__(self):
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        return self

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self.saved

    def readouterr(self):
        out, err = sys.stdout.getvalue(), sys.stderr.getvalue()
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        return out, err


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location("test_hostile", ROOT / "tests" / "test_hostile.py")
    suite = importlib.util.module_from_spec(spec)
    sys.modules["test_hostile"] = suite  # dataclasses look their module up
    spec.loader.exec_module(suite)
    rows = []
    for case in suite.CASES:
        with tempfile.TemporaryDirectory() as folder, Capture() as capture:
            rows.append(suite.run_case(case, Path(folder), capture))
    print(f"| {'class':<11} | {'case':<48} | rc | {'files intact':<12} | held | the one line")
    print(f"|{'-' * 13}|{'-' * 50}|----|{'-' * 14}|------|{'-' * 12}")
    held = 0
    for row in rows:
        ok = (row.rc == row.case.rc and not row.traceback and row.intact
              and (row.lines == 1 and row.case.says in row.line if row.case.rc else row.case.says in row.err))
        held += ok
        line = row.line if row.case.rc else "(exit 0) " + (row.line or "")
        print(f"| {row.case.klass:<11} | {row.case.name:<48} | {row.rc:>2} | {'yes' if row.intact else 'NO':<12} | "
              f"{'yes' if ok else 'NO':<4} | {line[:160]}")
    tracebacks = sum(r.traceback for r in rows)
    touched = sum(not r.intact for r in rows)
    print(f"\n{len(rows)} cases: {held} held; {tracebacks} tracebacks; {touched} with files touched that "
          f"were not named")
    return 0 if held == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
