"""Optimization benchmark. Prints tables; timings are this machine's, this run's.

- Zoo models (default): per model and extractor, in a fresh process each (so that
  peak memory is the model's own): load (building the model and loading the rule
  corpus), saturation, extraction, check and total ``optimize`` seconds (``measure=0``:
  everything but timing candidates in onnxruntime), next to Tensat's published search
  time and the ratio; peak RSS next to the model's float32 weights. ``--corpora hand
  default`` runs each model with each rule corpus (interleaved), to see what the
  generated rules find that the hand rules miss.
- ``--bert-layers 1 2 4 ...``: TASO's BERT at those depths, to see how time and
  memory grow per layer.
- ``--onnx DIR``: every ``*.onnx`` file of a folder (real exports), optimized as
  ``taso-egg optimize`` does, then the written model timed against the original in
  onnxruntime (ORT_ENABLE_ALL, 1 and 2 threads, interleaved runs, medians)."""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path

from .cli_args import CommandParser
from .errors import TasoEggError

# Tensat's search seconds for TASO's models (Yang et al. 2021, Table 2; V100 host).
TENSAT_SECONDS = {"bert": 1.4, "resnext50": 0.7, "nasnet-a": 10.6, "nasrnn": 0.5,
                  "inception-v3": 5.1, "squeezenet": 0.3, "vgg19": 0.4}
ZOO_DEFAULT = ("bert", "nasrnn")
MB = 1 << 20


def build_parser() -> argparse.ArgumentParser:
    from . import zoo
    from .cli_args import add_optimize_arguments
    from .options import DAG_EXTRACTORS

    p = CommandParser(prog="python -m taso_egg.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(zoo.MODELS),
                   help=f"zoo models (default: {' '.join(ZOO_DEFAULT)}, unless --bert-layers "
                        f"or --onnx is given)")
    p.add_argument("--bert-layers", nargs="+", type=int, metavar="N",
                   help="also TASO's BERT with N layers (each a row)")
    p.add_argument("--onnx", metavar="DIR", help="benchmark every *.onnx file of DIR instead")
    p.add_argument("--extractors", nargs="+", default=list(DAG_EXTRACTORS),
                   help="zoo models: a row per extractor (default: %(default)s); --onnx takes --extractor")
    p.add_argument("--corpora", nargs="+", default=["default"], metavar="CORPUS",
                   help="rule corpora, a row each, interleaved per model: 'default' (what "
                        "optimize loads), 'hand' (the hand rules alone), 'generated' (the shipped "
                        "generated rules alone), or a generated rule file's path (the hand rules "
                        "and that file's proved rules, in place of the shipped generated ones)")
    # optimize's own options and defaults; zoo rows time nothing (measure 0), --onnx rows
    # run as `taso-egg optimize` does and time the written model with --measure runs too
    add_optimize_arguments(p)
    p.add_argument("--kernel-shares", action="store_true",
                   help="--onnx: also print where onnxruntime spends the original's kernel time, "
                        "by operator as it runs them after its own fusions (what any rewrite "
                        "can win at most)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    from .generator.derive import is_corpus

    for corpus in args.corpora:
        if corpus == "axioms" or not is_corpus(corpus):  # the axioms both ways are no corpus to optimize with
            p.error(f"--corpora: {corpus!r} is neither 'default', 'hand', 'generated' nor a rule file")
    try:
        _optimize_options(vars(args))  # out-of-range options: one line before any work
    except TasoEggError as e:
        p.error(str(e))
    if args.onnx:
        return _onnx_table(args)
    models = [(name, {}) for name in (args.models or ([] if args.bert_layers else ZOO_DEFAULT))]
    models += [(f"bert-L{n}", {"layers": n}) for n in args.bert_layers or ()]
    return _zoo_table(models, args)


# --- zoo -----------------------------------------------------------------------------------

def _zoo_table(models, args) -> int:
    header = (f"{'model':<17}{'extractor':<11}{'corpus':<10}{'rules':>6}{'nodes':>6}{'e-nodes':>8}{'iters':>6}{'load s':>8}"
              f"{'sat s':>7}{'ext s':>7}{'check s':>8}{'total s':>8}{'tensat s':>9}{'ratio':>7}"
              f"{'RSS MB':>8}{'wts MB':>8}{'RSS/(2w+400)':>13}{'speedup':>9}{'s+e cpu':>8}{'cpu s':>7}"
              f"  check, error / stop")
    print(header, flush=True)
    context = multiprocessing.get_context("spawn")  # a fresh process: its own peak RSS
    worst_ratio, cost_model = 0.0, ""
    for name, kwargs in models:
        for extractor, corpus in ((x, c) for x in args.extractors for c in args.corpora):
            label = _corpus_label(corpus)
            with context.Pool(1) as pool:
                try:
                    row = pool.apply(_zoo_row, (name, kwargs, extractor, corpus, vars(args)))
                except Exception as e:  # a failing model is a row, not the end of the table
                    print(f"{name:<17}{extractor:<11}{label:<10}  failed: {type(e).__name__}: {e}", flush=True)
                    continue
            cost_model = row["cost_model"]
            tensat = TENSAT_SECONDS.get(name)
            ratio = row["total"] / tensat if tensat else None
            worst_ratio = max(worst_ratio, ratio or 0.0)
            budget = 2 * row["weights_mb"] + 400
            check = row["check_kind"] or "input returned, not checked"
            if row["check_error"] is not None:
                check += f" {row['check_error']:.1e}"
            print(f"{name:<17}{extractor:<11}{label:<10}{row['rules']:>6}{row['nodes']:>6}{row['enodes']:>8}{row['iterations']:>6}"
                  f"{row['load']:>8.2f}{row['sat']:>7.2f}{row['ext']:>7.2f}{row['check']:>8.2f}"
                  f"{row['total']:>8.2f}{_or_dash(tensat, '>9.1f')}{_or_dash(ratio, '>7.2f')}"
                  f"{row['rss_mb']:>8.0f}{row['weights_mb']:>8.0f}{row['rss_mb'] / budget:>13.2f}"
                  f"{row['speedup']:>8.3f}x{row['sat_ext_cpu']:>8.2f}{row['cpu']:>7.2f}"
                  f"  {check} / {row['stop']}", flush=True)
    print(f"costs: {cost_model}. load s = building the model + loading the rule corpus; total s = "
          f"the optimize call (conversion, saturation, extraction, decision, the check of what is "
          f"returned; no onnxruntime timing); check s = the check stage (export, onnxruntime, our "
          f"executor), the last column naming the check that ran (onnxruntime, regions: the changed "
          f"regions in float64, whole) and its relative error; ratio = total / Tensat's published search time; RSS = "
          f"the process's peak resident memory (one process per row), wts = the model's float32 "
          f"weights; s+e cpu = this process's CPU seconds in saturation and extraction, cpu s = in "
          f"the whole optimize call (onnxruntime's threads included; on a shared machine steadier "
          f"than the wall-clock columns)")
    return 0


def _corpus_label(corpus: str) -> str:
    from .generator.derive import corpus_label

    return corpus_label(corpus)[:9]


def _corpus(corpus: str) -> list:
    """What ``optimize`` would load (orientations included) for a corpus name or file."""
    from .generator.derive import corpus_for

    return corpus_for(corpus, orientations=None)


def _zoo_row(name: str, kwargs: dict, extractor: str, corpus: str, options: dict) -> dict:
    from . import zoo
    from .api import optimize

    t0 = time.perf_counter()
    build = zoo.MODELS["bert" if name.startswith("bert-L") else name]
    g = build(**kwargs)
    rules = _corpus(corpus)
    load = time.perf_counter() - t0
    weights = sum(n.outputs[0].size for n in g.weights()) * 4
    t0, cpu0 = time.perf_counter(), time.process_time()
    r = optimize(g, rules=rules, options=_optimize_options(options, extractor=extractor, measure=0))
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    st = r.stats
    return {"rules": len(rules), "nodes": len(g.nodes), "enodes": st.enodes, "iterations": st.iterations, "load": load,
            "sat": st.saturation_seconds, "ext": st.extraction_seconds, "check": st.check_seconds,
            "check_kind": st.check, "check_error": _error(st), "total": total, "stop": st.stop_reason,
            "speedup": r.speedup, "cost_model": r.cost_model, "weights_mb": weights / MB,
            "rss_mb": _peak_rss_mb(), "cpu": cpu, "sat_ext_cpu": st.saturation_cpu + st.extraction_cpu}


# --- real exports --------------------------------------------------------------------------

def _onnx_table(args) -> int:
    measure = _optimize_options(vars(args)).decision.measure
    files = sorted(Path(args.onnx).glob("*.onnx"))
    if not files:
        print(f"error: {args.onnx}: no *.onnx files", file=sys.stderr)
        return 2
    print(f"{'model':<28}{'corpus':<10}{'nodes':>6}{'opaque':>8}{'optimize s':>11}{'predicted':>10}{'result':>9}"
          f"{'1 thread':>10}{'2 threads':>10}{'max rel err':>12}{'RSS MB':>8}  written", flush=True)
    context = multiprocessing.get_context("spawn")
    for path, corpus in ((p, c) for p in files for c in args.corpora):
        label = _corpus_label(corpus)
        with context.Pool(1) as pool:
            try:
                row = pool.apply(_onnx_row, (str(path), corpus, vars(args)))
            except Exception as e:  # one bad file is a row, not the end of the table
                print(f"{path.name:<28}{label:<10}  failed: {type(e).__name__}: {e}", flush=True)
                continue
        err = "-" if row["error"] is None else f"{row['error']:.1e}"
        print(f"{path.name:<28}{label:<10}{row['nodes']:>6}{row['opaque']:>8}{row['seconds']:>11.1f}"
              f"{row['predicted']:>9.3f}x{_ratio(row['result'], 9)}{_ratio(row['speedup1'], 10, 'same')}"
              f"{_ratio(row['speedup2'], 10, 'same')}{err:>12}{row['rss_mb']:>8.0f}  {row['chosen']}", flush=True)
        if row["shares"]:
            print("    kernel time of the original by operator: " + ", ".join(
                f"{op} {100 * share:.1f} %" for op, share in row["shares"]), flush=True)
    print(f"opaque = ONNX nodes our table does not cover (carried through unchanged); predicted = the "
          f"cost model's speedup of the extracted result over the input as a runtime runs it (what "
          f"optimize's decision weighs); result = its speedup as optimize measured it "
          f"(onnxruntime, one thread, median of {measure} interleaved runs; - when it computes "
          f"what the input does); 1/2 threads = the written model against the original file, "
          f"onnxruntime ORT_ENABLE_ALL, median of {measure} interleaved runs (same: the original "
          f"was written); written = the candidate optimize wrote (original, re-export or result); max "
          f"rel err = the check of the written model against the original (- when it is the original)")
    return 0


def _onnx_row(path: str, corpus: str, options: dict) -> dict:
    from . import timing
    from .executor import random_inputs
    from .onnx_optimize import OnnxInput, optimize_onnx

    source = OnnxInput.read(path)  # symbolic dims at optimize's default sizes
    reference = source.dynamic.reference  # what onnxruntime runs as the original
    t0 = time.perf_counter()
    optimize_options = _optimize_options(options)
    measure = optimize_options.decision.measure
    out = optimize_onnx(source, rules=_corpus(corpus), options=optimize_options)
    seconds = time.perf_counter() - t0
    r = out.result
    st = r.stats
    speedups = {1: None, 2: None}
    feeds = random_inputs(source.dynamic.graph)
    if out.chosen != "original":  # else the file written is the original's bytes
        written = out.model
        for threads in speedups:
            runs = timing.ort_runs({"original": reference, "written": written}, feeds, measure,
                                   threads=threads)
            speedups[threads] = statistics.median(runs["original"]) / statistics.median(runs["written"])
    ms = st.measured_ms or {}
    return {"nodes": len(reference.graph.node), "opaque": st.ops_before.get("opaque", 0),
            "seconds": seconds, "predicted": r.cost_before / st.extracted_cost if st.extracted_cost else 1.0,
            "result": ms["original"] / ms["result"] if "result" in ms and "original" in ms else None,
            "speedup1": speedups[1], "speedup2": speedups[2], "error": _error(st),
            "chosen": out.chosen, "rss_mb": _peak_rss_mb(),
            "shares": _kernel_shares(reference, feeds) if options["kernel_shares"] else []}


def _kernel_shares(model, feeds, runs: int = 10, shown: int = 6) -> list[tuple[str, float]]:
    """The largest shares of onnxruntime's kernel time (ORT_ENABLE_ALL, one thread) by
    operator, the rest summed as 'other'."""
    from collections import Counter

    from .timing import kernel_times

    per_op = Counter()
    for event in kernel_times(model, feeds, runs):
        per_op[event["op"]] += event["us"]
    total = sum(per_op.values()) or 1
    top = [(op, us / total) for op, us in per_op.most_common(shown)]
    rest = 1 - sum(share for _, share in top)
    return top + ([("other", rest)] if rest > 0.0005 else [])


# --- helpers -------------------------------------------------------------------------------

def _optimize_options(parsed: dict, extractor: str | None = None, measure: int | None = None):
    """The ``OptimizeOptions`` of the parsed command line (a dict, as a worker process
    gets it), with a row's extractor or measured runs in place of the command's."""
    from dataclasses import replace

    from .cli_args import optimize_options_from_args

    options = optimize_options_from_args(argparse.Namespace(**parsed))
    if extractor is not None:
        options = replace(options, extraction=replace(options.extraction, extractor=extractor))
    if measure is not None:
        options = replace(options, decision=replace(options.decision, measure=measure))
    return options


def _error(stats) -> float | None:
    """The relative error of the check that ran (onnxruntime's or our executor's)."""
    errors = [e for e in (stats.check_error, stats.ort_check_error) if e is not None]
    return max(errors) if errors else None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _ratio(value, width: int, missing: str = "-") -> str:
    return f"{value:>{width - 1}.3f}x" if value is not None else format(missing, f">{width}")


def _or_dash(value, spec: str) -> str:
    width = spec.lstrip("<>").split(".")[0]
    return format(value, spec) if value is not None else format("-", ">" + width)


if __name__ == "__main__":
    sys.exit(main())
