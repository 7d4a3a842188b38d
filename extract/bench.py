"""Compare extractors on the Tensat e-graphs from extraction-gym.

    python -m taso_egg.extract.bench [--time-limit 60] [--instances bert vgg] [--extractors ilp]

Data: --data DIR, else $TASO_EGG_BENCH_DATA, else the three e-graphs shipped for the
tests (tests/data/extraction-gym-tensat: vgg_acyclic, resnet50_acyclic, resnet50). For
all six Tensat e-graphs (BERT too), pass --data with a copy of extraction-gym's
data/tensat folder.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tqdm import tqdm

from ..errors import TasoEggError
from .egraph import load_egraph
from .registry import EXTRACTORS, extract
from .table import fmt_gap, format_table

# Best published DAG costs (CPLEX, 900 s, as extraction-gym reports them). None for the _acyclic files.
BEST_KNOWN = {"bert": 0.705, "resnet50": 4.386, "vgg": 4.851}
_REPO = Path(__file__).resolve().parents[1]
# In the repository (an editable install); a wheel does not carry the tests' data.
SHIPPED_DATA = _REPO / "tests" / "data" / "extraction-gym-tensat"


def default_data_dir() -> Path:
    """$TASO_EGG_BENCH_DATA if set, else the shipped test e-graphs."""
    env = os.environ.get("TASO_EGG_BENCH_DATA")
    return Path(env) if env else SHIPPED_DATA


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taso_egg.extract.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="folder of egraph-serialize JSON files (default: $TASO_EGG_BENCH_DATA, "
                             "else the repository's tests/data/extraction-gym-tensat)")
    parser.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="per ILP run (default 60)")
    parser.add_argument("--instances", nargs="+", metavar="NAME", help="file names without .json (default: all)")
    parser.add_argument("--extractors", nargs="+", choices=list(EXTRACTORS), default=list(EXTRACTORS))
    args = parser.parse_args(argv)
    data = args.data or default_data_dir()
    try:
        rows = _run(data, args)
    except TasoEggError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(["instance", "extractor", "DAG cost", "seconds", "gap", "status", "best known", "ratio"], rows))
    return 0


def _run(data: Path, args) -> list[list[str]]:
    if not data.is_dir():
        raise TasoEggError(f"{data}: benchmark folder not found (use --data or TASO_EGG_BENCH_DATA)")
    names = args.instances or sorted(p.stem for p in data.glob("*.json"))
    jobs = [(name, ex) for name in names for ex in args.extractors]
    rows, loaded = [], {}
    for name, ex in tqdm(jobs, desc="extract", unit="run", file=sys.stderr):
        if name not in loaded:
            loaded[name] = load_egraph(data / f"{name}.json")
        r = extract(loaded[name], ex, time_limit=args.time_limit)
        best = BEST_KNOWN.get(name)
        rows.append([
            name, ex, f"{r.dag_cost:.4f}", f"{r.seconds:.2f}", fmt_gap(r.gap), r.status,
            "-" if best is None else f"{best:.3f}", "-" if best is None else f"{r.dag_cost / best:.3f}",
        ])
    return rows


if __name__ == "__main__":
    sys.exit(main())
