"""Equality saturation against TASO's backtracking search, on the same graphs, with
the same rules and the same cost model, measured in the same run.

For each model: the original cost; the search's cost, seconds and graphs explored;
saturation with greedy and with ILP extraction: cost, seconds (saturation plus
extraction), e-graph size; and each result's measured speedup on this CPU, in our
executor and in onnxruntime (exported ONNX, ORT_ENABLE_ALL, one thread), timed
interleaved with the original. Every result is checked numerically against the
original before it is measured; optimisation seconds exclude that check for both
methods alike.
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cli_args import add_limit_arguments, add_option_arguments, limits_from_args, options_from_args
from ..cost import CostModel, graph_cost
from ..egraph.saturate import saturate
from ..errors import TasoEggError
from ..disk.files import check_writable, write_atomically
from ..graph import Graph
from ..onnx_io.counts import operator_counts
from ..onnx_io.exporter import export_onnx
from ..options import CostOptions, ExtractionOptions, Limits, SearchOptions
from ..product.timing import measure

METHODS = ("backtracking", "eqsat-greedy", "eqsat-ilp")


@dataclass
class MethodRun:
    method: str
    cost: float
    seconds: float            # optimisation time, numeric check excluded
    explored: int             # graphs popped (search) or e-nodes (saturation)
    stop_reason: str
    check_error: float = 0.0
    graph: Graph | None = field(default=None, repr=False)


@dataclass
class ModelComparison:
    model: str
    nodes: int                # operators of the exported input model (onnx_io.counts)
    original_cost: float
    runs: dict[str, MethodRun]
    measured_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # runtime -> graph -> ms

    def speedup(self, runtime: str, method: str) -> float:
        ms = self.measured_ms.get(runtime, {})
        return ms["original"] / ms[method] if method in ms and ms.get(method) else math.nan

    def row(self) -> dict:
        """One flat record (the CSV row)."""
        out = {"model": self.model, "nodes": self.nodes, "original_cost_ms": self.original_cost * 1e3}
        for m, r in self.runs.items():
            out[f"{m}_cost_ms"] = r.cost * 1e3
            out[f"{m}_seconds"] = r.seconds
            out[f"{m}_{'graphs_explored' if m == 'backtracking' else 'enodes'}"] = r.explored
            out[f"{m}_stop"] = r.stop_reason
        for runtime, times in self.measured_ms.items():
            for g, ms in times.items():
                out[f"{runtime}_{g}_ms"] = ms
            for m in self.runs:
                out[f"{runtime}_{m}_speedup"] = self.speedup(runtime, m)
        return out


def compare_model(name: str, graph: Graph, cost_model: CostModel, rules=None,
                  budget: int = SearchOptions.budget, alpha: float = SearchOptions.alpha,
                  search_seconds: float | None = None, limits: Limits | None = None,
                  ilp_seconds: float = ExtractionOptions.time_limit,
                  measure_repeats: int = 3, runtimes=("ort", "executor"),
                  progress=None) -> ModelComparison:
    """Run both methods on ``graph`` and measure their results (``measure_repeats`` = 0
    skips the measurements)."""
    from ..product.optimize_graph import extract_graph, runtime_cost
    from ..check.whole_graph import check_graphs_equivalent
    from ..rules.corpus import load_corpus
    from .search import backtracking_search

    rules = tuple(load_corpus() if rules is None else rules)  # the same rules for both methods
    say = progress or (lambda msg: None)
    runs: dict[str, MethodRun] = {}
    say(f"{name}: backtracking search (budget {budget}, alpha {alpha})")
    bt = backtracking_search(graph, rules=rules, cost_model=cost_model, budget=budget, alpha=alpha,
                             time_limit=search_seconds, verify=False)
    runs["backtracking"] = MethodRun("backtracking", bt.cost_after, bt.seconds, bt.graphs_explored,
                                     bt.stop_reason, graph=bt.graph)
    say(f"{name}: equality saturation")
    sat = saturate(graph, rules=rules, limits=limits, count_classes=False)
    for extractor, method in (("greedy-dag", "eqsat-greedy"), ("ilp", "eqsat-ilp")):
        ext = extract_graph(sat, extractor, cost_model,
                            time_limit=ilp_seconds if extractor == "ilp" else None)
        cost = graph_cost(ext.graph, cost_model)
        runs[method] = MethodRun(method, cost, sat.seconds + ext.seconds, sat.enodes,
                                 f"{sat.stop_reason}; {ext.status}", graph=ext.graph)
    # as the runtime runs it: with the fusions it makes by itself (both methods find them too)
    original_cost = runtime_cost(graph, rules, cost_model)
    for r in runs.values():
        if r.cost > original_cost:  # both methods keep the input when nothing is cheaper
            r.cost, r.graph = original_cost, graph
        r.check_error = check_graphs_equivalent(graph, r.graph, what=f"{name} {r.method} result") \
            if r.graph is not graph else 0.0
    result = ModelComparison(name, sum(operator_counts(export_onnx(graph)).values()), original_cost, runs)
    if measure_repeats > 0:
        say(f"{name}: measuring")
        result.measured_ms = measure(graph, {m: r.graph for m, r in runs.items()}, measure_repeats, runtimes)
    return result


# --- reports ---------------------------------------------------------------------


def format_table(results: list[ModelComparison]) -> str:
    head = (f"{'model':<13}{'nodes':>6}{'orig ms':>10} | {'search ms':>10}{'s':>8}{'graphs':>7} | "
            f"{'greedy ms':>10}{'ilp ms':>10}{'s (ilp)':>8}{'e-nodes':>8} | {'ES/BT cost':>10}"
            f"{'BT/ES time':>11} | {'ORT x: BT':>9}{'greedy':>7}{'ilp':>7} | {'exec x: BT':>10}{'ilp':>7}")
    lines = [head, "-" * len(head)]
    for r in results:
        bt, gr, ilp = (r.runs[m] for m in METHODS)
        best_es = min(gr.cost, ilp.cost)
        lines.append(
            f"{r.model:<13}{r.nodes:>6}{r.original_cost * 1e3:>10.3f} | {bt.cost * 1e3:>10.3f}"
            f"{bt.seconds:>8.1f}{bt.explored:>7} | {gr.cost * 1e3:>10.3f}{ilp.cost * 1e3:>10.3f}"
            f"{ilp.seconds:>8.2f}{ilp.explored:>8} | {best_es / bt.cost:>10.4f}"
            f"{bt.seconds / max(ilp.seconds, 1e-9):>10.1f}x | {_x(r, 'ort', 'backtracking'):>9}"
            f"{_x(r, 'ort', 'eqsat-greedy'):>7}{_x(r, 'ort', 'eqsat-ilp'):>7} | "
            f"{_x(r, 'executor', 'backtracking'):>10}{_x(r, 'executor', 'eqsat-ilp'):>7}")
    return "\n".join(lines)


def _x(r: ModelComparison, runtime: str, method: str) -> str:
    s = r.speedup(runtime, method)
    return "-" if math.isnan(s) else f"{s:.3f}"


def save(results: list[ModelComparison], out_dir: Path, meta: dict) -> list[Path]:
    """compare.csv, compare.json and compare.png (cost against time) in ``out_dir``."""
    check_output_folder(out_dir)
    rows = [r.row() for r in results]
    csv_path, json_path, png_path = output_paths(out_dir)
    fields = list(dict.fromkeys(k for row in rows for k in row))

    def write_csv(tmp):
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

    payload = {"meta": meta, "models": [
        {"model": r.model, "nodes": r.nodes, "original_cost": r.original_cost,
         "runs": {m: {k: v for k, v in asdict(run).items() if k != "graph"} for m, run in r.runs.items()},
         "measured_ms": r.measured_ms} for r in results]}
    figure = plot_cost_vs_time(results)
    write_atomically(csv_path, write_csv, TasoEggError)
    write_atomically(json_path, lambda tmp: Path(tmp).write_text(json.dumps(payload, indent=2)), TasoEggError)
    write_atomically(png_path, lambda tmp: figure.savefig(tmp, dpi=110, bbox_inches="tight", format="png"),
                     TasoEggError)
    return [csv_path, json_path, png_path]


def output_paths(out_dir: Path) -> tuple[Path, Path, Path]:
    return tuple(out_dir / f"compare.{ext}" for ext in ("csv", "json", "png"))


def check_output_folder(out_dir: Path) -> None:
    """Make ``out_dir`` and check its files can be written, before an hour of work."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TasoEggError(f"cannot make the output folder {out_dir}: {e.strerror or e}") from None
    for path in output_paths(out_dir):
        check_writable(path, TasoEggError)


def plot_cost_vs_time(results: list[ModelComparison]):
    """One panel per model: cost (relative to the original) against optimisation
    seconds, one marker per method."""
    import matplotlib.pyplot as plt

    cols = min(4, len(results))
    rows = math.ceil(len(results) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    style = {"backtracking": ("s", "#d35400"), "eqsat-greedy": ("o", "#2980b9"), "eqsat-ilp": ("^", "#27ae60")}
    for ax, r in zip(axes.flat, results):
        for m, run in r.runs.items():
            marker, colour = style[m]
            ax.scatter([max(run.seconds, 1e-3)], [run.cost / r.original_cost], marker=marker, color=colour,
                       label=m, s=50)
        ax.set_xscale("log")
        ax.set_title(r.model, fontsize=9)
        ax.set_xlabel("optimisation seconds")
        ax.set_ylabel("cost / original")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(results):]:
        ax.set_axis_off()
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def run_comparison(models: list[str], cost_model: CostModel, out_dir: Path | None, budget: int,
                   alpha: float, search_seconds: float | None, limits: Limits, ilp_seconds: float,
                   repeats: int, echo=print) -> list[ModelComparison]:
    from . import zoo

    results = []
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    for name in models:
        results.append(compare_model(name, zoo.MODELS[name](), cost_model, budget=budget, alpha=alpha,
                                     search_seconds=search_seconds, limits=limits,
                                     ilp_seconds=ilp_seconds, measure_repeats=repeats,
                                     progress=lambda msg: echo(f"  .. {msg}")))
    echo(format_table(results))
    if out_dir is not None:
        meta = {"started": started, "cost_model": getattr(cost_model, "name", "cost model"),
                "budget": budget, "alpha": alpha, "search_seconds": search_seconds,
                "limits": asdict(limits), "ilp_seconds": ilp_seconds, "repeats": repeats}
        for path in save(results, out_dir, meta):
            echo(f"wrote {path}")
    return results


# --- command line ------------------------------------------------------------------


def add_arguments(p) -> None:
    from . import zoo

    full = [m for m in zoo.MODELS if not m.endswith("-small")]
    p.add_argument("models", nargs="*", default=full, metavar="MODEL",
                   help=f"zoo models (default: all eight: {', '.join(full)}; NAME-small for test sizes)")
    add_option_arguments(p, SearchOptions)
    p.add_argument("--search-seconds", type=float, default=600.0, help="time limit of each search")
    add_limit_arguments(p)
    add_option_arguments(p, ExtractionOptions, flags={"time_limit": "--ilp-seconds"}, only=("time_limit",))
    p.add_argument("--repeats", type=int, default=3, help="timed runs per graph, for the table (0: do not "
                                                          "measure)")
    add_option_arguments(p, CostOptions)
    p.add_argument("-o", "--out", type=Path, default=None, help="folder for compare.csv/.json/.png")


def run(args) -> int:
    from . import zoo
    from ..cost import load_cost_model

    unknown = [m for m in args.models if m not in zoo.MODELS]
    if unknown:
        raise TasoEggError(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(zoo.MODELS)}")
    limits = limits_from_args(args)
    if args.out is not None:
        check_output_folder(args.out)
    search = options_from_args(args, SearchOptions)
    ilp_seconds = options_from_args(args, ExtractionOptions, only=("time_limit",)).time_limit
    model = load_cost_model(options_from_args(args, CostOptions).profile)
    run_comparison(args.models, model, args.out, search.budget, search.alpha, args.search_seconds, limits,
                   ilp_seconds, args.repeats)
    return 0
