"""Compare extractors on the Tensat e-graphs from extraction-gym.

    python -m taso_egg.extract.gym_bench [--time-limit 60] [--gap 0.1] [--instances bert vgg] [--extractors ilp]

Data: --data DIR, else $TASO_EGG_BENCH_DATA, else the three e-graphs shipped for the
tests (tests/data/extraction-gym-tensat: vgg_acyclic, resnet50_acyclic, resnet50). For
all six Tensat e-graphs (BERT too), pass --data with a copy of extraction-gym's
data/tensat folder. --chain N adds extraction-gym's "constructed" chain shape with N
classes (the deadline's test: greedy DAG does O(N^2) worklist steps on it).

Columns: "objective" is the extractor's own claim of its cost ("=" when it equals the
recomputed DAG cost, as it must), "lower bound" the proven bound and "bound from" what
proved it (HiGHS's dual bound, or the longest-path bound of bounds.py), "gap" the gap
that bound proves, "over" how far the run went past --time-limit. The ILP stops at
the proven gap --gap (percent; its default 0.1 unless given).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tqdm import tqdm

from ..cli_args import CommandParser, add_option_arguments, options_from_args
from ..errors import TasoEggError
from ..options import ExtractionOptions
from .egraph import EGraph, load_egraph
from .ilp import DEFAULT_GAP_TOLERANCE
from .registry import EXTRACTORS, extract
from .table import fmt_bound, fmt_gap, format_table

# Best published DAG costs (CPLEX, 900 s, as extraction-gym reports them). None for the _acyclic files.
BEST_KNOWN = {"bert": 0.705, "resnet50": 4.386, "vgg": 4.851}
_REPO = Path(__file__).resolve().parents[1]
# In the repository (an editable install); a wheel does not carry the tests' data.
SHIPPED_DATA = _REPO / "tests" / "data" / "extraction-gym-tensat"


def default_data_dir() -> Path:
    """$TASO_EGG_BENCH_DATA if set, else the shipped test e-graphs."""
    env = os.environ.get("TASO_EGG_BENCH_DATA")
    return Path(env) if env else SHIPPED_DATA


def build_parser() -> CommandParser:
    parser = CommandParser(prog="python -m taso_egg.extract.gym_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="folder of egraph-serialize JSON files (default: $TASO_EGG_BENCH_DATA, "
                             "else the repository's tests/data/extraction-gym-tensat)")
    add_option_arguments(parser, ExtractionOptions, flags={"time_limit": "--time-limit"}, only=("time_limit",))
    parser.add_argument("--instances", nargs="+", metavar="NAME", help="file names without .json (default: all)")
    parser.add_argument("--gap", type=float, default=None, metavar="PCT",
                        help=f"the ILP stops at this proven gap, in percent (default {100 * DEFAULT_GAP_TOLERANCE:g})")
    parser.add_argument("--extractors", nargs="+", choices=list(EXTRACTORS), default=list(EXTRACTORS))
    parser.add_argument("--chain", type=int, default=0, metavar="N", help="add a constructed chain of N classes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.time_limit = options_from_args(args, ExtractionOptions, only=("time_limit",)).time_limit
    data = args.data or default_data_dir()
    try:
        rows = _run(data, args)
    except TasoEggError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(["instance", "extractor", "DAG cost", "objective", "lower bound", "bound from", "seconds",
                        "over", "gap", "status", "best known", "ratio"], rows))
    return 0


def _run(data: Path, args) -> list[list[str]]:
    if not data.is_dir():
        raise TasoEggError(f"{data}: benchmark folder not found (use --data or TASO_EGG_BENCH_DATA)")
    names = args.instances or sorted(p.stem for p in data.glob("*.json"))
    loaded: dict[str, EGraph] = {}
    if args.chain:
        names.append(f"chain{args.chain}")
        loaded[names[-1]] = load_egraph(chain_egraph(args.chain))
    jobs = [(name, ex) for name in names for ex in args.extractors]
    rows = []
    for name, ex in tqdm(jobs, desc="extract", unit="run", file=sys.stderr):
        if name not in loaded:
            loaded[name] = load_egraph(data / f"{name}.json")
        gap = None if args.gap is None or ex != "ilp" else args.gap / 100
        r = extract(loaded[name], ex, time_limit=args.time_limit, gap_tolerance=gap)
        best = BEST_KNOWN.get(name)
        obj = "-" if r.objective is None else "=" if abs(r.objective - r.dag_cost) <= 1e-9 else f"{r.objective:.4f}"
        rows.append([
            name, ex, f"{r.dag_cost:.4f}", obj, fmt_bound(r.lower_bound), r.bound_source or "-",
            f"{r.seconds:.2f}", f"{r.seconds - args.time_limit:+.2f}",
            fmt_gap(r.gap), r.status,
            "-" if best is None else f"{best:.3f}", "-" if best is None else f"{r.dag_cost / best:.3f}",
        ])
    return rows


def chain_egraph(n: int) -> dict:
    """extraction-gym's "constructed" shape: class i has a node costing 1 that reads
    class i+1 and a leaf costing 2 (n - i); every class gets cheaper once per
    improvement of the class below it."""
    nodes = {}
    for i in range(n):
        nodes[f"{i}.0"] = {"op": "f", "cost": 1.0, "eclass": str(i), "children": [f"{i + 1}.0"] if i + 1 < n else []}
        nodes[f"{i}.1"] = {"op": "leaf", "cost": 2.0 * (n - i), "eclass": str(i), "children": []}
    return {"nodes": nodes, "root_eclasses": ["0"]}


if __name__ == "__main__":
    sys.exit(main())
