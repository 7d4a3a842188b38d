"""The ``taso-egg`` command line. User mistakes end as one line on stderr and exit
code 1, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .cost import MIN_GAIN
from .errors import TasoEggError


def parse_input_shapes(items) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items or ():
        name, _, dims = item.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
        except ValueError:
            raise TasoEggError(f"--input-shape {item!r}: expected NAME=D1,D2,... (e.g. x=1,3,224,224)")
        if not name or not shapes[name]:
            raise TasoEggError(f"--input-shape {item!r}: expected NAME=D1,D2,...")
    return shapes


def _add_model_args(p) -> None:
    p.add_argument("model", help="ONNX file")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="fix a symbolic input dimension (repeatable)")


def _cmd_inspect(args) -> int:
    from .onnx_io.importer import load_onnx

    g = load_onnx(args.model, parse_input_shapes(args.input_shape))
    print(f"{args.model}: {len(g.nodes)} nodes, opset {g.opset}")
    print("  inputs : " + ", ".join(f"{n.params['name']} {n.outputs[0]}" for n in g.inputs()))
    print("  outputs: " + ", ".join(f"{name} {t.type}" for name, t in g.outputs))
    print(f"  weights: {len(g.weights())}")
    for op, count in sorted(g.op_counts().items(), key=lambda kv: (-kv[1], kv[0])):
        extra = ""
        if op == "opaque":
            kinds = {}
            for n in g.nodes.values():
                if n.op == "opaque":
                    kinds[n.params["op_type"]] = kinds.get(n.params["op_type"], 0) + 1
            extra = "  (" + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())) + ")"
        print(f"  {op:<15} {count:>5}{extra}")
    return 0


def _cmd_convert(args) -> int:
    """Load, export, and check that onnxruntime computes the same on both files."""

    from .executor import random_inputs
    from .onnx_io.exporter import export_onnx, save_atomically
    from .onnx_io.importer import load_onnx, _read
    from .verify import compare_outputs, onnx_outputs

    original = _read(args.model)
    g = load_onnx(original, parse_input_shapes(args.input_shape))
    model = export_onnx(g)
    feeds = random_inputs(g)
    err = compare_outputs(onnx_outputs(original, feeds), onnx_outputs(model, feeds),
                          what="exported model")
    save_atomically(model, args.output)
    print(f"wrote {args.output}: {len(model.graph.node)} ONNX nodes "
          f"(from {len(original.graph.node)}); outputs agree within {err:.2g} relative")
    return 0


def _cmd_optimize(args) -> int:
    import numpy as np

    from .api import optimize
    from .egraph.saturate import Limits
    from .executor import random_inputs
    from .onnx_io.exporter import export_onnx, save_atomically
    from .onnx_io.importer import _read, load_onnx
    from .rules.lang import load_corpus, load_rule_file
    from .verify import compare_outputs, onnx_outputs

    limits = Limits(nodes=args.node_limit, iterations=args.iter_limit, seconds=args.time_limit,
                    multi_iterations=args.multi_iterations)
    rules = load_corpus()
    for path in args.rules or ():
        rules += load_rule_file(path)
    original = _read(args.model)
    g = load_onnx(original, parse_input_shapes(args.input_shape))
    print(f"{args.model}: {len(g.nodes)} nodes; {len(rules)} rules; saturating "
          f"(limits: {limits.nodes} e-nodes, {limits.iterations} iterations, {limits.seconds:g} s, "
          f"multi-pattern iterations {limits.multi_iterations})", file=sys.stderr)

    def progress(it):
        top = sorted(it.matches.items(), key=lambda kv: -kv[1])[:3]
        print(f"  iteration {it.iteration:>2}: {it.enodes:>7} e-nodes {it.eclasses:>7} e-classes "
              f"{it.seconds:6.2f} s  " + ", ".join(f"{k} x{v}" for k, v in top), file=sys.stderr)

    result = optimize(g, rules=rules, limits=limits, extractor=args.extractor, progress=progress,
                      profile=args.profile, min_gain=args.min_gain, measure=args.measure)
    model = export_onnx(result.graph)
    feeds = random_inputs(g)
    expected = onnx_outputs(original, feeds)
    if all(np.all(np.isfinite(v)) for v in expected.values() if v.dtype.kind == "f"):
        err = compare_outputs(expected, onnx_outputs(model, feeds), what="optimized model in onnxruntime")
    else:  # the graph check above ran with tracked exponents; float32 cannot say more
        err = None
        print("note: the model's float32 outputs overflow on random inputs, so the onnxruntime "
              "cross-check is skipped; the graph check passed", file=sys.stderr)
    _print_summary(result, err)
    if result.graph is g:  # nothing worth changing: hand back the model as it came
        model = original
    save_atomically(model, args.output)
    print(f"wrote {args.output}")
    return 0


def _print_summary(result, err: float | None) -> None:
    st = result.stats
    before, after = st["ops_before"], st["ops_after"]
    print(f"{'operator':<16}{'before':>8}{'after':>8}")
    for op in sorted(set(before) | set(after)):
        print(f"{op:<16}{before.get(op, 0):>8}{after.get(op, 0):>8}")
    print(f"{'cost':<16}{result.cost_before * 1e3:>8.3f}{result.cost_after * 1e3:>8.3f}  ms "
          f"({result.cost_model}); predicted speedup {result.speedup:.3f}x")
    print(f"e-graph: {st['enodes']} e-nodes, {st['eclasses']} e-classes after {st['iterations']} "
          f"iterations; stopped: {st['stop_reason']}")
    print(f"time: saturation {st['saturation_seconds']:.2f} s, extraction ({st['extractor']}, "
          f"{st['extractor_status']}) {st['extraction_seconds']:.2f} s, total {st['total_seconds']:.2f} s")
    print(f"check ({st['check_seconds']:.1f} s): outputs equal the original's within "
          f"{st['check_error']:.2g} relative "
          f"(our executor, float64, tracked exponents)")
    if err is not None:
        print(f"       and in onnxruntime (float32) within {err:.2g} relative")
    if st["measured_ms"]:
        ms = st["measured_ms"]
        print(f"onnxruntime (ORT_ENABLE_ALL, 1 thread, median CPU time): original {ms['original']:.3f} ms, "
              f"optimized {ms['optimized']:.3f} ms ({ms['original'] / ms['optimized']:.3f}x)")
    if st["kept_input"]:
        print(f"note: writing the original model unchanged: {st['kept_input']} "
              f"(extracted graph's cost {st['extracted_cost'] * 1e3:.3f} ms)")


def _cmd_zoo(args) -> int:
    from . import zoo
    from .onnx_io.exporter import export_onnx

    builders = zoo.MODELS
    if args.name not in builders:
        raise TasoEggError(f"unknown zoo model {args.name!r}; choose from {', '.join(sorted(builders))}")
    g = builders[args.name]()
    export_onnx(g, args.output)
    print(f"wrote {args.output}: {g.summary()}")
    return 0


# Subcommands that live beside the code they drive: (name, module, help). Each module
# has add_arguments(parser) and run(args) -> exit code.
PLUGGED_COMMANDS = [
    ("extract", "taso_egg.extract.cli", "run an extractor on a serialized e-graph (JSON)"),
    ("profile", "taso_egg.profiling.cli", "time each operator configuration of models into a profile"),
    ("search", "taso_egg.search.cli", "TASO's backtracking search (same rules and cost model)"),
    ("compare", "taso_egg.compare", "equality saturation vs backtracking search on the zoo, measured"),
    ("rules", "taso_egg.rules.cli", "generate rewrite rules, prove them, report (TASO's generator)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taso-egg", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="show debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="summarize how an ONNX model maps onto the operator table")
    _add_model_args(p)
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("convert", help="import and re-export an ONNX model, checked in onnxruntime")
    _add_model_args(p)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("optimize", help="saturate, extract the cheapest graph, check it, write ONNX")
    _add_model_args(p)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--extractor", default="ilp", choices=["ilp", "greedy-dag", "tree"])
    p.add_argument("--node-limit", type=int, default=20_000, help="stop past this many e-nodes")
    p.add_argument("--iter-limit", type=int, default=15, help="stop after this many iterations")
    p.add_argument("--time-limit", type=float, default=30.0, help="stop saturating after this many seconds")
    p.add_argument("--multi-iterations", type=int, default=2,
                   help="iterations in which multi-pattern rules run (k_multi)")
    p.add_argument("--rules", action="append", metavar="FILE", help="extra .rules file (repeatable)")
    p.add_argument("--measure", type=int, default=5, metavar="N",
                   help="time original and result N times in onnxruntime; keep the original if the "
                        "result is slower (0: skip)")
    p.add_argument("--min-gain", type=float, default=MIN_GAIN, metavar="F",
                   help=f"keep the original unless the predicted cost drops by more than this "
                        f"fraction (default {MIN_GAIN}: the cost model's measured error on speedups)")
    p.add_argument("--profile", default="cpu-ort",
                   help="cost profile: a shipped name (cpu-ort, cpu-numpy), a file, or 'analytic'")
    p.set_defaults(func=_cmd_optimize)

    p = sub.add_parser("zoo", help="write one of TASO's benchmark graphs (builder-made) as ONNX")
    p.add_argument("name", help="bert, nasrnn, resnext50, resnet50, nasnet-a, inception-v3, squeezenet, "
                                 "vgg19, or NAME-small for the test-sized variant")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=_cmd_zoo)

    for name, module, help_text in PLUGGED_COMMANDS:
        command = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(message)s")
    try:
        return int(args.func(args) or 0)
    except TasoEggError as e:
        print(f"taso-egg: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head & co.
        return 0
    except KeyboardInterrupt:
        print("taso-egg: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
