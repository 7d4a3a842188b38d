"""Build the device bundle here, on the CPU (``profiling.bundle`` says what it holds):

    python -m taso_egg.profiling.prepare [--models M ...] [-o build/gpu-bundle]
                                         [--cost-model analytic-gpu|gpu-h200|PATH]

(``scripts/gpu_prepare.sh`` runs it for the eight zoo models.) Per model: optimize it
(saturate, extract with the ILP, check the result numerically) under the GPU cost
model, extract with greedy-dag too, and list every configuration the originals, the
extracted graphs and the saturated e-graph hold, as ``taso-egg profile`` collects
them. The GPU cost model is the measured GPU profile when one is shipped
(``profiles/gpu-h200.json``), else ``ANALYTIC_H200``: datasheet figures, not a
measurement.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from ..cli_args import CommandParser
from ..cost import AnalyticCost, load_cost_model
from ..cost.store import now, profiles_dir
from ..errors import TasoEggError
from ..disk.files import check_writable
from ..options import DAG_EXTRACTORS, CostOptions, DecisionOptions, OptimizeOptions
from ..graph import Graph
from .bundle import (
    CONFIGS_FILE,
    GRAPHS_FILE,
    GRAPHS_FORMAT,
    VERSION,
    config_list,
    cost_inputs,
    graph_to_json,
    predict,
    write_json,
)
from .profiler import calibration_configs, graph_configurations, saturation_configurations

GPU_PROFILE = "gpu-h200"
# An H200's datasheet peak (FP32 without tensor cores, HBM3e) and a round per-kernel
# launch cost; it ranks alternatives for the first GPU run, it predicts nothing.
ANALYTIC_H200 = AnalyticCost("analytic, H200 datasheet figures, NOT MEASURED (67 TFLOP/s FP32, "
                             "4.8 TB/s, 10 us per kernel)", 67e12, 4.8e12, 10e-6)
# Tensat's published speedups of the optimized graph over the original (V100;
# REFERENCE.md, "Tensat"), as fractions: t_original / t_optimized - 1.
TENSAT_SPEEDUP = {"bert": 0.092, "resnext50": 0.088, "nasnet-a": 0.073, "nasrnn": 0.689,
                  "inception-v3": 0.100, "squeezenet": 0.245, "vgg19": 0.089}
ZOO_MODELS = ("bert", "nasrnn", "resnext50", "resnet50", "nasnet-a", "inception-v3", "squeezenet",
              "vgg19")


def gpu_cost_model(name: str | None = None):
    """``name`` ("analytic-gpu", a shipped profile's name or a path); by default the
    shipped GPU profile when there is one, else ANALYTIC_H200."""
    if name == "analytic-gpu" or (name is None and not (profiles_dir() / f"{GPU_PROFILE}.json").is_file()):
        return ANALYTIC_H200
    return load_cost_model(name or GPU_PROFILE)


def staged_configurations(graph: Graph, saturation, extracted: dict[str, Graph],
                          deployed: list[Graph]) -> list[tuple]:
    """(config, stage) for one model: what ``deployed`` (the graphs a device run times)
    run, then what the extractors chose (as built and as exported), then every e-node
    of ``saturation`` (None: the graph alone)."""
    from ..product.timing import exported_graph

    pairs = [(c, "run") for g in deployed for c in graph_configurations(g)]
    pairs += [(c, "graphs") for c in graph_configurations(graph)]
    for g in extracted.values():
        pairs += [(c, "graphs") for c in graph_configurations(g) + graph_configurations(exported_graph(g))]
    if saturation is not None:
        pairs += [(c, "egraph") for c in saturation_configurations(saturation)]
    return pairs


def calibration_pairs(device: str) -> list[tuple]:
    return [(c, "calibration") for c in calibration_configs(device).values()]


def list_meta(model, models, device: str, rules) -> dict:
    return {"created": now(), "device": device, "models": list(models),
            "cost_model": getattr(model, "name", str(model)),
            "rules": None if rules is None else len(rules), "extractors": list(DAG_EXTRACTORS),
            "python": platform.python_version()}


def extracted_graphs(saturation, model, known: dict[str, Graph] | None = None) -> dict[str, Graph]:
    from ..product.optimize_graph import extract_graph

    known = dict(known or {})
    for x in DAG_EXTRACTORS:
        if x not in known:
            known[x] = extract_graph(saturation, x, model).graph
    return known


def build_bundle(models, out: Path, model=None, rules=None, log=print) -> dict:
    """Optimize each model under ``model`` (default ``gpu_cost_model()``) and write
    the bundle into ``out``; returns the graphs file's content."""
    from ..product.optimize_graph import optimize
    from ..rules.corpus import load_corpus
    from ..product.timing import exported_graph
    from ..research.zoo import MODELS

    model = model or gpu_cost_model()
    rules = tuple(load_corpus() if rules is None else rules)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise TasoEggError(f"not zoo models: {', '.join(unknown)} (known: {', '.join(sorted(MODELS))})")
    out.mkdir(parents=True, exist_ok=True)
    for name in (CONFIGS_FILE, GRAPHS_FILE):
        check_writable(out / name, TasoEggError)
    staged, entries = {"": calibration_pairs("gpu")}, {}
    for name in models:
        t0 = time.perf_counter()
        g = MODELS[name]()
        # min_gain 0: the extracted graph whenever it is predicted cheaper at all; on
        # the GPU only measurement tells, and that is what the device run is for.
        res = optimize(g, rules=rules, options=OptimizeOptions(costs=CostOptions(model=model),
                                                               decision=DecisionOptions(measure=0, min_gain=0.0)))
        chosen, sat = res.stats.chosen == "result", res.stats.saturation
        original = exported_graph(g)
        optimized = exported_graph(res.graph) if chosen else original
        known = {"ilp": res.graph} if chosen else {}
        extracted = extracted_graphs(sat, model, known)
        staged[name] = staged_configurations(g, sat, extracted, [original, optimized])
        pair = {}
        for which, graph in (("original", original), ("optimized", optimized)):
            inputs = cost_inputs(graph)
            configs = {c.key: c for c in graph_configurations(graph)}
            pair[which] = {"graph": graph_to_json(graph), "cost_inputs": inputs,
                           "predicted_s": predict(inputs, configs, model)[0],
                           "operators": sum(n for _, n in inputs)}
        entries[name] = {**pair, "unchanged": not chosen, "kept_input": res.stats.kept_input,
                         "check_error": res.stats.check.error, "ort_check_error": res.stats.check.ort_error,
                         "enodes": sat.enodes, "stop_reason": sat.stop_reason,
                         "tensat_speedup": TENSAT_SPEEDUP.get(name)}
        gain = pair["original"]["predicted_s"] / pair["optimized"]["predicted_s"]
        log(f"{name}: {sat.enodes} e-nodes, {len(sat.iterations)} iterations; "
            f"{'optimized' if chosen else 'unchanged (' + res.stats.kept_input + ')'}; predicted "
            f"{gain:.3f}x; {time.perf_counter() - t0:.1f} s")
    meta = list_meta(model, models, "gpu", rules)
    configs = config_list(staged, meta)
    graphs = {"format": GRAPHS_FORMAT, "version": VERSION, "meta": meta, "models": entries}
    write_json(out / CONFIGS_FILE, configs)
    write_json(out / GRAPHS_FILE, graphs)
    sizes = ", ".join(f"{f} {(out / f).stat().st_size / 1e6:.1f} MB" for f in (CONFIGS_FILE, GRAPHS_FILE))
    log(f"wrote {out}: {len(configs['configs'])} configurations {configs['meta']['counts']}; {sizes}")
    return graphs


def main(argv=None) -> int:
    p = CommandParser(prog="python -m taso_egg.profiling.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(ZOO_MODELS), metavar="MODEL")
    p.add_argument("-o", "--output", default="build/gpu-bundle", help="the bundle's folder")
    p.add_argument("--cost-model", help="analytic-gpu, a shipped profile's name or a profile path "
                                        f"(default: {GPU_PROFILE} when shipped, else analytic-gpu)")
    args = p.parse_args(argv)
    try:
        build_bundle(args.models, Path(args.output), gpu_cost_model(args.cost_model))
    except TasoEggError as e:
        print(f"taso-egg: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
