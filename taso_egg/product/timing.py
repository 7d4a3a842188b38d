"""Timing whole graphs end to end, as they are deployed: exported to ONNX and run in
onnxruntime, or read back and run in our executor; one thread, interleaved samples,
medians. The guard (``decide``), ``compare`` and the benchmarks time graphs with
these; the profiling back ends build their sessions with ``make_session``."""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..errors import ProfileError, first_line
from ..executor import random_inputs, run
from ..graph import Graph
from ..onnx_io.exporter import export_onnx
from ..onnx_io.fed import feed, release_mapped_pages, save_external, session_parts
from ..onnx_io.importer import load_onnx


# The shortest sample: faster callables are called repeatedly within one sample.
MIN_SAMPLE_SECONDS = 0.005
# Runs per sample of a session built for one round: at least, at most.
SESSION_SAMPLES = (3, 5)


@contextmanager
def pinned_threads():
    """One BLAS / OpenMP thread while profiling or timing end to end, so that profiles
    and whole-model runs see the same machine (onnxruntime is pinned per session)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def make_session(model, disabled_optimizers=(), profile_prefix: str | None = None, threads: int = 1,
                 optimized_path: str | None = None):
    """An onnxruntime CPU session pinned to ``threads`` intra-op threads (one by
    default), all graph optimizations on (with ``profile_prefix``, onnxruntime's
    per-node profiler writes there; with ``optimized_path``, the graph it runs, after
    its fusions, is written there, its weights discarded: ``_discarding_weights``).
    ``model``: a ModelProto, an ``onnx_io.fed.FedModel``, bytes or a path."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if optimized_path:
        options.optimized_model_filepath = optimized_path
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         _discarding_weights(optimized_path))
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         "1024")
    # the large weights go in as arrays, not serialized (protobuf refuses past 2 GB):
    # external initializers get the model past its checks (onnxruntime copies them into
    # the graph while it builds), shared ones are what the session keeps: our arrays,
    # read in place, beside what it prepacks (without them it kept a copy of each weight
    # it does not prepack, and built with 1.6x the weights more, not 1x)
    release_mapped_pages()  # what the last pass read of the weight files: this session reads its own
    data, names, values = (model, [], []) if isinstance(model, (bytes, str)) else session_parts(model)
    if names:
        options.add_external_initializers(names, values)
        for name, value in zip(names, values):
            options.add_initializer(name, value)
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=list(disabled_optimizers))
    except Exception as e:  # onnxruntime raises its own exception types
        raise ProfileError(f"onnxruntime cannot build the model: {e}") from None
    session.fed_values = values  # onnxruntime reads them in place: they live as long as it
    return session


def _discarding_weights(optimized_path: str) -> str:
    """The file name, beside ``optimized_path``, that onnxruntime writes the weights of
    the graph it runs to: a link to the null device where one can be made. Only that
    graph is read back, and writing its weights took GPT-2-large's profile 10 s of 39."""
    name = Path(optimized_path).name + ".data"
    link = Path(optimized_path).with_name(name)
    if not link.exists() and os.path.exists(os.devnull):
        try:
            link.symlink_to(os.devnull)
        except OSError:  # no links here: the weights are written, and cost only time
            pass
    return name


def cannot_build(model) -> str:
    """Why onnxruntime cannot build ``model`` (its first line); "" when it can."""
    try:
        make_session(model)
    except ProfileError as e:
        return first_line(e)
    return ""


def kernel_times(model, feeds, runs: int, disabled_optimizers=(), threads: int = 1,
                 optimized_path: str | None = None) -> list[dict]:
    """onnxruntime's per-node profile of ``model`` (ORT_ENABLE_ALL): one event per node
    run, ``runs`` runs after a warm-up run that is left out. Each event has the node's
    ``name``, its ``op`` (as onnxruntime runs it, after its own fusions), its ``shapes``
    (inputs' and outputs', as text) and ``us``.
    With ``optimized_path`` the graph it ran is written there (``make_session``).
    Wall-clock node times are inflated by machine load, all nodes alike, so they are
    for shares within one profile, not for timing."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        if optimized_path and not isinstance(model, (bytes, str)):
            # from a file: given its weights in memory, onnxruntime keeps its copies of
            # them while it writes the graph it runs and prepacks beside them (2x the
            # weights more while it builds, not 1x)
            model = feed(model)
            if model.arrays:
                save_external(model, f"{tmp}/model.onnx", "model.onnx.data")
                model = f"{tmp}/model.onnx"
        session = make_session(model, disabled_optimizers, profile_prefix=f"{tmp}/ort-profile",
                               threads=threads, optimized_path=optimized_path)
        for _ in range(runs + 1):
            session.run(None, feeds)
        with open(session.end_profiling()) as f:
            events = node_events(json.load(f), runs)
        del session
        return_freed_memory()
        return events


def return_freed_memory() -> None:
    """Give the memory a freed session held back to the system (glibc keeps freed blocks
    below its mmap threshold, which frees of large blocks raise to 32 MB: a freed
    session's prepacked weights stayed resident while the next one was built), and the
    pages of the weight files mapped (``fed.release_mapped_pages``). A few
    milliseconds; no ``gc.collect`` (a session is freed when its last name is deleted,
    and a collection takes a quarter second beside the rule corpus)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    release_mapped_pages()


# Operators whose inputs can be swapped without changing the work: their kernels'
# shapes are given with the inputs sorted, so that an Add of (a, b) and one of (b, a)
# are one kind of kernel (a ViT's result wrote 24 of its bias adds the other way round,
# and they were weighed as kernels only it runs).
COMMUTATIVE = frozenset({"Add", "Mul", "Sum", "Max", "Min", "Mean", "Equal", "And", "Or", "Xor"})


def node_events(events: list[dict], runs: int) -> list[dict]:
    """The kernel events of onnxruntime's profile json (``events``: its list, of a
    warm-up run and ``runs`` more), the warm-up's left out, as ``kernel_times`` gives them."""
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = len(nodes) // (runs + 1)
    return [{"name": e["name"][:-len("_kernel_time")], "op": e["args"].get("op_name", ""),
             "shapes": _shapes(e["args"]), "us": e["dur"]} for e in nodes[per_run:]]


def _shapes(args: dict) -> str:
    """A kernel's input and output types and shapes, as text (``COMMUTATIVE`` ones'
    inputs sorted)."""
    inputs = args.get("input_type_shape")
    if args.get("op_name") in COMMUTATIVE and inputs:
        inputs = sorted(inputs, key=repr)
    return repr((inputs, args.get("output_type_shape")))


def median_times(runs: dict, repeats: int, progress=None) -> dict[str, tuple[float, float]]:
    """Interleaved samples of each callable (so load drifts hit all alike): median CPU
    and wall seconds per call. ``progress(done, repeats)`` follows each round."""
    cpu, wall = interleaved_runs(runs, repeats, progress)
    return {k: (float(np.median(cpu[k])), float(np.median(wall[k]))) for k in runs}


# the orders of rounds timed without a generator of their own (tests pass one)
_ORDERS = np.random.default_rng()


def round_order(names: list, rng=None) -> list:
    """``names`` in a random order of their own for one round (drawn by ``rng``, else
    by ours). Not alternating: load that lasts a few seconds hits the last run of a
    round and the first of the next, and in forward-backward order (A B, B A) that is one model twice, so neighbouring
    rounds erred alike (their log-ratios' lag-1 correlation 0.2-0.3 in A/A runs of
    BERT), the intervals were too narrow, and a byte-identical copy measured "faster"
    in 2 of 5 such runs. A fair draw per round makes each round's sign a coin flip
    under no difference, which is exactly what the signed-rank interval assumes,
    whatever the load does."""
    return [names[i] for i in (rng or _ORDERS).permutation(len(names))]


class Rounds:
    """Callables timed round by round, interleaved: each round times every callable
    once, in an order drawn afresh (``round_order``), so that load drifts hit all alike
    and no callable always follows the same one (the one before warms or pollutes the
    caches). Built with a warm-up call each. Where the fastest callable
    takes less than ``MIN_SAMPLE_SECONDS``, a sample times that many seconds' worth of
    its calls and divides, so that a model of a few microseconds is not measured at the
    clock's resolution and scheduler noise; every callable is called as many times per
    sample (``calls``), so that samples compare like with like: with counts of their
    own, two byte-identical models measured 1-3 % apart, the one with fewer calls per
    sample (a colder first call) slower. ``calls`` given: that many, as another
    ``Rounds`` chose them; ``rng`` draws the orders."""

    def __init__(self, runs: dict, calls: int | None = None, rng=None):
        self.runs, self.rng = runs, rng
        fastest = math.inf
        for fn in runs.values():  # warm-up, and the fastest call
            fn()
            w0 = time.perf_counter()
            fn()
            fastest = min(fastest, time.perf_counter() - w0)
        self.calls = calls or max(1, min(10_000, math.ceil(MIN_SAMPLE_SECONDS / max(fastest, 1e-7))))

    def next(self) -> tuple[dict[str, float], dict[str, float]]:
        """One more round: CPU and wall seconds per call of each callable."""
        cpu, wall = {}, {}
        names = round_order(list(self.runs), self.rng)
        for name in names:
            fn, n = self.runs[name], self.calls
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                fn()
            cpu[name] = (time.process_time() - c0) / n
            wall[name] = (time.perf_counter() - w0) / n
        return cpu, wall


def interleaved_runs(runs: dict, repeats: int, progress=None) -> tuple[dict, dict]:
    """CPU and wall seconds per call of each callable, ``repeats`` ``Rounds``, round by
    round. ``progress(done, repeats)`` follows each round."""
    rounds = Rounds(runs)
    cpu = {k: [] for k in runs}
    wall = {k: [] for k in runs}
    for done in range(1, repeats + 1):
        round_cpu, round_wall = rounds.next()
        for name in runs:
            cpu[name].append(round_cpu[name])
            wall[name].append(round_wall[name])
        if progress is not None:
            progress(done, repeats)
    return cpu, wall


def exported_graph(graph: Graph) -> Graph:
    """The graph as a user deploys it: exported to ONNX (weight-only work folded into
    initializers) and read back."""
    return load_onnx(export_onnx(graph))


def measure(original: Graph, results: dict[str, Graph], repeats: int,
            runtimes=("ort", "executor"), progress=None) -> dict[str, dict[str, float]]:
    """Median milliseconds per run of the original and each result, timed interleaved
    in one process (so machine load hits all alike), one thread each. Both runtimes
    run the graphs as deployed: exported, weight-only work folded into constants.
    ``progress(done, total)`` is called after each interleaved round."""
    graphs = {"original": original, **results}
    feeds = random_inputs(original)
    out: dict[str, dict[str, float]] = {}
    with pinned_threads(), np.errstate(all="ignore"):  # TASO's BERT overflows float32
        if "ort" in runtimes:
            out["ort"] = ort_ms({k: export_onnx(g) for k, g in graphs.items()}, feeds, repeats,
                                progress)
        if "executor" in runtimes:
            deployed = {k: exported_graph(g) for k, g in graphs.items()}
            times = median_times({k: (lambda g=g: run(g, feeds)) for k, g in deployed.items()}, repeats,
                                 progress)
            out["executor"] = {k: cpu * 1e3 for k, (cpu, _) in times.items()}
    return out


def ort_ms(models: dict, feeds, repeats: int, progress=None) -> dict[str, float]:
    """Median CPU milliseconds per run of each ONNX model in onnxruntime
    (ORT_ENABLE_ALL, one thread), timed interleaved."""
    return {k: float(np.median(v)) for k, v in ort_runs(models, feeds, repeats, progress).items()}


def ort_rounds(models: dict, feeds, threads: int = 1, rng=None):
    """A callable that times one more interleaved round of the ONNX models in
    onnxruntime (ORT_ENABLE_ALL) and returns each one's milliseconds: CPU time on one
    thread (other processes' load does not count), wall time with more (CPU time would
    add the threads up). In each round (in an order drawn afresh: ``round_order``, from
    ``rng``) every model's session is
    built, warmed up, sampled and freed: one session (its prepacked copy of the
    weights) is alive at a time, and each round is an independent replicate with a
    fresh session's luck inside it (two sessions of one model's bytes have measured
    up to 5 % apart for as long as they lived), so the guard's interval counts that
    luck instead of crediting it to a candidate. A sample is the median of
    ``SESSION_SAMPLES`` runs (as many as the first build took the time of, within its
    bounds), each of ``Rounds.calls`` calls; both counts are the first session's, kept
    for every model."""
    calls, per_session = None, None

    def next_round(names=None) -> dict[str, float]:
        """One more round of ``names`` (default: every model)."""
        nonlocal calls, per_session
        out = {}
        names = round_order(list(models if names is None else names), rng)
        for name in names:
            start = time.perf_counter()
            session = make_session(models[name], threads=threads)
            built = time.perf_counter() - start
            rounds = Rounds({name: lambda: session.run(None, feeds)}, calls)  # one callable: no order
            calls = rounds.calls
            samples = []
            while per_session is None or len(samples) < per_session:
                cpu, wall = rounds.next()
                samples.append((cpu if threads == 1 else wall)[name])
                if per_session is None:
                    low, high = SESSION_SAMPLES
                    per_session = min(high, max(low, math.ceil(built / max(wall[name] * calls, 1e-6))))
            del session, rounds
            return_freed_memory()
            out[name] = float(np.median(samples)) * 1e3
        return out

    return next_round


def ort_runs(models: dict, feeds, repeats: int, progress=None, threads: int = 1) -> dict[str, list[float]]:
    """Milliseconds of each ONNX model in onnxruntime, ``repeats`` rounds of
    ``ort_rounds``, round by round."""
    with pinned_threads():
        next_round = ort_rounds(models, feeds, threads)
        runs = {k: [] for k in models}
        for done in range(1, repeats + 1):
            for k, ms in next_round().items():
                runs[k].append(ms)
            if progress is not None:
                progress(done, repeats)
    return runs
