"""Do the time limits hold on a loaded machine? Starts ``--busy`` busy loops (one
process each), then runs ``taso-egg optimize --time-limit S`` and ``taso-egg extract
--time-limit S`` ``--runs`` times each and prints, per run, the seconds the phase took
(saturation, as optimize reports it; the extractor, as extract reports it) against the
limit. The busy loops are stopped at the end.

    python scripts/limits_under_load.py [--runs 10] [--busy 2]
        [--model M.onnx --time-limit 3] [--egraph E.json --extract-time-limit 5]

The default model is 30 MatMuls of one input, each through a Relu, summed (its second
iteration alone takes seconds), written to a temporary folder; the default e-graph is
extraction-gym's Tensat ResNet-50 shipped in tests/data.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wide_model(path: Path, n: int = 30) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((0.1 * rng.standard_normal((64, 64))).astype(np.float32), f"w{i}")
               for i in range(n)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]) for i in range(n)]
    nodes += [helper.make_node("Relu", [f"m{i}"], [f"r{i}"]) for i in range(n)]
    total = "r0"
    for i in range(1, n):
        nodes.append(helper.make_node("Add", [total, f"r{i}"], [f"s{i}"]))
        total = f"s{i}"
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
                              [helper.make_tensor_value_info(total, TensorProto.FLOAT, [16, 64])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _taso_egg(*args) -> tuple[str, float]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "taso_egg.cli", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"taso-egg {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout, time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--busy", type=int, default=2, help="busy loops beside the runs")
    p.add_argument("--model", help="ONNX model for optimize (default: 30 shared-input MatMuls)")
    p.add_argument("--time-limit", type=float, default=3.0)
    p.add_argument("--egraph", default=str(ROOT / "tests" / "data" / "extraction-gym-tensat" / "resnet50.json"))
    p.add_argument("--extract-time-limit", type=float, default=5.0)
    args = p.parse_args(argv)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = args.model or os.path.join(tmp, "wide.onnx")
            if not args.model:
                wide_model(Path(model))
            for i in range(args.runs):
                out, wall = _taso_egg("optimize", model, "-o", os.path.join(tmp, "out.onnx"), "--measure", "0",
                                      "--extractor", "greedy-dag", "--time-limit", f"{args.time_limit:g}")
                seconds = float(re.search(r"time: saturation ([0-9.]+) s", out).group(1))
                stopped = re.search(r"stopped: (.*)", out).group(1)
                rows.append(("optimize --time-limit", args.time_limit, seconds, wall, stopped[:70]))
            for i in range(args.runs):
                out, wall = _taso_egg("extract", args.egraph, "--extractor", "ilp",
                                      "--time-limit", f"{args.extract_time_limit:g}")
                line = next(line for line in out.splitlines() if " ilp " in line)
                seconds = float(line.split()[3])
                rows.append(("extract --time-limit", args.extract_time_limit, seconds, wall, line.split()[-1]))
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(f"{args.busy} busy loops beside every run; {os.cpu_count()} CPUs")
    print(f"{'command':<24} {'limit s':>7} {'phase s':>8} {'over s':>7} {'wall s':>7}  stopped")
    for what, limit, seconds, wall, stopped in rows:
        print(f"{what:<24} {limit:>7g} {seconds:>8.2f} {seconds - limit:>+7.2f} {wall:>7.2f}  {stopped}")
    worst = {w: max(s - lim for what, lim, s, _, _ in rows if what == w) for w in {r[0] for r in rows}}
    print("worst overrun: " + ", ".join(f"{w} {v:+.2f} s" for w, v in sorted(worst.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
