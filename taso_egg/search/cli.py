"""`taso-egg search`: TASO's backtracking search on an ONNX file or a zoo model.

Errors (TasoEggError) propagate to the CLI's single handler.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from taso_egg.cli_args import add_input_shape_argument, parse_input_shapes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from taso_egg.decide import MAX_MEASURE, MAX_ROUNDS, MIN_ROUNDS

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
    add_input_shape_argument(parser, "fix a symbolic input dimension of an ONNX file (repeatable)")
    parser.add_argument("--measure", type=int, default=MAX_ROUNDS, metavar="N",
                        help=f"time input and result in onnxruntime with `optimize`'s guard (paired "
                             f"interleaved rounds until the answer is clear, N at most: {MIN_ROUNDS} "
                             f"to {MAX_MEASURE}; default {MAX_ROUNDS}) and write the input unless the "
                             f"result is confirmed faster (0: skip)")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from taso_egg.decide import check_measure, format_ratio, keep_unless_faster
    from taso_egg.cost import DEFAULT_PROFILE
    from taso_egg.errors import ExportError
    from taso_egg.files import check_writable
    from taso_egg.onnx_io.counts import describe, format_table, operator_counts
    from taso_egg.onnx_io.exporter import export_onnx, save_atomically
    from taso_egg.zoo import load_model

    from .search import backtracking_search

    check_measure(args.measure)
    check_writable(args.output, ExportError)
    graph = load_model(args.model, parse_input_shapes(args.input_shape))
    with tqdm(total=args.budget, file=sys.stderr, unit="graph", desc="search") as bar:
        def progress(step):
            bar.set_postfix(best=f"{step.best_cost * 1e3:.4g} ms", queue=step.queue_size,
                            refresh=False)
            bar.update(1)

        result = backtracking_search(graph, budget=args.budget, alpha=args.alpha,
                                     time_limit=args.time_limit, progress=progress,
                                     profile=args.profile or DEFAULT_PROFILE)
    best, measured, kept = result.graph, None, ""
    if args.measure and best is not graph:
        print(f"timing input and result in onnxruntime (paired interleaved rounds, at most "
              f"{args.measure})", file=sys.stderr)
        best, measured, kept = keep_unless_faster(graph, best, args.measure)
    model = export_onnx(best)
    print(format_table(operator_counts(export_onnx(graph)), operator_counts(model)))
    print(f"{'cost':<16}{result.cost_before * 1e3:>8.4g}{result.cost_after * 1e3:>8.4g}  ms "
          f"({result.cost_model}); predicted speedup {result.speedup:.3f}x")
    if measured:
        ms, c = measured.medians, measured.comparisons["optimized"]
        print(f"measured in onnxruntime (ORT_ENABLE_ALL, 1 thread, CPU time, {measured.rounds} paired "
              f"rounds): input {ms['original']:.3f} ms, result {ms['optimized']:.3f} ms (medians); "
              f"result {format_ratio(c)} ({100 * measured.confidence:.0f} % interval): {c.decision}")
    rejected = ", ".join(f"{k} {v}" for k, v in result.rejected.items())
    print(f"search: {result.graphs_explored} graphs explored, {result.graphs_generated} generated, "
          f"{result.graphs_queued} queued (rejected: {rejected}); stopped: {result.stop_reason}; "
          f"{result.seconds:.2f} s")
    if result.check_error is None:
        print("check: no rewrite lowered the cost; the input graph is written unchanged")
    else:
        print(f"check: outputs equal the original's within {result.check_error:.2g} relative")
    if kept:
        print(f"note: writing the input graph instead: {kept}")
    save_atomically(model, args.output)
    print(f"wrote {args.output}: {describe(model)}")
    return 0
