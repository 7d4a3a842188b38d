"""The cost model's prediction error per ONNX export, with and without calibration on
one onnxruntime profile of the input (``taso_egg.product.calibrate``). Per file: one
saturation, extracted under the profile's costs as they are (A) and calibrated (B); A
predicted by both, B by the calibrated costs; A and B timed against the original file
by optimize's guard in one interleaved session (one thread, CPU time). An error is
predicted over measured, less 1. Also how far the profile's costs are from the
kernels onnxruntime runs: per kernel unit, the time-weighted mean |ln(measured /
predicted)| (a load that slows every kernel alike counts too):

    .venv/bin/python scripts/prediction_error.py /work/exports/models/convnext_tiny.dynbatch.onnx --rounds 40
"""

from __future__ import annotations

import argparse
import math

from taso_egg.product import timing
from taso_egg.product.optimize_graph import extract_graph, runtime_calibrated, runtime_form
from taso_egg.product.calibrate import runtime_profile
from taso_egg.cost import graph_cost, load_cost_model, node_config
from taso_egg.product.guard import run_guard
from taso_egg.egraph.saturate import saturate
from taso_egg.executor import random_inputs
from taso_egg.onnx_io.exporter import export_fed
from taso_egg.product.optimize_onnx import OnnxInput
from taso_egg.ops import OPS
from taso_egg.options import ExtractionOptions, Limits
from taso_egg.rules.corpus import load_corpus


def unit_error(graph, model, feeds) -> float:
    """Time-weighted mean |ln(measured / predicted)| over onnxruntime's kernel units."""
    folded = graph.weight_only_nodes()
    predicted = {n.id: model.cost(node_config(n, [t.node in folded for t in n.inputs]))
                 for n in graph.nodes.values() if n.id not in folded and not OPS[n.op].is_leaf}
    units = [(seconds, sum(predicted.get(n, 0.0) for n in nodes))
             for seconds, nodes, _ in runtime_profile(graph, feeds).units]
    units = [(s, p) for s, p in units if s > 0 and p > 0]
    return sum(s * abs(math.log(s / p)) for s, p in units) / sum(s for s, _ in units)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--rounds", type=int, default=40, help="the guard's most rounds (default %(default)s)")
    args = p.parse_args()
    base, rules = load_cost_model(), load_corpus()
    extractor, limit = ExtractionOptions.extractor, ExtractionOptions.time_limit
    for path in args.files:
        source = OnnxInput.read(path)
        graph, feeds = source.dynamic.graph, random_inputs(source.dynamic.graph)
        form = runtime_form(graph, rules, base)
        calibrated = runtime_calibrated(form, base)
        saturation = saturate(graph, rules=rules, limits=Limits(), count_classes=False)
        a = extract_graph(saturation, extractor, base, limit).graph
        b = extract_graph(saturation, extractor, calibrated, limit).graph
        speedup = lambda g, m: graph_cost(form, m) / graph_cost(g, m)  # noqa: E731
        candidates = {"original": source.dynamic.reference, "A": export_fed(a), "B": export_fed(b)}
        with timing.pinned_threads():
            measured = dict(run_guard(timing.ort_rounds(candidates, feeds, 1), list(candidates),
                                      max_rounds=args.rounds).comparisons)
        error = lambda predicted, c: f"{100 * (predicted / c.ratio - 1):+.1f} %"  # noqa: E731
        shown = lambda c: f"{c.ratio:.3f}x ({c.low:.3f}-{c.high:.3f})"  # noqa: E731
        print(f"{path}: kernel units off by {unit_error(graph, base, feeds):.2f} (mean |ln|); "
              f"A: predicted {speedup(a, base):.3f}x (calibrated {speedup(a, calibrated):.3f}x), measured "
              f"{shown(measured['A'])}, error {error(speedup(a, base), measured['A'])} "
              f"(calibrated {error(speedup(a, calibrated), measured['A'])}); B: predicted "
              f"{speedup(b, calibrated):.3f}x, measured {shown(measured['B'])}, error "
              f"{error(speedup(b, calibrated), measured['B'])}", flush=True)


if __name__ == "__main__":
    main()
