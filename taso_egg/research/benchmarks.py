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
  onnxruntime (ORT_ENABLE_ALL, 1 and 2 threads, interleaved runs, medians).
- ``--onnx DIR --peers``: also what other tools make of each file, timed in the same
  interleaved sessions and checked against the original on the same inputs: onnxsim,
  onnxslim, onnxruntime's transformers optimizer (transformers only) and taso-egg
  applied after onnxslim. onnxsim and onnxslim are an optional extra:
  ``pip install 'taso-egg[peers]'`` (a peer not installed is a cell saying so).
- ``--generate ORIGINAL OTHER ...``: decoders with a key/value cache run as a generation
  loop does (a prompt, then new tokens one at a time; ``taso_egg.product.generate``): time to
  the first token and tokens per second of each, against the first, with an A/A row, and
  each one's logits compared with the first's at every step; with ``--step-at 31 255``, one
  decode step on a cache of each length instead, in CPU time, paired as the guard pairs."""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..cli_args import CommandParser
from ..errors import TasoEggError
from ..ops import OPAQUE
from ..product.phases import ORDER, PhaseTimes

# Tensat's search seconds for TASO's models (Yang et al. 2021, Table 2; V100 host).
TENSAT_SECONDS = {"bert": 1.4, "resnext50": 0.7, "nasnet-a": 10.6, "nasrnn": 0.5,
                  "inception-v3": 5.1, "squeezenet": 0.3, "vgg19": 0.4}
ZOO_DEFAULT = ("bert", "nasrnn")
MB = 1 << 20


def build_parser() -> argparse.ArgumentParser:
    from . import zoo
    from ..cli_args import add_optimize_arguments
    from ..options import DAG_EXTRACTORS

    p = CommandParser(prog="python -m taso_egg.research.benchmarks", description=__doc__,
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
    p.add_argument("--peers", action="store_true",
                   help="--onnx: also time onnxsim, onnxslim, onnxruntime's transformers optimizer "
                        "(transformers only) and taso-egg after onnxslim beside taso-egg, in the same "
                        "sessions, with each one's error against the original (a table of its own; "
                        "install the peers with: pip install 'taso-egg[peers]')")
    p.add_argument("--generate", nargs="+", metavar="MODEL",
                   help="decoders with a key/value cache (the original first, then e.g. what optimize "
                        "wrote and onnxruntime-genai's model of the same weights): generation timed "
                        "end to end, logits compared at every step")
    p.add_argument("--prompt-tokens", type=int, default=64, metavar="P",
                   help="--generate: prompt length (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, default=64, metavar="N",
                   help="--generate: tokens generated after the prompt (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, metavar="R",
                   help="--generate: rounds, each model once per round (default: %(default)s)")
    p.add_argument("--step-at", type=int, nargs="+", metavar="PAST",
                   help="--generate: time one decode step on a cache of each of these lengths (CPU time, "
                        "the guard's paired interval) instead of a generation")
    p.add_argument("--floor", action="store_true",
                   help="--step-at: also time the first model's weight products alone on one token (q/k/v "
                        "and gate/up packed), the step's floor, as a row of its own")
    p.add_argument("--padded", action="store_true",
                   help="--generate: feed a batch of 2 as transformers' generate does (left padding, a "
                        "hole in the mask, then several tokens on the cache, then single steps) and compare "
                        "every model with the first at every call, instead of timing")
    p.add_argument("--threads", type=int, default=1, metavar="T",
                   help="--generate: onnxruntime's intra-op threads in every session, as a user runs the "
                        "model (default: %(default)s; above 1, --step-at times wall time, not CPU time)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    from ..generator.derive import is_corpus

    for corpus in args.corpora:
        if corpus == "axioms" or not is_corpus(corpus):  # the axioms both ways are no corpus to optimize with
            p.error(f"--corpora: {corpus!r} is neither 'default', 'hand', 'generated' nor a rule file")
    try:
        _optimize_options(vars(args))  # out-of-range options: one line before any work
    except TasoEggError as e:
        p.error(str(e))
    if args.generate:
        return _generate_table(args, p)
    if args.onnx:
        return _onnx_table(args)
    models = [(name, {}) for name in (args.models or ([] if args.bert_layers else ZOO_DEFAULT))]
    models += [(f"bert-L{n}", {"layers": n}) for n in args.bert_layers or ()]
    return _zoo_table(models, args)


# --- generation ----------------------------------------------------------------------------

def _generate_table(args, parser) -> int:
    from ..product import generate

    for name, least in (("--prompt-tokens", args.prompt_tokens), ("--new-tokens", args.new_tokens - 1),
                        ("--rounds", args.rounds)):
        if least < 1:
            parser.error(f"{name}: must be at least {2 if name == '--new-tokens' else 1}")
    for path in args.generate:
        if not Path(path).is_file():
            parser.error(f"--generate: {path}: no such file")

    def progress(done: int, total: int) -> None:
        print(f"  round {done}/{total}", file=sys.stderr, flush=True)

    if args.threads < 1:
        parser.error("--threads: must be at least 1")
    if args.floor and not args.step_at:
        parser.error("--floor: times a decode step's floor beside --step-at; give --step-at too")
    if args.step_at and min(args.step_at) < 0:
        parser.error("--step-at: cache lengths must be at least 0")
    if args.padded and (args.step_at or args.floor):
        parser.error("--padded compares the models' outputs; it times nothing, so takes no --step-at or --floor")
    try:
        if args.padded:
            from ..product import padded

            text = padded.table(padded.run_padded(args.generate, args.threads))
        elif args.step_at:
            pasts = tuple(args.step_at)
            rows = generate.measure_steps(args.generate, pasts, args.rounds, progress=progress,
                                          threads=args.threads, floor=args.floor)
            text = generate.step_table(rows, pasts, args.threads)
        else:
            rows = generate.measure(args.generate, args.prompt_tokens, args.new_tokens, args.rounds,
                                    progress=progress, threads=args.threads)
            text = generate.table(rows, args.prompt_tokens, args.new_tokens, args.threads)
    except TasoEggError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(text, flush=True)
    return 0


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
    from ..generator.derive import corpus_label

    return corpus_label(corpus)[:9]


def _corpus(corpus: str) -> list:
    """What ``optimize`` would load (orientations included) for a corpus name or file."""
    from ..generator.derive import corpus_for

    return corpus_for(corpus, orientations=None)


def _zoo_row(name: str, kwargs: dict, extractor: str, corpus: str, options: dict) -> dict:
    from . import zoo
    from ..product.optimize_graph import optimize

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
    sat, ext = st.saturation, st.extraction
    return {"rules": len(rules), "nodes": len(g.nodes), "enodes": sat.enodes, "iterations": len(sat.iterations),
            "load": load, "sat": sat.seconds, "ext": ext.seconds, "check": st.check.seconds,
            "check_kind": st.check.kind, "check_error": _error(st.check), "total": total, "stop": sat.stop_reason,
            "speedup": r.speedup, "cost_model": r.cost_model, "weights_mb": weights / MB,
            "rss_mb": _peak_rss_mb(), "cpu": cpu, "sat_ext_cpu": sat.cpu_seconds + ext.cpu_seconds}


# --- real exports --------------------------------------------------------------------------

def _onnx_table(args) -> int:
    from ..product.decide import PRICED_ABOVE, PROFILE_ERROR, REEXPORT_ABOVE
    from ..product.guard import MARGIN

    measure = _optimize_options(vars(args)).decision.measure
    files = sorted(Path(args.onnx).glob("*.onnx"))
    if not files:
        print(f"error: {args.onnx}: no *.onnx files", file=sys.stderr)
        return 2
    print(f"{'model':<28}{'corpus':<10}{'nodes':>6}{'opaque':>8}{'optimize s':>11}{'predicted':>10}{'re-export':>10}"
          f"{'result':>21}{'error':>8}{'1 thread':>21}{'2 threads':>21}{'max rel err':>12}{'RSS MB':>8}"
          f"  {'s per phase: ' + '/'.join(PHASE_ABBREVIATIONS.values()):<40}  written", flush=True)
    context = multiprocessing.get_context("spawn")
    peer_rows = []
    for path, corpus in ((p, c) for p in files for c in args.corpora):
        label = _corpus_label(corpus)
        with context.Pool(1) as pool:
            try:
                row = pool.apply(_onnx_row, (str(path), corpus, vars(args)))
            except Exception as e:  # one bad file is a row, not the end of the table
                print(f"{path.name:<28}{label:<10}  failed: {type(e).__name__}: {e}", flush=True)
                continue
        if row["peers"]:
            peer_rows.append((path.name, label, row["peers"]))
        err = "-" if row["error"] is None else f"{row['error']:.1e}"
        reexport = row["predictions"].get("re-export")
        print(f"{path.name:<28}{label:<10}{row['nodes']:>6}{row['opaque']:>8}{row['seconds']:>11.1f}"
              f"{row['predicted']:>9.3f}x{_or_dash(reexport, '>9.3f') + ('x' if reexport else ''):>10}"
              f"{_ratio(row['result'], 21, '-' if row['timed'] else 'untimed')}"
              f"{_prediction_error(row['predicted'], row['result'])}"
              f"{_ratio(row['speedup1'], 21, 'same')}"
              f"{_ratio(row['speedup2'], 21, 'same')}{err:>12}{row['rss_mb']:>8.0f}  "
              f"{_phase_cells(row['phases']):<40}  {row['chosen']}", flush=True)
        if row["shares"]:
            print("    kernel time of the original by operator: " + ", ".join(
                f"{op} {100 * share:.1f} %" for op, share in row["shares"]), flush=True)
    print(f"opaque = ONNX nodes our table does not cover (carried through unchanged); predicted = the "
          f"cost model's speedup of the extracted result over the input as a runtime runs it (what "
          f"optimize's decision weighs); result = its speedup as optimize's guard measured it "
          f"(onnxruntime, one thread, CPU time, paired interleaved rounds, at most {measure}: "
          f"Hodges-Lehmann ratio (95 % interval); - when it computes what the input does or was "
          f"not timed beside a re-export that was; untimed: no candidate was); error = "
          f"predicted over result, less 1 (the cost model's, costs calibrated on one onnxruntime profile "
          f"of the input unless --calibration none); re-export = its speedup predicted from one "
          f"onnxruntime profile of it and of the original, matched kernel for kernel (untimed: no "
          f"candidate was predicted to gain enough, {REEXPORT_ABOVE:g}x for the re-export, "
          f"for the result {1 + MARGIN:g}x reached with its own memory-bound kernels {PROFILE_ERROR:.0%} faster than "
          f"profiled, or {PRICED_ABOVE:g}x by the cost model); 1/2 "
          f"threads = the written model against the original file by the same guard, onnxruntime "
          f"ORT_ENABLE_ALL (2 threads: wall time; same: the original was written); written = the "
          f"candidate optimize wrote (original, re-export or result); max "
          f"rel err = the check of the written model against the original (- when it is the original); "
          f"s per phase = optimize's seconds reading, calibrating and predicting, saturating, extracting, "
          f"writing with symbolic dims, timing, checking")
    if args.peers:
        _peers_table(peer_rows, measure)
    return 0


def _onnx_row(path: str, corpus: str, options: dict) -> dict:
    from ..product import timing
    from ..executor import random_inputs
    from ..product.optimize_onnx import OnnxInput, optimize_onnx
    from ..options import Hooks

    phases = PhaseTimes()
    t0 = time.perf_counter()
    with phases("reading"):
        source = OnnxInput.read(path)  # symbolic dims at optimize's default sizes
    reference = source.dynamic.reference  # what onnxruntime runs as the original
    optimize_options = _optimize_options(options)
    measure = optimize_options.decision.measure
    out = optimize_onnx(source, rules=_corpus(corpus), options=optimize_options, hooks=Hooks(phase_times=phases))
    seconds = time.perf_counter() - t0
    r = out.result
    st = r.stats
    feeds = random_inputs(source.dynamic.graph)
    candidates = {"original": reference}
    if out.chosen != "original":  # else the file written is the original's bytes
        candidates[TASO_EGG] = out.model
    peers = _peer_candidates(source, out, corpus, optimize_options, feeds) if options["peers"] else {}
    candidates.update({name: cell.model for name, cell in peers.items() if cell.timed})
    speedups = {1: {}, 2: {}}
    if len(candidates) > 1:
        for threads in speedups:  # every candidate in one interleaved session, by optimize's guard
            with timing.pinned_threads():
                speedups[threads] = _measured(timing.ort_rounds(candidates, feeds, threads), list(candidates),
                                              measure)
    for name, cell in peers.items():
        if cell.timed:
            cell.speedup1, cell.speedup2 = speedups[1][name], speedups[2][name]
    return {"nodes": len(reference.graph.node), "opaque": st.ops_before.get(OPAQUE.name, 0),
            "seconds": seconds, "predicted": r.cost_before / st.extracted_cost if st.extracted_cost else 1.0,
            "phases": dict(phases.ordered()), "predictions": {name: p.speedup for name, p in st.decision.predictions.items()},
            "timed": st.guard is not None,
            "result": st.guard.comparisons.get("result") if st.guard else None,
            "speedup1": speedups[1].get(TASO_EGG), "speedup2": speedups[2].get(TASO_EGG), "error": _error(st.check),
            "chosen": out.chosen, "rss_mb": _peak_rss_mb(),
            "shares": _kernel_shares(reference, feeds) if options["kernel_shares"] else [],
            "peers": {name: cell.shown() for name, cell in peers.items()}}


def _measured(next_round, names: list[str], most: int) -> dict:
    """Each candidate's speedup over ``names[0]`` from a fixed number of paired rounds,
    as many as fit in the guard's time budget (the first round's time tells; at least
    MIN_ROUNDS, at most ``most``), looked at once: a measurement, not a decision, so
    the interval's level is split over the candidates only (over the guard's looks too,
    five candidates timed for ten rounds would get no finite interval)."""
    import math

    from ..product.guard import run_guard, time_budget
    from ..options import MIN_ROUNDS

    start = time.perf_counter()
    first = [next_round()]
    pace = max(time.perf_counter() - start, 1e-6)
    rounds = max(MIN_ROUNDS, min(most, int(time_budget(pace) / pace)))
    replay = lambda timed: first.pop() if first else next_round(timed)  # noqa: E731  the first round counts
    report = run_guard(replay, names, min_rounds=rounds, max_rounds=rounds, seconds=math.inf)
    return dict(report.comparisons)


# --- peers ---------------------------------------------------------------------------------

TASO_EGG = "taso-egg"
AFTER_SLIM = "onnxslim+taso-egg"
PEER_CELL = 50  # two speedups with their intervals and an error
PEER_REASON = 32  # a longer reason is named in the cell and given whole below the row


@dataclass
class _PeerCell:
    """One candidate of the peers table: its model (None when there is none to time),
    why not, or what it equals; its speedups and its error against the original."""

    model: object | None = None
    why: str = ""
    how: str = ""  # how a peer was run, where that was guessed
    error: float | None = None
    speedup1: object | None = None  # a guard Comparison
    speedup2: object | None = None

    @property
    def timed(self) -> bool:
        return self.model is not None and not self.why

    def shown(self) -> dict:
        """What the table prints (the model stays in the worker)."""
        return {"why": self.why, "how": self.how, "error": self.error, "speedup1": self.speedup1,
                "speedup2": self.speedup2}


def _peer_candidates(source, out, corpus: str, options, feeds) -> dict[str, _PeerCell]:
    """taso-egg's written model and each peer's model as cells of the peers table, each
    checked against the original on ``feeds``; taso-egg applied to onnxslim's model as
    ``taso-egg optimize`` would be to its file."""
    import os
    import tempfile

    import onnx

    from ..check.runtime import onnx_outputs
    from ..onnx_io.fed import inline
    from ..product.optimize_onnx import OnnxInput, optimize_onnx
    from ..product.peers import run_peers

    cells = {TASO_EGG: _PeerCell(out.model) if out.chosen != "original" else _PeerCell(why="original written")}
    for name, peer in run_peers(inline(source.original)).items():  # a plain ModelProto, as a user has
        cells[name] = _PeerCell(peer.model, peer.why, peer.how)
    slim = cells.get("onnxslim")
    if slim is not None and slim.model is not None:
        with tempfile.TemporaryDirectory() as tmp:
            slim_path = os.path.join(tmp, "onnxslim.onnx")
            onnx.save(slim.model, slim_path)
            try:
                after = optimize_onnx(OnnxInput.read(slim_path), rules=_corpus(corpus), options=options)
                cells[AFTER_SLIM] = (_PeerCell(why="= onnxslim (its model written)") if after.chosen == "original"
                                     else _PeerCell(after.model))
            except Exception as e:  # taso-egg refusing onnxslim's model is a finding, not a crash
                cells[AFTER_SLIM] = _PeerCell(why=f"failed: {type(e).__name__}: {e}")
    else:
        cells[AFTER_SLIM] = _PeerCell(why="no onnxslim model")
    expected = onnx_outputs(source.dynamic.reference, feeds)
    for cell in cells.values():
        if cell.timed:
            _check_peer(cell, expected, feeds)
    return cells


def _check_peer(cell: _PeerCell, expected, feeds) -> None:
    """The cell's max relative error against the original's outputs; a model that does
    not run, or computes other outputs, is not timed (the reason in ``why``)."""
    from ..check.runtime import onnx_outputs
    from ..check.tolerance import relative_errors

    try:
        cell.error = max(relative_errors(expected, onnx_outputs(cell.model, feeds), "its model").values(),
                         default=0.0)
    except Exception as e:  # onnxruntime's own errors, or VerificationError for other outputs
        first = (str(e).strip().splitlines() or [""])[0][:200]
        cell.why = f"does not run as the original: {type(e).__name__}: {first}"


def _peers_table(rows, measure: int) -> None:
    from ..check.tolerance import RTOL

    names = [TASO_EGG, "onnxsim", "onnxslim", "ort-transformers", AFTER_SLIM]
    print(f"\npeers: speedup over the original at 1 / 2 threads by optimize's guard (Hodges-Lehmann ratio and "
          f"95 % interval of paired interleaved rounds, at most {measure}; one session per thread count with "
          f"every candidate), max rel err on the same random inputs", flush=True)
    width = max([28] + [len(model) + 2 for model, _, _ in rows])  # a file name never runs into the next column
    print(f"{'model':<{width}}{'corpus':<10}" + "".join(f"{name:<{PEER_CELL}}" for name in names), flush=True)
    for model, label, cells in rows:
        print(f"{model:<{width}}{label:<10}" + "".join(_peer_cell(cells.get(name)) for name in names), flush=True)
        for name, cell in cells.items():  # what does not fit in a cell
            notes = [cell["how"]] + ([cell["why"]] if len(cell["why"]) > PEER_REASON else [])
            if any(notes):
                print(f"    {name}: {'; '.join(n for n in notes if n)}", flush=True)
    print("a cell is '1 thread  2 threads  error', or why there is nothing to time (not installed, "
          "not a transformer, failed, or equal to another candidate); an error above "
          f"{RTOL:g} means the candidate computes something else", flush=True)


def _peer_cell(cell: dict | None) -> str:
    if cell is None:
        return f"{'-':<{PEER_CELL}}"
    if cell["why"]:
        text = cell["why"] if len(cell["why"]) <= PEER_REASON else cell["why"].split(":")[0].split(" (")[0] + " (below)"
        return f"{text:<{PEER_CELL}}"
    text = f"{_ratio(cell['speedup1'], 8).strip()} {_ratio(cell['speedup2'], 8).strip()} {cell['error']:.1e}"
    return f"{text:<{PEER_CELL}}"


def _kernel_shares(model, feeds, runs: int = 10, shown: int = 6) -> list[tuple[str, float]]:
    """The largest shares of onnxruntime's kernel time (ORT_ENABLE_ALL, one thread) by
    operator, the rest summed as 'other'."""
    from collections import Counter

    from ..product.timing import kernel_times

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

    from ..cli_args import optimize_options_from_args

    options = optimize_options_from_args(argparse.Namespace(**parsed))
    if extractor is not None:
        options = replace(options, extraction=replace(options.extraction, extractor=extractor))
    if measure is not None:
        options = replace(options, decision=replace(options.decision, measure=measure))
    return options


def _error(check) -> float | None:
    """The relative error of the check that ran (onnxruntime's or our executor's)."""
    errors = [e for e in (check.error, check.ort_error) if e is not None]
    return max(errors) if errors else None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _ratio(c, width: int, missing: str = "-") -> str:
    """A guard's ``Comparison`` as ``1.031x(1.012-1.049)``."""
    text = f"{c.ratio:.3f}x({c.low:.3f}-{c.high:.3f})" if c is not None else missing
    return format(text, f">{width}")


def _prediction_error(predicted: float, measured, width: int = 8) -> str:
    """How far the predicted speedup is from the guard's measured one (a ``Comparison``),
    in percent of the measured: ``+9.4%`` predicted too fast."""
    text = f"{100 * (predicted / measured.ratio - 1):+.1f}%" if measured is not None else "-"
    return format(text, f">{width}")


PHASE_ABBREVIATIONS = dict(zip(ORDER, ("read", "cal", "sat", "ext", "write", "time", "check")))


def _phase_cells(phases: dict[str, float]) -> str:
    """``1.2/3.0/...``: seconds per phase in ``ORDER`` (0 for a phase not entered)."""
    return "/".join(f"{phases.get(name, 0.0):.1f}" for name in PHASE_ABBREVIATIONS)


def _or_dash(value, spec: str) -> str:
    width = spec.lstrip("<>").split(".")[0]
    return format(value, spec) if value is not None else format("-", ">" + width)


if __name__ == "__main__":
    sys.exit(main())
