"""`taso-egg search`: TASO's backtracking search on an ONNX file or a zoo model.

Errors (TasoEggError) propagate to the CLI's single handler.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from taso_egg.cli_args import add_input_shape_argument, add_option_arguments, options_from_args, parse_input_shapes
from taso_egg.options import CostOptions, DecisionOptions, SearchOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX file, or a zoo model name (taso_egg.research.zoo.MODELS)")
    parser.add_argument("-o", "--output", required=True, type=Path, help="optimized ONNX file")
    add_option_arguments(parser, SearchOptions)
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help="stop after S seconds (default: none)")
    add_option_arguments(parser, CostOptions)
    add_input_shape_argument(parser, "fix a symbolic input dimension of an ONNX file (repeatable)")
    # the guard optimize applies: the result is written only if it measures faster
    add_option_arguments(parser, DecisionOptions, only=("measure",))


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from taso_egg.product.decide import keep_unless_faster
    from taso_egg.product.guard import format_ratio
    from taso_egg.errors import ExportError
    from taso_egg.disk.files import check_writable
    from taso_egg.onnx_io.counts import describe, format_table, operator_counts
    from taso_egg.onnx_io.exporter import export_onnx, save_atomically
    from taso_egg.research.zoo import load_model

    from .search import backtracking_search

    search = options_from_args(args, SearchOptions)
    profile = options_from_args(args, CostOptions).profile
    measure = options_from_args(args, DecisionOptions, only=("measure",)).measure
    check_writable(args.output, ExportError, inputs=[args.model])
    graph = load_model(args.model, parse_input_shapes(args.input_shape))
    with tqdm(total=search.budget, file=sys.stderr, unit="graph", desc="search") as bar:
        def progress(step):
            bar.set_postfix(best=f"{step.best_cost * 1e3:.4g} ms", queue=step.queue_size,
                            refresh=False)
            bar.update(1)

        result = backtracking_search(graph, budget=search.budget, alpha=search.alpha, time_limit=args.time_limit,
                                     progress=progress, profile=profile)
    best, measured, kept = result.graph, None, ""
    if measure and best is not graph:
        print(f"timing input and result in onnxruntime (paired interleaved rounds, at most {measure})",
              file=sys.stderr)
        best, measured, kept = keep_unless_faster(graph, best, measure)
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
