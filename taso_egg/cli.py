"""The ``taso-egg`` command line. User mistakes end as one line on stderr and exit
code 1, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import signal
import sys

from .cli_args import (CommandParser, add_input_shape_argument, add_optimize_arguments, optimize_options_from_args,
                       parse_input_shapes)
from .errors import ExportError, NotModelled, TasoEggError
from .onnx_io.last_position import parse_last_position
from .ops import OPAQUE
from .product.dims import DEFAULT_LEADING, DEFAULT_OTHER
from .options import Hooks


def _add_model_args(p) -> None:
    p.add_argument("model", help="ONNX file")
    add_input_shape_argument(p, f"the sizes to price, saturate and time a model with symbolic dims at "
                                f"(repeatable); symbolic dims not given are {DEFAULT_LEADING} where they "
                                f"lead an input (a batch) and {DEFAULT_OTHER} elsewhere, one size per "
                                f"dim name; the written model keeps its symbolic dims unless "
                                f"--fix-shapes. Naming no input, changing a dimension the model fixes, "
                                f"or giving one input or one dim name two sizes is an error")


def _add_fix_shapes(p) -> None:
    p.add_argument("--fix-shapes", action="store_true",
                   help="write the model with its symbolic dims fixed at the sizes above (without it "
                        "they stay symbolic, and the written model is checked at two sizes of each)")


def _cmd_inspect(args) -> int:
    from .product.dynamic import DynamicModel
    from .onnx_io.counts import describe
    from .onnx_io.reading import read_model, upgraded
    from .product.dims import describe_sizes

    original = read_model(args.model)
    try:
        dyn = DynamicModel.load(upgraded(original), parse_input_shapes(args.input_shape))
    except NotModelled as e:  # what optimize carries whole
        print(f"{args.model}: {describe(original)}; carried whole (optimize writes it unchanged): {e}")
        return 0
    g = dyn.graph
    print(f"{args.model}: {describe(original)}; opset {g.opset}")
    if dyn.symbolic:
        print(f"  symbolic dims, sized here at: {describe_sizes(dyn.first)}")
    print("  inputs : " + ", ".join(f"{n.params['name']} {n.outputs[0]}" for n in g.inputs()))
    print("  outputs: " + ", ".join(f"{name} {t.type}" for name, t in g.outputs))
    print(f"  weights: {len(g.weights())}")
    counts = g.op_counts(runtime_only=True)
    print(f"  as the operator table holds them: {sum(counts.values())} operators that run "
          f"(shape arithmetic folded, weight-only work counted out)")
    for op, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        extra = ""
        if op == OPAQUE.name:
            kinds = {}
            for n in g.nodes.values():
                if n.op == OPAQUE.name:
                    kinds[n.params["op_type"]] = kinds.get(n.params["op_type"], 0) + 1
            extra = "  (" + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())) + ")"
        print(f"  {op:<15} {count:>5}{extra}")
    return 0


def _cmd_convert(args) -> int:
    """Load, export, and check that onnxruntime computes the same on both files."""

    from .check.onnx_precision import check_precision_kept
    from .check.runtime import onnx_outputs
    from .check.tolerance import compare_outputs
    from .product.dynamic import DynamicModel, write_symbolic
    from .executor import random_inputs
    from .disk.files import check_writable
    from .onnx_io.counts import describe
    from .onnx_io.exporter import export_onnx, save_atomically
    from .onnx_io.reading import read_model_file, upgraded
    from .product.optimize_onnx import at_sizes

    shapes = parse_input_shapes(args.input_shape)
    check_writable(args.output, ExportError, inputs=[args.model])
    original, external = read_model_file(args.model)
    dyn = DynamicModel.load(upgraded(original), shapes, fixed=args.fix_shapes)
    if dyn.symbolic and not args.fix_shapes:
        written = write_symbolic(dyn, dyn.graph)
        if written.model is None:
            raise TasoEggError(f"{args.model}: it cannot be written back with its symbolic dims: "
                               f"{written.why} (--fix-shapes writes it with them fixed)")
        model, agree = written.model, at_sizes(written.errors)
    else:
        model = export_onnx(dyn.graph)
        feeds = random_inputs(dyn.graph)
        agree = f"{compare_outputs(onnx_outputs(dyn.reference, feeds), onnx_outputs(model, feeds), what='exported model'):.2g}"
    check_precision_kept(dyn.reference, model, "exported model")
    summary = describe(model)
    save_atomically(model, args.output, external_data=external)
    print(f"wrote {args.output}: {summary} (input: {describe(original)}); "
          f"outputs agree within {agree} relative")
    return 0


def _cmd_optimize(args) -> int:
    # Everything a user can get wrong is checked before anything heavy loads.
    from .cost import load_cost_model
    from .disk.files import check_writable
    from .product.optimize_onnx import optimize_model
    from .rules.corpus import blame_user_rules, load_user_rules

    options = optimize_options_from_args(args)
    shapes = parse_input_shapes(args.input_shape)
    last_position = parse_last_position(args.last_position)
    check_writable(args.output, ExportError, inputs=[args.model])
    load_cost_model(options.costs.profile)  # loaded again (cached) where it is used
    extra = load_user_rules(args.rules or (), args.allow_unproved)

    from .onnx_io.counts import describe, format_table, operator_counts

    say = _stderr_line
    applied = set()  # rules that matched, to name the user's when the check fails

    def progress(it):
        applied.update(it.matches)
        top = sorted(it.matches.items(), key=lambda kv: -kv[1])[:3]
        say(f"  iteration {it.iteration:>2}: {it.enodes:>7} e-nodes {it.eclasses:>7} e-classes "
            f"{it.seconds:6.2f} s  " + ", ".join(f"{k} x{v}" for k, v in top))

    with _Rounds("timing") as rounds, blame_user_rules(extra, applied):
        written, report = optimize_model(args.model, args.output, input_shapes=shapes, fix_shapes=args.fix_shapes,
                                         last_position=last_position, extra_rules=extra, options=options,
                                         read_back=False,  # only its operators are counted
                                         hooks=Hooks(progress=progress, phase=say, measure_progress=rounds.update))
    out = report.details
    unchanged = "the input, its outputs read at the last position" if last_position else "the input, unchanged"
    if out is None:  # a valid model, but not one the table models: carried whole
        say(f"note: {report.why}")
        print(f"wrote {args.output}: {describe(written)} ({unchanged})")
        return 0
    _print_summary(out.result, report)
    for note in out.notes:
        print(note)
    print(format_table(operator_counts(out.source.original), operator_counts(written)))
    names = {**_CANDIDATE_NAMES, "original": unchanged}
    print(f"wrote {args.output}: {describe(written)}"
          + (f" ({names[out.chosen]})" if out.chosen != "result" else ""))
    return 0


_CANDIDATE_NAMES = {"original": "the input, unchanged",
                    "re-export": "the input, re-exported: the importer's clean-up",
                    "result": "the extracted graph"}


def _print_summary(result, report) -> None:
    from .product.decide import predicted_below

    st = result.stats
    kept = st.kept_input
    before, extracted = result.cost_before, st.extracted_cost  # as a runtime runs each
    predicted = before / extracted if extracted > 0 else math.inf
    if st.guard:
        _print_guard(st.guard, st.chosen, predicted, result.cost_model, st.decision.predictions)
    elif st.decision.predictions:  # asked to measure, but nothing could gain: timed nothing
        print(f"speedup: none predicted, so nothing was timed (predicted over the original: "
              f"{predicted_below(st.decision.predictions)})")
    else:
        print(f"speedup: not measured; predicted {predicted:.3f}x ({result.cost_model})")
    if st.decision.not_measured:
        print(f"note: not measured: {', '.join(st.decision.not_measured)} (the re-exported input, "
              f"the importer's clean-up, may run faster than the original; --measure N times it)")
    # the input as the caller asked it read (--last-position) is what candidates are compared with
    change = f" ({report.interface_change})" if report.interface_change else ""
    if kept:
        print(f"result: {_CANDIDATE_NAMES[st.chosen]} is written{change}: {kept}; the extracted graph was "
              f"predicted at {extracted * 1e3:.4g} ms against the input's {before * 1e3:.4g} ms")
    else:
        print(f"result: the extracted graph replaces the input{change} (predicted "
              f"{extracted * 1e3:.4g} ms against {before * 1e3:.4g} ms)")
    sat, ext = st.saturation, st.extraction
    print(f"e-graph: {sat.enodes} e-nodes, {st.eclasses} e-classes after {len(sat.iterations)} "
          f"iterations; stopped: {sat.stop_reason}")
    print(f"time: {report.seconds:.1f} s: {st.phases.line()}; extraction {ext.extractor}, {ext.status}")
    if st.check.kind == "onnxruntime":
        print(f"check: the written model's outputs equal the input's within {st.check.ort_error:.2g} "
              f"relative in onnxruntime (float32, random inputs)")
    elif st.check.kind == "regions":
        lc = st.check.local
        print(f"check: {st.check.skipped}, so the extracted graph was checked in our executor (float64, "
              f"tracked exponents) region by region: {lc.recomputed} of its {lc.nodes} nodes in "
              f"{lc.regions} changed region(s), recomputed from the input's own tensors, equal the "
              f"input's within {st.check.error:.2g} relative")
    elif st.check.kind == "whole":
        print(f"check: {st.check.skipped}, so the extracted graph was checked in our executor (float64, "
              f"tracked exponents): its outputs equal the input's within {st.check.error:.2g} relative")
    elif st.chosen == "original":
        print("check: none needed (the input is written; the extracted graph, not written, was not checked)")


def _print_guard(guard, chosen: str, predicted: float, cost_model: str, profiled: dict) -> None:
    """The headline speedup with its interval, what predicted it, and each candidate's line."""
    from .product.guard import format_ratio

    how = (f"onnxruntime ORT_ENABLE_ALL, 1 thread, CPU time, {guard.rounds} paired rounds in "
           f"{guard.seconds:.1f} s; {100 * guard.confidence:.0f} % interval")
    # the reach too where it, not the speedup, is why the result was timed
    kernels = ", ".join(f"the {name} {p.speedup:.3f}x" + (f" (at most {p.reach:.3f}x)" if name == "result"
                        and f"{p.reach:.3f}" != f"{p.speedup:.3f}" else "") for name, p in profiled.items())
    forecast = (f"predicted from onnxruntime's kernel profiles: {kernels}; " if kernels else "predicted: ") + \
        f"the result {predicted:.3f}x by the cost model ({cost_model})"
    if chosen == "original":
        print(f"speedup: none confirmed; the original is written ({how}); {forecast}")
    else:
        print(f"speedup: measured {format_ratio(guard.comparisons[chosen])} in onnxruntime (the written "
              f"{chosen} against the original; {how}); {forecast}")
    print(f"  {'candidate':<10} {'median ms':>10} {'vs original':>12} {'interval':>18}  decision")
    for name, t in guard.medians.items():
        c = guard.comparisons.get(name)
        line = f"  {name:<10} {t:>10.3f}"
        if c is not None:
            line += f" {c.ratio:>11.3f}x {f'[{c.low:.3f}, {c.high:.3f}]':>18}  {c.decision}"
        print(line + ("  <- written" if name == chosen else ""))


def _stderr_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _Rounds:
    """A progress bar on stderr for measured runs, opened at the first update."""

    def __init__(self, what: str):
        self.what, self.bar = what, None

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=f"  {self.what}", unit="run", file=sys.stderr,
                            leave=False)
        self.bar.update(done - self.bar.n)
        if done >= total:  # gone before what follows the timing is said
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def _cmd_zoo(args) -> int:
    from .research import zoo
    from .disk.files import check_writable
    from .onnx_io.counts import describe
    from .onnx_io.exporter import export_onnx

    builders = zoo.MODELS
    if args.name not in builders:
        raise TasoEggError(f"unknown zoo model {args.name!r}; choose from {', '.join(sorted(builders))}")
    check_writable(args.output, ExportError)
    model = export_onnx(builders[args.name](), args.output)
    print(f"wrote {args.output}: {describe(model)}")
    return 0


# Subcommands that live beside the code they drive: (name, module, help). Each module
# has add_arguments(parser) and run(args) -> exit code.
PLUGGED_COMMANDS = [
    ("extract", "taso_egg.extract.extract_command", "run an extractor on a serialized e-graph (JSON)"),
    ("profile", "taso_egg.profiling.profile_command", "time each operator configuration of models into a profile"),
    ("search", "taso_egg.research.search.search_command", "TASO's backtracking search (same rules and cost model)"),
    ("compare", "taso_egg.research.compare", "equality saturation vs backtracking search on the zoo, measured"),
    ("rules", "taso_egg.generator.rules_command", "generate rewrite rules, prove them, report (TASO's generator)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="taso-egg", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="show debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="summarize how an ONNX model maps onto the operator table")
    _add_model_args(p)
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("convert", help="import and re-export an ONNX model, checked in onnxruntime")
    _add_model_args(p)
    _add_fix_shapes(p)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("optimize", help="saturate, extract the cheapest graph, check it, write ONNX")
    _add_model_args(p)
    _add_fix_shapes(p)
    p.add_argument("-o", "--output", required=True)
    add_optimize_arguments(p)
    p.add_argument("--rules", action="append", metavar="FILE",
                   help="extra .rules file (repeatable); its rules must carry proof records "
                        "(taso-egg rules verify FILE writes them)")
    p.add_argument("--allow-unproved", action="store_true",
                   help="apply --rules' rules that are not proved (the check still guards the result)")
    p.add_argument("--last-position", action="append", metavar="OUTPUT[:AXIS]",
                   help="the caller reads only the last position of OUTPUT along AXIS (default 1), as a "
                        "generation loop reads logits: that output becomes its last position (the axis "
                        "becomes 1), the one change of interface optimize makes, and only when asked "
                        "(repeatable)")
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


class Terminated(BaseException):
    """SIGTERM, raised where Python is so that ``finally`` blocks (temporary files)
    run, as they do for Ctrl-C."""


def _terminate(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(message)s")
    previous = signal.signal(signal.SIGTERM, _terminate)
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
    except Terminated:
        print("taso-egg: terminated", file=sys.stderr)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
