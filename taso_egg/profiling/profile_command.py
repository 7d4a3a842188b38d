"""``taso-egg profile MODEL... --device cpu|gpu --backend numpy|ort|cupy [-o PROFILE]``:
time every operator configuration the models (and, by default, their saturated
e-graphs and extracted graphs) need, and merge the results into a profile.

Without ``-o`` the profile is ``./<device>-<backend>.json`` in the working directory;
the shipped profiles (``profiles/``) change only when named with ``-o``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..cli_args import add_input_shape_argument, parse_input_shapes
from ..errors import ProfileError
from ..disk.files import check_writable
from ..ops import OPS
from ..options import DAG_EXTRACTORS, DEFAULT_PROFILE
from ..product.timing import pinned_threads
from .backends import BACKENDS, DEVICE_OF, make_backend



def add_arguments(p) -> None:
    p.add_argument("models", nargs="+", metavar="MODEL", help="ONNX file or zoo model name")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--backend", choices=BACKENDS, help="default: ort on cpu, cupy on gpu")
    from ..cost.store import profiles_dir

    p.add_argument("-o", "--output", help="profile to create or merge into (default: "
                   "./<device>-<backend>.json in the working directory, e.g. ./cpu-ort.json; "
                   "a shipped profile changes only when named here, e.g. "
                   f"-o {profiles_dir() / 'cpu-ort.json'})")
    p.add_argument("--warmups", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10, help="samples per configuration (median kept)")
    p.add_argument("--graph-only", action="store_true",
                   help="only the models' own configurations, not their saturated e-graphs'")
    p.add_argument("--include-unproved", action="store_true",
                   help="saturate with the corpus's unproved rules too (a superset of the "
                        "configurations optimize can reach)")
    p.add_argument("--remeasure", action="store_true",
                   help="time configurations the profile already has again, replacing them")
    p.add_argument("--ops", nargs="+", metavar="OP",
                   help="only configurations of these operators (e.g. to remeasure one kind)")
    add_input_shape_argument(p, "fix a symbolic input dimension of an ONNX model (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--list-configs", metavar="FILE",
                   help="time nothing: write every configuration this run would time, and the "
                        "device's calibration, to FILE as JSON (the GPU run's list; "
                        "taso_egg.profiling.bundle)")
    p.add_argument("--cost-model", help="with --list-configs: what the extractors price with "
                   "(analytic-gpu, a profile's name or path; default: gpu-h200 when shipped, "
                   "else analytic-gpu, on the gpu; cpu-ort on the cpu)")


def run(args) -> int:
    from ..product.optimize_graph import extract_graph
    from ..cost import ProfiledCost
    from ..cost.store import load_profile, profiles_dir
    from ..egraph.saturate import saturate
    from ..rules.corpus import load_corpus
    from ..product.timing import exported_graph
    from ..research.zoo import load_model
    from .profiler import (
        graph_configurations,
        new_profile,
        profile_configurations,
        saturation_configurations,
        unique,
    )

    backend_name = args.backend or ("ort" if args.device == "cpu" else "cupy")
    if DEVICE_OF[backend_name] != args.device:
        raise ProfileError(f"back end {backend_name} runs on the {DEVICE_OF[backend_name]}, "
                           f"not the {args.device}")
    if args.repeats < 1 or args.warmups < 0:
        raise ProfileError("--repeats must be >= 1 and --warmups >= 0")
    unknown = sorted(set(args.ops or ()) - set(OPS))
    if unknown:
        raise ProfileError(f"--ops: unknown operator(s) {unknown}; known: {sorted(OPS)}")
    if args.list_configs:
        return _list_configs(args)
    path = Path(args.output or f"{args.device}-{backend_name}.json")
    if not args.output and path.resolve().parent == profiles_dir().resolve():
        raise ProfileError(f"./{path} is the shipped profile {path.resolve()}; name it with -o "
                           f"to merge into it, or run elsewhere")
    check_writable(path, ProfileError)  # before minutes of timing
    shapes = parse_input_shapes(args.input_shape)
    graphs = {name: load_model(name, shapes) for name in args.models}  # fail early on a bad name
    backend = make_backend(backend_name)
    timing = {"warmups": args.warmups, "repeats": args.repeats, "progress": not args.quiet}
    rules = None if args.graph_only else load_corpus(include_unproved=args.include_unproved)
    start = time.perf_counter()
    with pinned_threads():
        if path.exists():
            profile = load_profile(path)
            print(f"{path}: merging into {len(profile.entries)} configurations", file=sys.stderr)
        else:
            print(f"{path}: new profile; calibrating {args.device} with {backend_name}", file=sys.stderr)
            profile = new_profile(backend, args.warmups, args.repeats)
        for name, g in graphs.items():
            t0 = time.perf_counter()
            configs = graph_configurations(g)
            sat = None
            if not args.graph_only:
                sat = saturate(g, rules=rules)
                configs += saturation_configurations(sat)
            result = profile_configurations(_only(unique(configs), args.ops), backend, profile,
                                            replace=args.remeasure, desc=name, **timing)
            if sat is not None:
                # Extraction's post-passes re-fuse biases and activations, and export
                # folds weights: profile what the extracted graphs run as well.
                extra = []
                for extractor in DAG_EXTRACTORS:
                    chosen = extract_graph(sat, extractor, ProfiledCost(profile)).graph
                    extra += graph_configurations(chosen) + graph_configurations(exported_graph(chosen))
                more = profile_configurations(_only(unique(extra), args.ops), backend, profile, replace=False,
                                              desc=f"{name} (extracted)", **timing)
                result.measured += more.measured
                result.failed.update(more.failed)
            profile.meta["models"] = sorted(set(profile.meta.get("models", [])) | {name})
            profile.save(path)
            print(f"{name}: {result.measured} configurations measured, {result.kept} already in "
                  f"the profile, {len(result.failed)} could not run "
                  f"({time.perf_counter() - t0:.1f} s)")
            for key, why in result.failed.items():
                print(f"  not measured: {key}: {why}", file=sys.stderr)
    print(f"wrote {path}: {len(profile.entries)} configurations; "
          f"{time.perf_counter() - start:.1f} s in all")
    return 0


def _list_configs(args) -> int:
    from ..cost import load_cost_model
    from ..egraph.saturate import saturate
    from ..rules.corpus import load_corpus
    from ..product.timing import exported_graph
    from ..research.zoo import load_model
    from .bundle import config_list, write_json
    from .prepare import calibration_pairs, extracted_graphs, gpu_cost_model, list_meta, staged_configurations

    path = Path(args.list_configs)
    check_writable(path, ProfileError)
    shapes = parse_input_shapes(args.input_shape)
    graphs = {name: load_model(name, shapes) for name in args.models}
    model = gpu_cost_model(args.cost_model) if args.device == "gpu" else load_cost_model(args.cost_model or DEFAULT_PROFILE)
    rules = None if args.graph_only else load_corpus(include_unproved=args.include_unproved)
    staged = {"": calibration_pairs(args.device)}
    for name, g in graphs.items():
        sat = None if rules is None else saturate(g, rules=rules)
        extracted = {} if sat is None else extracted_graphs(sat, model)
        pairs = staged_configurations(g, sat, extracted, [exported_graph(g)])
        staged[name] = [(c, stage) for c, stage in pairs if not args.ops or c.op in args.ops]
    data = config_list(staged, list_meta(model, graphs, args.device, rules))
    write_json(path, data)
    print(f"wrote {path}: {len(data['configs'])} configurations {data['meta']['counts']}")
    return 0


def _only(configs, ops):
    return [c for c in configs if c.op in ops] if ops else configs
