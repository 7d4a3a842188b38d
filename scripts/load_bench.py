"""Per-command start-up cost: wall and CPU seconds of commands that load the rule
corpus, with the corpus cache cold (an empty cache folder, so the run parses and
writes it), warm (the entries present), and off (TASO_EGG_NO_CACHE=1), and optionally
for another checkout of the package (``--before DIR``: run with ``PYTHONPATH=DIR``,
which needs the links ``DIR/taso_egg/{rules,extract,profiles}`` to the mapped folders).
Runs are interleaved round by round and the table gives medians:

    .venv/bin/python scripts/load_bench.py --before /tmp/old --rounds 3
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


# The bare load, printing its own seconds inside the process (import and exit apart).
_LOAD = ("import time; from taso_egg.rules.corpus import load_corpus; t = time.perf_counter(); "
         "load_corpus(); print(time.perf_counter() - t)")
INSIDE = "  of which load_corpus() in the process"


def commands(work: Path) -> dict[str, list[str]]:
    model = str(work / "squeezenet-small.onnx")
    cli = [str(VENV_BIN / "taso-egg")]
    return {
        "load_corpus()": [sys.executable, "-c", _LOAD],
        "optimize squeezenet-small --measure 0": cli + ["optimize", model, "-o", str(work / "o.onnx"),
                                                        "--measure", "0"],
        "search squeezenet-small --budget 20 --measure 0": cli + ["search", model, "-o", str(work / "s.onnx"),
                                                                  "--budget", "20", "--measure", "0"],
    }


def timed(cmd, env) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", help="another checkout, run with PYTHONPATH set to it")
    p.add_argument("--after", help="the checkout to measure (default: the installed package)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="load-bench-"))
    try:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TASO_EGG_")}
        base.pop("PYTHONPATH", None)
        after = dict(base, PYTHONPATH=args.after) if args.after else dict(base)
        subprocess.run([str(VENV_BIN / "taso-egg"), "zoo", "squeezenet-small", "-o",
                        str(work / "squeezenet-small.onnx")], env=after, check=True,
                       stdout=subprocess.DEVNULL)
        warm = work / "warm-cache"
        variants = {}
        if args.before:
            variants["before"] = lambda: dict(base, PYTHONPATH=args.before)
        variants["cache off"] = lambda: dict(after, TASO_EGG_NO_CACHE="1")
        variants["cache cold"] = lambda: dict(after, TASO_EGG_CACHE_DIR=tempfile.mkdtemp(dir=work))
        variants["cache warm"] = lambda: dict(after, TASO_EGG_CACHE_DIR=str(warm))
        cmds = commands(work)
        subprocess.run(cmds["load_corpus()"], env=variants["cache warm"](), check=True)  # fill it
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            for name, cmd in cmds.items():
                for variant, env in variants.items():
                    wall, cpu, out = timed(cmd, env())
                    results.setdefault((name, variant), []).append((wall, cpu))
                    if name == "load_corpus()":
                        results.setdefault((INSIDE, variant), []).append((float(out), float("nan")))
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
        width = max(map(len, [*cmds, INSIDE])) + 2
        print(f"{'command':<{width}}" + "".join(f"{v:>22}" for v in variants))
        print(f"{'':<{width}}" + "".join(f"{'wall s / CPU s':>22}" for _ in variants))
        for name in [*cmds][:1] + [INSIDE] + [*cmds][1:]:
            cells = []
            for variant in variants:
                runs = results[name, variant]
                cpu = statistics.median(c for _, c in runs)
                cells.append(f"{statistics.median(w for w, _ in runs):>13.3f} / "
                             + (f"{cpu:<6.2f}" if cpu == cpu else " " * 6))
            print(f"{name:<{width}}" + "".join(f"{c:>22}" for c in cells))
        print(f"(medians of {args.rounds} interleaved rounds)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
