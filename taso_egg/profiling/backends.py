"""Back ends that time one operator configuration: the operator table's kernels on an
array module (NumPy on CPU, CuPy on GPU), or onnxruntime on a one-operator model.

Every back end makes one untimed call (a GPU compiles its kernels then), takes
warm-ups, then ``repeats`` samples; a sample loops the operator until it lasts about
SAMPLE_S so that clock resolution does not matter, and the result is the median with
half the interquartile range as its spread, and the mean beside it.

- Each back end times what its runtime does with a whole graph: our executor with
  the table's kernels on an array module (NumPy on CPU, CuPy on GPU), or an
  onnxruntime session on the project's export (weights as initializers, exactly as
  in an exported model). The graph is the configuration alone; a run of it carries
  a fixed overhead that a whole model pays once, not per operator, so a fast
  operator is timed as the marginal cost of one more copy of it in the graph:
  (time of K copies - time of 1) / (K - 1). Prepared runs are cached.
- On a real CuPy device a sample is bracketed by CUDA events; any other array
  module (NumPy, or NumPy standing in for CuPy in tests) is timed on the host. The
  cupy back end draws weights on the device (``place_on_device``).
- On the CPU the clock is the process's CPU time, everything pinned to one thread:
  the machine is shared, and other processes' load must not count as ours.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..cost import OpConfig
from ..errors import ProfileError
from ..graph import Graph, new_graph
from ..ops import TensorType
from ..product.timing import kernel_times, make_session

SAMPLE_S = 1e-3         # a sample loops the operator for at least this long
DIRECT_ABOVE_S = 2e-3   # slower than this, a session run's fixed overhead is < 1%: no copies
MAX_COPIES = 64
CPU_CLOCK = "process CPU time (time.process_time), one thread"
BACKENDS = ("numpy", "ort", "cupy")
DEVICE_OF = {"numpy": "cpu", "ort": "cpu", "cupy": "gpu"}


@dataclass
class Measurement:
    seconds: float      # the operator's cost: the median sample
    spread_s: float     # half the interquartile range of the samples
    samples: int
    loops: int          # runs per sample
    copies: int = 1     # > 1: marginal cost of one more copy in the model
    note: str = ""
    mean_s: float | None = None  # the mean sample (TASO reports the mean)

    def as_entry(self) -> dict:
        return asdict(self)


def one_op_graph(config: OpConfig, copies: int = 1, stage=None) -> Graph:
    """``copies`` independent nodes of one configuration; constant inputs are weights
    (initializers once exported), one set per copy, the others shared graph inputs.
    ``stage(g, index, tensor)``, when given, may hand a copy a shared input through a
    node of its own (what a runtime needs to see to run the operator as in a model)."""
    if config.weight_only:
        raise ProfileError(f"{config.key}: every input is constant, so it is folded at export "
                           f"and costs nothing; there is nothing to time")
    g = new_graph()
    shared = {i: g.new_input(t.shape, name=f"x{i}", dtype=t.dtype)
              for i, (t, const) in enumerate(zip(config.inputs, config.constant)) if not const}
    for k in range(copies):
        # Each copy reads its own weights, as each node of a model does: weights come
        # in cold, activations warm from the operator that just produced them.
        args = [shared[i] if i in shared else g.new_weight(t.shape, name=f"w{i}_{k}", dtype=t.dtype)
                for i, t in enumerate(config.inputs)]
        if stage is not None:
            args = [stage(g, i, a) if i in shared else a for i, a in enumerate(args)]
        for j, out in enumerate(g.add_node(config.op, args, **config.param_dict)):
            g.mark_output(out, f"y{k}_{j}")
    return g


@dataclass
class Sampled:
    median: float       # seconds per call
    spread: float       # half the interquartile range
    mean: float
    loops: int          # calls per sample


def summarize(samples: list[float], loops: int = 1) -> Sampled:
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return Sampled(float(med), float(q3 - q1) / 2, float(np.mean(samples)), loops)


def sample(run, warmups: int, repeats: int, clock) -> Sampled:
    """``repeats`` samples of ``run`` after ``warmups`` (seconds per call). The first
    call is untimed (a GPU compiles its kernels then); the second sets how many calls
    make one sample."""
    if repeats < 1 or warmups < 0:
        raise ProfileError(f"need repeats >= 1 and warmups >= 0, got {repeats}, {warmups}")
    run()
    first = clock(run, 1)  # also the first warm-up
    loops = max(1, math.ceil(SAMPLE_S / max(first, 1e-9)))
    for _ in range(warmups - 1):
        clock(run, loops)
    return summarize([clock(run, loops) for _ in range(repeats)], loops)


def host_clock(timer=time.process_time):
    """Seconds per call of a loop on the host. The default counts this process's CPU
    time: with one thread it is the operator's own time, and other processes on a
    shared machine do not inflate it (pass time.perf_counter for wall time)."""

    def clock(run, loops: int) -> float:
        start = timer()
        for _ in range(loops):
            run()
        return (timer() - start) / loops

    return clock


def cuda_event_clock(xp):
    """Device time between two CUDA events around the loop (CuPy's API)."""

    def clock(run, loops: int) -> float:
        start, end = xp.cuda.Event(), xp.cuda.Event()
        start.record()
        for _ in range(loops):
            run()
        end.record()
        end.synchronize()
        return xp.cuda.get_elapsed_time(start, end) / 1e3 / loops

    return clock


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class _GraphBackend:
    """Times a configuration as the cost of one node in a whole-graph run of this
    back end's runtime: a run of the one-operator graph when that is slow enough for
    the run's fixed overhead not to matter, else the marginal cost of one more copy."""

    name = device = ""
    clock = staticmethod(host_clock())

    def __init__(self):
        self._runners: dict[tuple[str, int], object] = {}

    def _prepare(self, graph: Graph):
        """A callable that runs ``graph`` once on fixed inputs."""
        raise NotImplementedError

    def _graph(self, config: OpConfig, copies: int) -> Graph:
        return one_op_graph(config, copies)

    def _time(self, config: OpConfig, copies: int, warmups: int, repeats: int) -> Sampled:
        key = (config.key, copies)
        if key not in self._runners:
            self._runners[key] = self._prepare(self._graph(config, copies))
        return sample(self._runners[key], warmups, repeats, self.clock)

    def release(self) -> None:
        """Drop the prepared runs (their inputs and weights)."""
        self._runners.clear()

    def measure(self, config: OpConfig, warmups: int = 2, repeats: int = 10) -> Measurement:
        one = self._time(config, 1, warmups, repeats)
        if one.median >= DIRECT_ABOVE_S:
            return Measurement(one.median, one.spread, repeats, one.loops, mean_s=one.mean)
        copies = min(MAX_COPIES, max(4, math.ceil(DIRECT_ABOVE_S / max(one.median, 1e-9))))
        many = self._time(config, copies, warmups, repeats)
        marginal = max(many.median - one.median, 0.0) / (copies - 1)
        return Measurement(marginal, (one.spread + many.spread) / (copies - 1), repeats, many.loops, copies,
                           mean_s=max(many.mean - one.mean, 0.0) / (copies - 1))

    def run_overhead(self, warmups: int, repeats: int, tiny: OpConfig, tiny_cost: float) -> float:
        """What one whole-graph run costs beyond its operators (``tiny`` costs ``tiny_cost``)."""
        return max(self._time(tiny, 1, warmups, repeats).median - tiny_cost, 0.0)


class KernelBackend(_GraphBackend):
    """The operator table's kernels run by our executor on ``xp``: NumPy on CPU, CuPy
    on GPU. Inputs and weights are put on the device once, outside the timing."""

    def __init__(self, xp=np, name: str = "numpy"):
        super().__init__()
        if name not in ("numpy", "cupy"):
            raise ProfileError(f"kernel back end {name!r}: expected numpy or cupy")
        self.xp, self.name, self.device = xp, name, DEVICE_OF[name]
        self.events = getattr(xp, "cuda", None) is not None  # a real CuPy device
        self.clock = cuda_event_clock(xp) if self.events else host_clock()

    def _prepare(self, graph: Graph):
        from ..executor import run

        try:
            feeds = place_on_device(graph, self.xp) if self.name == "cupy" else _host_arrays(graph)
        except Exception as e:  # e.g. CuPy's OutOfMemoryError: this configuration is not measured
            raise ProfileError(f"cannot place {graph.summary()} on the device: {e}") from None
        return lambda: run(graph, feeds, xp=self.xp)

    def release(self) -> None:
        super().release()
        pool = getattr(self.xp, "get_default_memory_pool", None)
        if self.events and pool is not None:  # CuPy keeps freed blocks for reuse
            pool().free_all_blocks()

    def metadata(self) -> dict:
        if self.name == "numpy":
            return {"device_name": cpu_name(), "libraries": {"numpy": np.__version__, "blas": _blas()},
                    "threads": {"blas": 1}, "clock": CPU_CLOCK}
        if not self.events:  # tests: NumPy standing in for CuPy
            return {"device_name": f"{getattr(self.xp, '__name__', 'array module')} standing in for CuPy",
                    "libraries": {"numpy": np.__version__}, "threads": {"blas": 1},
                    "clock": CPU_CLOCK, "kernels": KERNEL_PATHS}
        runtime = self.xp.cuda.runtime
        props = runtime.getDeviceProperties(self.xp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return {"device_name": name,
                "libraries": {"cupy": self.xp.__version__, "numpy": np.__version__,
                              "cuda_runtime": runtime.runtimeGetVersion(),
                              "cuda_driver_api": runtime.driverGetVersion(),
                              "nvidia_driver": nvidia_driver_version()},
                "threads": {}, "clock": "CUDA events around each sample",
                "kernels": {**KERNEL_PATHS, "cudnn_in_cupy": _has_cudnn(self.xp),
                            # float32 GEMMs use TF32 tensor cores only when this is 1
                            "CUPY_TF32": os.environ.get("CUPY_TF32", "unset")}}


# What the cupy back end's kernels run on: the operator table's array-module kernels,
# the same code as on NumPy. CuPy 14 removed its cuDNN bindings
# (docs.cupy.dev/en/latest/upgrade.html, "Dropping cuDNN Support"), and the table's
# conv never called them: it is im2col by strided slices and one batched matmul.
KERNEL_PATHS = {
    "matmul": "cupy.matmul (cuBLAS GEMM; batched GEMM for rank > 2)",
    "conv2d": "im2col (one strided-slice copy per kernel tap) + cupy.matmul (cuBLAS batched "
              "GEMM); no cuDNN",
    "elementwise and reductions": "CuPy's own kernels (compiled with NVRTC at first use)",
}


def _has_cudnn(xp) -> bool:
    try:
        __import__(f"{xp.__name__}.cuda.cudnn")
        return True
    except Exception:  # ImportError on CuPy 14; CuPy 13 without the cuDNN libraries raises others
        return False


def nvidia_driver_version() -> str:
    """The kernel driver's version (e.g. 580.159.04), which CUDA's API does not give."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            text = f.read()
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    except OSError:
        pass
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _host_arrays(graph: Graph) -> dict:
    from ..executor import random_inputs

    for n in graph.weights():
        graph.weight_array(n)
    return random_inputs(graph)


def place_on_device(graph: Graph, xp, seed: int = 0) -> dict:
    """Feeds for ``graph``'s inputs on ``xp``'s device, and its weights put there
    (``graph.weight_data`` then holds device arrays). A weight the graph holds no
    data for is drawn on the device, scaled as ``ops.leaves.weight_values`` scales
    it: copies of VGG-19's classifier weigh gigabytes, which the host would take
    minutes to draw and the bus to carry."""
    from ..executor import random_inputs

    rng = xp.random.RandomState(seed)  # the legacy API: the same calls on NumPy and CuPy
    for n in graph.weights():
        data = graph.weight_data.get(n.id)
        shape, dtype = n.params["shape"], np.dtype(n.params["dtype"])
        if data is None and dtype.kind == "f":
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(int(np.prod(shape)), 1)
            data = (rng.standard_normal(shape) * (1.0 / math.sqrt(max(fan_in, 1)))).astype(dtype)
        graph.weight_data[n.id] = xp.asarray(graph.weight_array(n) if data is None else data)
    return {k: xp.asarray(v) for k, v in random_inputs(graph, seed).items()}


def _blas() -> str:
    from threadpoolctl import threadpool_info

    libs = [f"{i.get('internal_api')} {i.get('version')}" for i in threadpool_info()
            if i.get("user_api") == "blas"]
    return ", ".join(sorted(libs)) or "unknown"


class OrtBackend(_GraphBackend):
    """onnxruntime on CPU, one intra-op thread, all graph optimizations on; the
    one-operator models come from the project's exporter."""

    name, device = "ort", "cpu"
    # ORT_ENABLE_ALL, as users run exported models; common-subexpression elimination
    # would merge the copies, so it alone is off.
    DISABLED = ("CommonSubexpressionElimination",)
    # Operator -> (input, onnxruntime op type of the node that stages it). onnxruntime
    # fuses conv2d_sum's add into the conv only when the summand is in its blocked
    # layout already, as it is in a model (made by another conv); a graph input is
    # not. A 1x1 max pool (an NCHWc operator that copies) hands it over, and its time
    # is left out with the boundary reorders.
    STAGED_INPUT = {"conv2d_sum": (2, "MaxPool")}

    def measure(self, config: OpConfig, warmups: int = 2, repeats: int = 10) -> Measurement:
        if config.op == "reshape":
            # Inside a model ONNX Reshape aliases its input; a one-operator model must copy
            # it to a graph output instead. Time it where the copy is nothing: one element.
            dtype = config.inputs[0].dtype
            m = super().measure(OpConfig.of("reshape", {"shape": (1,)}, [TensorType((1,), dtype)]),
                                warmups, repeats)
            m.note = "aliases its input inside a model: timed on one element"
            return m
        m = super().measure(config, warmups, repeats)
        # onnxruntime blocks only 4-D (NCHW) tensors
        share = self.boundary_share(config, m.copies) if len(config.inputs[0].shape) == 4 else 0.0
        if share > 0:
            m.seconds *= 1 - share
            m.spread_s *= 1 - share
            staged = " and the input staging" if config.op in self.STAGED_INPUT else ""
            m.note = f"layout reorders at the model's boundary{staged} excluded ({share:.0%} of the kernel time)"
        return m

    def _graph(self, config: OpConfig, copies: int) -> Graph:
        if config.op not in self.STAGED_INPUT:
            return one_op_graph(config, copies)
        staged, _ = self.STAGED_INPUT[config.op]
        return one_op_graph(config, copies, stage=lambda g, i, t: t if i != staged else
                            g.maxpool2d(t, (1, 1), (1, 1)))

    def boundary_share(self, config: OpConfig, copies: int, runs: int = 5) -> float:
        """The share of the kernel time that onnxruntime spends in nodes that are not
        the operator's own: converting to and from its blocked NCHWc layout at the
        one-operator model's inputs and outputs, and staging a summand (``_graph``).

        ORT_ENABLE_ALL runs convolutions and pools in NCHWc and inserts Reorder nodes
        where the graph meets plain NCHW tensors. Inside a model, NCHWc operators feed
        each other directly and the conversions happen once, at its edges; so they are
        not part of an operator's cost. The share comes from onnxruntime's per-node
        profile of the same model that was timed (a ratio: wall-clock node times are
        inflated by machine load, but both parts alike)."""
        from ..executor import random_inputs
        from ..onnx_io.exporter import export_onnx

        graph = self._graph(config, copies)
        staging = ("ReorderInput", "ReorderOutput") + \
            ((self.STAGED_INPUT[config.op][1],) if config.op in self.STAGED_INPUT else ())
        timed = kernel_times(export_onnx(graph), random_inputs(graph), runs, self.DISABLED)
        total = sum(e["us"] for e in timed)
        staged = sum(e["us"] for e in timed if e["op"] in staging)
        return staged / total if total > 0 else 0.0

    def _prepare(self, graph: Graph):
        from ..executor import random_inputs
        from ..onnx_io.exporter import export_onnx

        session, feeds = make_session(export_onnx(graph), self.DISABLED), random_inputs(graph)
        try:
            session.run(None, feeds)
        except Exception as e:  # onnxruntime raises its own exception types
            raise ProfileError(f"onnxruntime cannot run {graph.summary()}: {e}") from None
        return lambda: session.run(None, feeds)

    def metadata(self) -> dict:
        import onnx
        import onnxruntime

        return {"device_name": cpu_name(),
                "libraries": {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__},
                "threads": {"intra_op": 1, "inter_op": 1},
                "graph_optimization": "ORT_ENABLE_ALL, " + ", ".join(self.DISABLED) + " off",
                "clock": CPU_CLOCK}


def make_backend(name: str, xp=None):
    """``numpy`` / ``ort`` on CPU; ``cupy`` on the GPU (``xp`` injects the array module,
    e.g. NumPy standing in for CuPy where no GPU is present)."""
    if name == "ort":
        return OrtBackend()
    if name == "numpy":
        return KernelBackend(np if xp is None else xp, "numpy")
    if name == "cupy":
        if xp is None:
            try:
                import cupy as xp
            except ImportError:
                raise ProfileError("the cupy back end needs CuPy and a GPU: "
                                   "pip install 'taso-egg[gpu]'") from None
        return KernelBackend(xp, "cupy")
    raise ProfileError(f"unknown back end {name!r}; choose from {', '.join(BACKENDS)}")

