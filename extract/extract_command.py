"""`taso-egg extract`: run one extractor on a serialized e-graph file.

Errors (TasoEggError) propagate to the CLI's single handler.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli_args import add_option_arguments, options_from_args
from ..errors import ExtractionError, LimitError
from ..disk.files import check_writable, write_atomically
from .egraph import load_egraph
from .ilp import DEFAULT_GAP_TOLERANCE
from ..options import ExtractionOptions
from .registry import extract
from .table import fmt_bound, fmt_gap, format_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("egraph", type=Path, help="egraph-serialize JSON file")
    # optimize's extractor and time limit; here --time-limit (nothing else is timed)
    add_option_arguments(parser, ExtractionOptions, flags={"time_limit": "--time-limit"})
    parser.add_argument(
        "--gap", type=float, default=None, metavar="PCT",
        help=f"ILP only: stop once the proven gap is at most PCT percent "
             f"(default {100 * DEFAULT_GAP_TOLERANCE:g}; 0 proves optimality or runs to the time limit)",
    )
    parser.add_argument("--roots", nargs="+", metavar="ECLASS", help="root e-class ids (default: the file's)")
    parser.add_argument("-o", "--output", type=Path, help="write the choice as JSON (class id -> node id)")
    parser.add_argument("--verbose", action="store_true", help="show the solver's log")


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        check_writable(args.output, ExtractionError, inputs=[args.egraph])
    options = options_from_args(args, ExtractionOptions)
    gap = None if args.gap is None else args.gap / 100
    if gap is not None and options.extractor != "ilp":
        raise ExtractionError(f"--gap applies to the ilp extractor only, not {options.extractor!r}")
    if gap is not None and not 0 <= gap < 1:
        raise LimitError(f"--gap must be a percentage in [0, 100), got {args.gap:g}")
    egraph = load_egraph(args.egraph)
    negative = int((egraph.node_cost < 0).sum())
    if negative:
        print(f"note: {negative} e-node(s) have negative costs: the ilp extractor is exact for them, "
              f"tree and greedy-dag are heuristics on shifted costs", file=sys.stderr)
    result = extract(
        egraph, options.extractor, roots=args.roots, time_limit=options.time_limit, verbose=args.verbose,
        gap_tolerance=gap,
    )
    print(format_table(
        ["e-graph", "extractor", "DAG cost", "seconds", "lower bound", "gap", "status"],
        [[args.egraph.name, result.extractor, f"{result.dag_cost:.6f}", f"{result.seconds:.2f}",
          fmt_bound(result.lower_bound), fmt_gap(result.gap), result.status]],
    ))
    if result.gap_tolerance is not None:
        print(f"gap tolerance {fmt_gap(result.gap_tolerance)} (--gap); "
              f"lower bound: {result.bound_source or 'none proven'}")
    if args.output is not None:
        payload = {
            "extractor": result.extractor,
            "dag_cost": result.dag_cost,
            "status": result.status,
            "lower_bound": result.lower_bound,
            "bound_source": result.bound_source,
            "gap_tolerance": result.gap_tolerance,
            "choices": egraph.named_choice(result.choice),
        }
        text = json.dumps(payload, indent=1) + "\n"
        write_atomically(args.output, lambda tmp: Path(tmp).write_text(text), ExtractionError)
    return 0
