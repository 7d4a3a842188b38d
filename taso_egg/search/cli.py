"""`taso-egg search`: TASO's backtracking search on an ONNX file or a zoo model.

Errors (TasoEggError) propagate to the CLI's single handler.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX file, or a zoo model name (taso_egg.zoo.MODELS)")
    parser.add_argument("-o", "--output", required=True, type=Path, help="optimized ONNX file")
    parser.add_argument("--budget", type=int, default=1000, metavar="N",
                        help="graphs to pop from the queue (default 1000)")
    parser.add_argument("--alpha", type=float, default=1.05, metavar="A",
                        help="queue graphs cheaper than A x the best cost (default 1.05; 1 = greedy)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help="stop after S seconds (default: none)")
    parser.add_argument("--profile", default=None, metavar="NAME",
                        help="cost model: a shipped profile's name, a profile file, or 'analytic' "
                             "(default: the same as `taso-egg optimize`)")
    parser.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                        help="fix a symbolic input dimension of an ONNX file (repeatable)")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from taso_egg.cli import parse_input_shapes
    from taso_egg.cost import DEFAULT_PROFILE
    from taso_egg.onnx_io.exporter import export_onnx
    from taso_egg.zoo import load_model

    from .search import backtracking_search

    graph = load_model(args.model, parse_input_shapes(args.input_shape))
    with tqdm(total=args.budget, file=sys.stderr, unit="graph", desc="search") as bar:
        def progress(step):
            bar.set_postfix(best=f"{step.best_cost * 1e3:.4g} ms", queue=step.queue_size,
                            refresh=False)
            bar.update(1)

        result = backtracking_search(graph, budget=args.budget, alpha=args.alpha,
                                     time_limit=args.time_limit, progress=progress,
                                     profile=args.profile or DEFAULT_PROFILE)
    export_onnx(result.graph, args.output)
    before, after = graph.op_counts(), result.graph.op_counts()
    print(f"{'operator':<16}{'before':>8}{'after':>8}")
    for op in sorted(set(before) | set(after)):
        print(f"{op:<16}{before.get(op, 0):>8}{after.get(op, 0):>8}")
    print(f"{'cost':<16}{result.cost_before * 1e3:>8.4g}{result.cost_after * 1e3:>8.4g}  ms "
          f"({result.cost_model}); predicted speedup {result.speedup:.3f}x")
    rejected = ", ".join(f"{k} {v}" for k, v in result.rejected.items())
    print(f"search: {result.graphs_explored} graphs explored, {result.graphs_generated} generated, "
          f"{result.graphs_queued} queued (rejected: {rejected}); stopped: {result.stop_reason}; "
          f"{result.seconds:.2f} s")
    if result.check_error is None:
        print("check: no rewrite lowered the cost; the input graph is written unchanged")
    else:
        print(f"check: outputs equal the original's within {result.check_error:.2g} relative")
    print(f"wrote {args.output}")
    return 0
