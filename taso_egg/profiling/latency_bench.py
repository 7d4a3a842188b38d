"""Predicted vs measured: does the profiled cost model predict what runs?

For each benchmark model, the original graph and the one ``optimize`` returns:

- cpu-ort profile total vs the exported ONNX model run in onnxruntime
  (ORT_ENABLE_ALL, one thread);
- cpu-numpy profile total vs our executor on the exported-and-read-back graph
  (weight-only work folded, as the cost model assumes);

and the user's view: onnxruntime latency of the exported original vs optimized
model, in the same run. Times are medians of process CPU time (one thread; the
machine is shared), wall-clock medians beside them. A prediction is the sum of the
operator costs plus the profile's measured fixed cost of one whole-graph run.

``--same-run`` also predicts from a profile measured in this run, just before each
model is timed: the shipped profile was measured at another time, and on a shared
machine the same operator's time drifts by 20 % or more between hours. The shipped
profile's error mixes that drift with the cost model's own error (fusions, layout
changes, caches that a per-operator profile does not see); the same-run error is the
latter alone.

``--time-profiling`` first profiles every configuration of the chosen models from
scratch into temporary profiles (both back ends) and reports the seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from ..cli_args import CommandParser

BENCH_MODELS = ["bert", "nasrnn", "resnext50", "resnet50", "nasnet-a", "inception-v3", "squeezenet",
                "vgg19"]


def _same(a, b) -> bool:
    return a is b or a.structural_hash() == b.structural_hash()


def _predict(graph, model) -> tuple[float, str]:
    from ..cost import graph_cost

    model.reset_counts()
    total = graph_cost(graph, model) + model.profile.meta["calibration"]["run_overhead_s"]
    n = model.lookups()
    return total, f"{n['measured']}/{n['measured'] + n['borrowed'] + n['estimated']}"


class SameRunProfiles:
    """One calibrated, initially empty profile per back end; ``model_for`` measures
    the configurations of the given graphs again, right now, and returns a cost model
    over them."""

    def __init__(self, repeats: int = 10, warmups: int = 2):
        self.repeats, self.warmups = repeats, warmups
        self.profiles: dict = {}

    def model_for(self, backend_name: str, graphs):
        from ..cost import ProfiledCost
        from ..product.timing import pinned_threads
        from .backends import make_backend
        from .profiler import graph_configurations, new_profile, profile_configurations, unique

        backend = make_backend(backend_name)
        with pinned_threads():
            if backend_name not in self.profiles:
                self.profiles[backend_name] = new_profile(backend, self.warmups, self.repeats)
            profile = self.profiles[backend_name]
            configs = unique(c for g in graphs for c in graph_configurations(g))
            profile_configurations(configs, backend, profile, self.warmups, self.repeats,
                                   replace=True, progress=False)
        return ProfiledCost(profile)


def _time_profiling(models, repeats, warmups, out) -> None:
    """Profile every configuration from scratch into temporary files; print seconds."""
    from ..errors import TasoEggError
    from . import profile_command

    parser = CommandParser(prog="taso-egg profile")
    profile_command.add_arguments(parser)
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("ort", "numpy"):
            t0 = time.perf_counter()
            args = parser.parse_args([*models, "--backend", backend, "-o",
                                      os.path.join(tmp, f"{backend}.json"), "--repeats", str(repeats),
                                      "--warmups", str(warmups), "--quiet"])
            try:
                profile_command.run(args)
            except TasoEggError as e:  # as `taso-egg profile` reports it
                print(f"taso-egg: error: {e}", file=sys.stderr)
                raise SystemExit(1) from None
            print(f"profiling {len(models)} models' configurations from scratch with {backend}: "
                  f"{time.perf_counter() - t0:.1f} s", file=out, flush=True)


def build_parser() -> argparse.ArgumentParser:
    from ..research import zoo
    from ..cli_args import add_option_arguments
    from ..options import DEFAULT_PROFILE, DecisionOptions, ExtractionOptions

    p = CommandParser(prog="python -m taso_egg.profiling.latency_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=BENCH_MODELS, choices=sorted(zoo.MODELS))
    p.add_argument("--repeats", type=int, default=5, help="end-to-end runs per graph (median)")
    add_option_arguments(p, ExtractionOptions)
    p.add_argument("--ort-profile", default=DEFAULT_PROFILE)
    p.add_argument("--numpy-profile", default="cpu-numpy")
    p.add_argument("--include-unproved", action="store_true",
                   help="optimize with the corpus's unproved rules too")
    p.add_argument("--skip-numpy", action="store_true", help="only the onnxruntime comparison")
    # optimize predicts here (this benchmark measures): its threshold, 0 to measure every graph
    add_option_arguments(p, DecisionOptions, only=("min_gain",))
    p.add_argument("--same-run", action="store_true",
                   help="also predict from the models' configurations profiled in this run")
    p.add_argument("--time-profiling", action="store_true",
                   help="first profile the models from scratch and report the seconds")
    return p


def main(argv=None) -> int:
    from ..research import zoo
    from ..product.optimize_graph import optimize, runtime_form
    from ..cli_args import options_from_args
    from ..cost import load_cost_model
    from ..executor import random_inputs, run
    from ..onnx_io.exporter import export_onnx
    from ..options import CostOptions, DecisionOptions, ExtractionOptions, OptimizeOptions
    from ..rules.corpus import load_corpus
    from ..product.timing import exported_graph, make_session, median_times, pinned_threads

    args = build_parser().parse_args(argv)
    out = sys.stdout
    if args.time_profiling:
        _time_profiling(args.models, 10, 2, out)

    rules = load_corpus(include_unproved=args.include_unproved)
    ort_model = load_cost_model(args.ort_profile)
    np_model = None if args.skip_numpy else load_cost_model(args.numpy_profile)
    same_run = SameRunProfiles() if args.same_run else None
    print(f"{'model':<13}{'runtime':<9}{'graph':<10}{'predicted ms':>13}{'measured ms':>12}"
          f"{'error':>8}{'wall ms':>10}{'measured':>10}"
          + (f"{'same-run ms':>12}{'error':>8}" if same_run else ""), file=out)
    user_view, speedups = [], []
    extraction = options_from_args(args, ExtractionOptions)
    decision = options_from_args(args, DecisionOptions, only=("min_gain",), measure=0)

    def optimized(g, model):
        options = OptimizeOptions(extraction=extraction, costs=CostOptions(model=model), decision=decision)
        return optimize(g, rules=rules, options=options).graph

    for name in args.models:
        g = zoo.MODELS[name]()
        graphs = {"original": g, "optimized": optimized(g, ort_model)}
        # predicted as onnxruntime runs them: with the fusions it makes by itself
        comparisons = [("ort", ort_model, {k: runtime_form(v, rules, ort_model) for k, v in graphs.items()})]
        if np_model is not None:
            np_opt = optimized(g, np_model)
            comparisons.append(("numpy", np_model, {"original": exported_graph(g),
                                                    "optimized": exported_graph(np_opt)}))
        for runtime, model, pair in comparisons:
            fresh = same_run.model_for(runtime, pair.values()) if same_run else None
            feeds = random_inputs(g)
            with pinned_threads(), np.errstate(all="ignore"):  # TASO's BERT overflows float32
                if runtime == "ort":
                    sessions = {k: make_session(export_onnx(v)) for k, v in pair.items()}
                    runs = {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sessions.items()}
                else:
                    runs = {k: (lambda v=v, f=feeds: run(v, f)) for k, v in pair.items()}
                times = median_times(runs, args.repeats)
            predicted = {}
            for k, graph in pair.items():
                predicted[k], coverage = _predict(graph, model)
                cpu, wall = times[k]
                extra = ""
                if fresh is not None:
                    now, _ = _predict(graph, fresh)
                    extra = f"{now * 1e3:>12.3f}{(now - cpu) / cpu:>+8.1%}"
                unchanged = "  (unchanged)" if k == "optimized" and _same(graph, pair["original"]) else ""
                print(f"{name:<13}{runtime:<9}{k:<10}{predicted[k] * 1e3:>13.3f}{cpu * 1e3:>12.3f}"
                      f"{(predicted[k] - cpu) / cpu:>+8.1%}{wall * 1e3:>10.3f}{coverage:>10}{extra}{unchanged}",
                      file=out, flush=True)
            speedups.append((name, runtime, predicted["original"] / predicted["optimized"],
                             times["original"][0] / times["optimized"][0]))
            if runtime == "ort":
                user_view.append((name, times["original"], times["optimized"],
                                  _same(pair["optimized"], pair["original"])))
    print(f"\n{'model':<13}{'runtime':<9}{'predicted speedup':>18}{'measured speedup':>18}", file=out)
    for name, runtime, pred, meas in speedups:
        print(f"{name:<13}{runtime:<9}{pred:>17.3f}x{meas:>17.3f}x", file=out)
    print("\nThe user's view: onnxruntime (ORT_ENABLE_ALL, 1 thread), exported original vs optimized",
          file=out)
    print(f"{'model':<13}{'original ms':>12}{'optimized ms':>13}{'speedup':>9}{'wall orig':>11}"
          f"{'wall opt':>10}{'speedup':>9}", file=out)
    for name, (cpu0, wall0), (cpu1, wall1), unchanged in user_view:
        flag = "  (unchanged: the original)" if unchanged else "  SLOWER" if cpu1 > cpu0 else ""
        print(f"{name:<13}{cpu0 * 1e3:>12.3f}{cpu1 * 1e3:>13.3f}{cpu0 / cpu1:>8.3f}x{wall0 * 1e3:>11.3f}"
              f"{wall1 * 1e3:>10.3f}{wall0 / wall1:>8.3f}x{flag}", file=out)
    print(f"\ncosts: {ort_model.name}" + (f"; {np_model.name}" if np_model else ""), file=out)
    print("times: medians of process CPU time (one thread; wall clock beside it); "
          "'measured' = profiled lookups / all lookups", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
