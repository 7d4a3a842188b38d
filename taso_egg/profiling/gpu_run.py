"""The GPU run, in one process on the device machine (``scripts/gpu_run.sh``):

    python -m taso_egg.profiling.gpu_run --bundle build/gpu-bundle --out DIR
        [--xp cupy|numpy] [--budget S] [--models M ...]

1. Profile: calibrate, then time every configuration of the bundle's list with the
   ``cupy`` back end (the operator table's kernels on CuPy, as the executor runs
   them), in the list's order (what the bundle's graphs run first), TASO's protocol:
   8 warm-up samples, 32 timed samples bracketed by CUDA events, each sample at least
   ``backends.SAMPLE_S`` of back-to-back runs; the median is the cost, the mean is
   kept beside it. Written to ``DIR/gpu-<device>.json`` in the profile format
   (``cost/store.py``), saved every ``profiler.CHECKPOINT_S`` while it runs.
2. End to end: each model's original and optimized graph from the bundle, weights
   drawn on the device, run by our executor on CuPy, interleaved run by run (CUDA
   events around each run; 8 warm-ups, 32 runs, median); predicted under the profile
   just measured from the bundle's cost inputs. Written to ``DIR/gpu-compare.json``
   and as a table to ``DIR/gpu-compare.txt`` and stdout, beside Tensat's speedups.

Everything stops cleanly at ``--budget`` seconds: profiling stops ``--reserve``
seconds before it so the end-to-end timing gets its turn; what is not reached is
counted and the outputs say "partial". A SIGTERM (``timeout``) ends the same way.
``--xp numpy`` runs NumPy standing in for CuPy (host clock), for the CPU dry run.

This path imports NumPy, CuPy and the package's pure-Python modules only: no egglog,
Z3 or HiGHS (the device machine has none of them).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path

from ..cli_args import CommandParser
from ..cost import ProfiledCost
from ..cost.store import now
from ..errors import ProfileError, TasoEggError
from .backends import KernelBackend, place_on_device
from .bundle import graph_from_json, load_bundle, predict, read_configs, write_json
from .profiler import new_profile, profile_configurations

WARMUPS, REPEATS = 8, 32          # TASO's protocol
COMPARE_FORMAT = "taso-egg-gpu-compare"


class Stopped(Exception):
    """SIGTERM: stop where we are and write what was measured."""


def profile_name(device_name: str) -> str:
    """``gpu-h200`` for "NVIDIA H200"; ``gpu-stand-in`` for NumPy standing in."""
    if "standing in" in device_name:
        return "gpu-stand-in"
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower().replace("nvidia", "")).strip("-")
    return f"gpu-{slug or 'unknown'}"


def array_module(name: str):
    if name == "numpy":
        import numpy

        return numpy
    try:
        import cupy
    except ImportError:
        raise ProfileError("--xp cupy needs CuPy and a GPU (or --xp numpy for a dry run)") from None
    return cupy


def time_graphs(graphs: dict, backend, warmups: int, runs: int, deadline: float | None = None) -> dict:
    """Each graph run by our executor on the back end's array module, the graphs
    interleaved run by run; seconds per run (the back end's clock: CUDA events on a
    GPU) and wall seconds beside them. Past ``deadline`` no further round starts
    (``runs`` in the result says how many were)."""
    from ..executor import run

    xp = backend.xp
    prepared = {}
    for k, g in graphs.items():
        feeds = place_on_device(g, xp)
        prepared[k] = lambda g=g, f=feeds: run(g, f, xp=xp)
    for fn in prepared.values():
        fn()  # compiles the kernels a GPU has not run yet
    for _ in range(warmups):
        for fn in prepared.values():
            backend.clock(fn, 1)
    samples = {k: [] for k in prepared}
    wall = {k: [] for k in prepared}
    for done in range(runs):
        if done and deadline is not None and time.perf_counter() >= deadline:
            break
        for k, fn in prepared.items():
            w0 = time.perf_counter()
            samples[k].append(backend.clock(fn, 1))
            wall[k].append(time.perf_counter() - w0)
    import numpy as np

    from .backends import summarize

    out = {}
    for k in prepared:
        s = summarize(samples[k])
        out[k] = {"median_s": s.median, "mean_s": s.mean, "spread_s": s.spread,
                  "wall_median_s": float(np.median(wall[k])), "runs": len(samples[k])}
    return out


def _pct(x) -> str:
    return "" if x is None else f"{x:+.1%}"


def table(rows: dict, meta: dict) -> str:
    head = (f"{'model':<19}{'pred orig':>10}{'pred opt':>10}{'meas orig':>10}{'meas opt':>10}"
            f"{'err orig':>9}{'err opt':>9}{'pred gain':>10}{'meas gain':>10}{'Tensat':>8}")
    lines = [f"GPU end to end: {meta['device_name']} ({meta['profile']}); ms per run, median of "
             f"{meta['runs']} runs (our executor on {meta['array_module']}); err = predicted / "
             f"measured - 1; gain = t_orig / t_opt - 1 (Tensat: published, V100)", head]
    for name, r in rows.items():
        if "skipped" in r:
            lines.append(f"{name:<19}  not timed: {r['skipped']}")
            continue
        p, m = r["predicted_s"], r["measured_s"]
        lines.append(
            f"{name:<19}{p['original'] * 1e3:>10.3f}{p['optimized'] * 1e3:>10.3f}"
            f"{m['original'] * 1e3:>10.3f}{m['optimized'] * 1e3:>10.3f}"
            f"{_pct(r['error']['original']):>9}{_pct(r['error']['optimized']):>9}"
            f"{_pct(r['predicted_gain']):>10}{_pct(r['measured_gain']):>10}{_pct(r['tensat_gain']):>8}"
            + ("  (unchanged)" if r["unchanged"] else ""))
    errors = [abs(r["error"][k]) for r in rows.values() if "error" in r for k in ("original", "optimized")]
    if errors:
        lines.append(f"prediction error: mean |err| {sum(errors) / len(errors):.1%}, max {max(errors):.1%} "
                     f"(target <= 15 %)")
    if meta.get("partial"):
        lines.append(f"PARTIAL: {meta['partial']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = CommandParser(prog="python -m taso_egg.profiling.gpu_run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default="build/gpu-bundle")
    p.add_argument("--out", required=True, help="folder for the profile, the comparison and its table")
    p.add_argument("--xp", choices=["cupy", "numpy"], default="cupy",
                   help="numpy: NumPy standing in for CuPy (the CPU dry run)")
    p.add_argument("--models", nargs="+", metavar="MODEL", help="default: every model in the bundle")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for everything (default 420)")
    p.add_argument("--reserve", type=float, default=150.0,
                   help="seconds of the budget kept for the end-to-end timing (default 150)")
    p.add_argument("--warmups", type=int, default=WARMUPS)
    p.add_argument("--repeats", type=int, default=REPEATS, help="timed samples per configuration")
    p.add_argument("--runs", type=int, default=REPEATS, help="timed end-to-end runs per graph")
    p.add_argument("--calibration-sizes", type=int, nargs=2, metavar=("MATMUL", "VECTOR"),
                   help="the calibration's square matmul side and vector length (default: the "
                        "GPU's, 8192 and 2^26)")
    p.add_argument("--profile-name", help="default: gpu-<device>, e.g. gpu-h200")
    args = p.parse_args(argv)
    try:
        if args.xp == "numpy":  # on the CPU one thread, as every CPU profile is taken
            from ..product.timing import pinned_threads

            with pinned_threads():
                return run(args)
        return run(args)
    except TasoEggError as e:
        print(f"taso-egg: error: {e}", file=sys.stderr)
        return 1


def _stop(signum, frame):
    raise Stopped()


def run(args) -> int:
    start = time.perf_counter()
    deadline = start + args.budget
    if args.repeats < 1 or args.runs < 1 or args.warmups < 0 or args.budget <= 0:
        raise ProfileError("--repeats and --runs must be >= 1, --warmups >= 0, --budget > 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs_data, graphs_data = load_bundle(args.bundle)
    configs = read_configs(configs_data)
    models = args.models or list(graphs_data["models"])
    missing = [m for m in models if m not in graphs_data["models"]]
    if missing:
        raise ProfileError(f"not in the bundle: {', '.join(missing)} (it holds "
                           f"{', '.join(graphs_data['models'])})")
    todo = [c for c, e in configs if e["stage"] != "calibration"
            and (args.models is None or set(e["models"]) & set(models))]
    backend = KernelBackend(array_module(args.xp), "cupy")
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _run(args, start, deadline, out, graphs_data, configs, todo, models, backend)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args, start, deadline, out, graphs_data, configs, todo, models, backend) -> int:
    by_key = {c.key: c for c, _ in configs}
    partial = []
    import taso_egg

    print(f"taso_egg from {Path(taso_egg.__file__).parent}; bundle {args.bundle} "
          f"({graphs_data['meta']['created']}, costs: {graphs_data['meta']['cost_model']})", flush=True)
    print(f"{len(todo)} configurations to profile, {len(models)} models to time; budget "
          f"{args.budget:.0f} s ({args.reserve:.0f} s kept for the end-to-end timing)", flush=True)

    profile, path = None, None
    compare: dict = {}
    try:
        profile = new_profile(backend, args.warmups, args.repeats,
                              tuple(args.calibration_sizes) if args.calibration_sizes else None)
        path = out / f"{args.profile_name or profile_name(profile.meta['device_name'])}.json"
        profile.meta.update({"protocol": f"{args.warmups} warm-up and {args.repeats} timed samples "
                                         f"per configuration; seconds = median sample, mean_s = mean",
                             "bundle": graphs_data["meta"], "models": sorted(models)})
        print(f"{profile.meta['device_name']}: {json.dumps(profile.meta['libraries'])}; calibration "
              f"{profile.meta['calibration']['peak_flops'] / 1e12:.2f} TFLOP/s, "
              f"{profile.meta['calibration']['bandwidth'] / 1e9:.0f} GB/s, "
              f"{profile.meta['calibration']['overhead_s'] * 1e6:.1f} us per operator, "
              f"{profile.meta['calibration']['run_overhead_s'] * 1e6:.1f} us per run "
              f"({time.perf_counter() - start:.0f} s)", flush=True)

        def checkpoint(pr):
            pr.save(path)
            print(f"  {len(pr.entries)}/{len(todo)} configurations ({time.perf_counter() - start:.0f} s)",
                  flush=True)

        result = profile_configurations(todo, backend, profile, args.warmups, args.repeats, replace=True,
                                        progress=False, deadline=deadline - args.reserve,
                                        checkpoint=checkpoint)
        if result.skipped:
            partial.append(f"{result.skipped} of {len(todo)} configurations not profiled (deadline)")
        for key, why in result.failed.items():
            print(f"  not measured: {key}: {why}", file=sys.stderr)
        print(f"profiled {result.measured} configurations, {len(result.failed)} failed, "
              f"{result.skipped} skipped ({time.perf_counter() - start:.0f} s)", flush=True)
        profile.save(path)

        model = ProfiledCost(profile)
        overhead = profile.meta["calibration"]["run_overhead_s"]
        for name in models:
            entry = graphs_data["models"][name]
            if time.perf_counter() >= deadline:
                compare[name] = {"skipped": "the budget ran out"}
                partial.append(f"{name} not timed end to end (deadline)")
                continue
            t0 = time.perf_counter()
            graphs = {k: graph_from_json(entry[k]["graph"]) for k in ("original", "optimized")}
            try:
                times = time_graphs(graphs, backend, args.warmups, args.runs, deadline)
                if times["original"]["runs"] < args.runs:
                    partial.append(f"{name}: {times['original']['runs']} of {args.runs} runs (deadline)")
            except Exception as e:  # one run on a lent machine: a model that fails (a kernel
                # error, the device out of memory) must not cost the others their timing
                compare[name] = {"skipped": f"failed: {type(e).__name__}: {e}"}
                partial.append(f"{name} failed end to end")
                print(f"{name}: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                continue
            finally:
                for g in graphs.values():
                    g.weight_data.clear()  # device arrays: free them before the next model
                backend.release()
            row = {"unchanged": entry["unchanged"], "measured": times, "predicted_s": {}, "lookups": {},
                   "bundle_predicted_s": {k: entry[k]["predicted_s"] for k in graphs}}
            for k in graphs:
                row["predicted_s"][k], row["lookups"][k] = predict(entry[k]["cost_inputs"], by_key, model,
                                                                    overhead)
            row["measured_s"] = {k: times[k]["median_s"] for k in graphs}
            row["error"] = {k: row["predicted_s"][k] / row["measured_s"][k] - 1 for k in graphs}
            row["predicted_gain"] = row["predicted_s"]["original"] / row["predicted_s"]["optimized"] - 1
            row["measured_gain"] = row["measured_s"]["original"] / row["measured_s"]["optimized"] - 1
            row["tensat_gain"] = entry.get("tensat_speedup")
            compare[name] = row
            print(f"{name}: original {row['measured_s']['original'] * 1e3:.3f} ms, optimized "
                  f"{row['measured_s']['optimized'] * 1e3:.3f} ms ({time.perf_counter() - t0:.1f} s)", flush=True)
    except Stopped:
        partial.append("stopped by SIGTERM")
        print("SIGTERM: writing what was measured", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the writing short
        if profile is not None:
            if partial:
                profile.meta["partial"] = "; ".join(partial)
            profile.meta["updated"] = now()
            profile.save(path)
    if profile is None:
        raise ProfileError("stopped before the calibration finished: nothing measured")
    for name in models:
        compare.setdefault(name, {"skipped": "not reached"})
    meta = {"device_name": profile.meta["device_name"], "profile": path.name, "runs": args.runs,
            "warmups": args.warmups, "array_module": backend.xp.__name__, "created": now(),
            "profile_entries": len(profile.entries), "libraries": profile.meta["libraries"],
            "kernels": profile.meta.get("kernels"), "seconds": time.perf_counter() - start,
            "partial": "; ".join(partial)}
    write_json(out / "gpu-compare.json", {"format": COMPARE_FORMAT, "version": 1, "meta": meta,
                                          "models": compare})
    text = table(compare, meta)
    (out / "gpu-compare.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {path}, {out / 'gpu-compare.json'}, {out / 'gpu-compare.txt'} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
