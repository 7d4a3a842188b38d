"""A/A test of optimize's guard (``taso_egg.product.decide``): each model timed against a
byte-identical copy of itself, in onnxruntime as ``optimize`` times its candidates
(two sessions, paired interleaved rounds, one thread, CPU time). Neither copy can be
faster, so every row must end "same", "undecided" or "not timed"; a "faster" or
"slower" row is a false decision (the exit code counts them). As ``optimize`` does, the
copy is first predicted from kernel profiles of both (``decide.predicted_speedups``) and
timed only where it could reach the guard's margin (``decide.worth_timing``); its
kernels are the original's, matched one for one, so it is predicted 1.000x and nothing
is timed unless ``--no-skip`` (the guard itself on trial). Models: zoo names (``bert-small``,
``resnet50``, ...) and ONNX files or folders of them, fed random inputs as optimize
feeds them (floats N(0, 1), integers 0 or 1), symbolic dimensions set by ``--dim``:

    .venv/bin/python scripts/aa_guard.py bert-small squeezenet nasrnn /work/exports/models \
        --dim batch=1 --dim sequence=64 --total-seconds 900
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from taso_egg.product import decide, guard, timing
from taso_egg.research import zoo
from taso_egg.executor import random_feeds
from taso_egg.onnx_io.exporter import export_onnx
from taso_egg.product.dims import input_types, interface

DIMS = {"batch": 1, "sequence": 64, "samples": 16000}


def models(names: list[str]):
    """(label, ONNX model, what onnxruntime loads: the serialized model, or the file's
    path, whose weights may lie in external data past protobuf's 2 GB) for each zoo
    name, file, or file in a folder."""
    for name in names:
        path = Path(name)
        if name in zoo.MODELS:
            model = export_onnx(zoo.MODELS[name]())
            yield name, model, model.SerializeToString()
        elif path.is_dir():
            yield from models([str(p) for p in sorted(path.glob("*.onnx"))])
        else:
            yield path.name, onnx.load(name, load_external_data=False), name


def feeds(model, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """Random inputs as optimize makes them (``executor.random_feeds``), symbolic dims from ``dims``."""
    return random_feeds(input_types(interface(model), dims))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="zoo model names, ONNX files, folders of them")
    p.add_argument("--max-rounds", type=int, default=decide.MAX_ROUNDS)
    p.add_argument("--seconds", type=float, default=guard.TIME_BUDGET, help="time budget per model")
    p.add_argument("--total-seconds", type=float, default=None, help="skip the models left after this")
    p.add_argument("--no-skip", action="store_true", help="time every copy, whatever its prediction")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help=f"a symbolic dimension's size (defaults: {DIMS})")
    args = p.parse_args(argv)
    dims = {**DIMS, **{k: int(v) for k, v in (d.split("=") for d in args.dim)}}
    print(f"{'model':<34}{'predicted':>10}{'ratio':>8}{'interval':>20}  {'decision':<10}{'rounds':>7}"
          f"{'seconds':>9}{'median ms':>11}  stopped", flush=True)
    start, false = time.monotonic(), 0
    for label, model, source in models(args.models):
        if args.total_seconds is not None and time.monotonic() - start > args.total_seconds:
            print(f"{label:<34}  skipped: --total-seconds spent", flush=True)
            continue
        try:
            inputs = feeds(model, dims)
            # what optimize does first: a candidate predicted to gain nothing is not timed
            prediction = decide.predicted_speedups({"original": source, "copy": source}, inputs)["copy"]
            predicted = prediction.speedup
            if not args.no_skip and not decide.worth_timing("result", prediction):
                print(f"{label:<34}{predicted:>9.3f}x{'':>28}  not timed", flush=True)
                continue
            with timing.pinned_threads():
                # two sessions of the same bytes: the copy is the candidate
                next_round = timing.ort_rounds({"original": source, "copy": source}, inputs)
                report = guard.run_guard(next_round, ["original", "copy"], max_rounds=args.max_rounds,
                                          seconds=args.seconds)
        except Exception as e:  # one model onnxruntime cannot run is a row, not the end
            print(f"{label:<34}  failed: {type(e).__name__}: {e}", flush=True)
            continue
        c = report.comparisons["copy"]
        false += c.decision in ("faster", "slower")
        print(f"{label:<34}{predicted:>9.3f}x{c.ratio:>7.3f}x{f'[{c.low:.3f}, {c.high:.3f}]':>20}  {c.decision:<10}"
              f"{c.rounds:>7}{report.seconds:>9.1f}{report.medians['original']:>11.3f}  {report.stopped}", flush=True)
    print(f"predicted = the copy's speedup from matched kernel profiles (timed where it could reach "
          f"{1 + guard.MARGIN:g}x); "
          f"ratio = the original's time over the copy's (Hodges-Lehmann over paired rounds), "
          f"{100 * (1 - 2 * guard.ALPHA):.0f} % interval (split over the guard's looks); faster/slower "
          f"need the interval beyond {1 + guard.MARGIN:g} / {1 / (1 + guard.MARGIN):.3f}; "
          f"false decisions: {false}")
    return min(false, 1)


if __name__ == "__main__":
    sys.exit(main())
