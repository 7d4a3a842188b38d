"""Collect operator configurations (from a graph, or every one a saturated e-graph could
be extracted as) and time the ones a profile lacks."""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..cost import OpConfig, node_config
from ..cost.store import Profile, now
from ..errors import ProfileError, TasoEggError
from ..graph import Graph
from ..ops import OPS, TensorType

CALIBRATION_DTYPE = "float32"
# Sizes at which each device reaches its peak: a square matmul for FLOP/s, a vector
# add (inputs and output far beyond the caches) for bytes/s.
_CALIBRATION_SIZES = {"cpu": (1024, 1 << 22), "gpu": (8192, 1 << 26)}
CHECKPOINT_S = 30.0


def graph_configurations(graph: Graph) -> list[OpConfig]:
    """The distinct configurations a graph runs (work on weights alone is folded at
    export, so it is left out)."""
    return [config for config, _ in configuration_counts(graph)]


def configuration_counts(graph: Graph) -> list[tuple[OpConfig, int]]:
    """Each distinct configuration a graph runs and how many of its nodes run it, in
    topological order of first use: what ``graph_cost`` prices (leaves cost nothing)."""
    folded = graph.weight_only_nodes()
    seen: dict[str, list] = {}
    for n in graph.topo_order():
        if OPS[n.op].is_leaf or n.id in folded:
            continue
        config = node_config(n, [t.node in folded for t in n.inputs])
        seen.setdefault(config.key, [config, 0])[1] += 1
    return [(config, count) for config, count in seen.values()]


def saturation_configurations(saturation) -> list[OpConfig]:
    """Every configuration any e-node of a saturated e-graph could be extracted as."""
    from ..egraph.pricing import enode_configurations

    return enode_configurations(saturation)


def unique(configs: Iterable[OpConfig]) -> list[OpConfig]:
    seen: dict[str, OpConfig] = {}
    for c in configs:
        seen.setdefault(c.key, c)
    return list(seen.values())


def calibration_configs(device: str, sizes: tuple[int, int] | None = None) -> dict[str, OpConfig]:
    """The peak (square matmul), bandwidth (vector add) and overhead (one-element relu)
    configurations; ``sizes`` = (matmul side, vector length) replaces the device's."""
    n, length = sizes or _CALIBRATION_SIZES[device]
    square, vector, one = TensorType((n, n), CALIBRATION_DTYPE), TensorType((length,), CALIBRATION_DTYPE), \
        TensorType((1,), CALIBRATION_DTYPE)
    return {"peak": OpConfig.of("matmul", {}, [square, square], constant=[False, True]),
            "bandwidth": OpConfig.of("ewadd", {}, [vector, vector]),
            "overhead": OpConfig.of("relu", {}, [one])}


def calibrate(backend, warmups: int, repeats: int, sizes: tuple[int, int] | None = None) -> dict:
    """The device's measured peak FLOP/s, bytes/s and per-operator overhead (what the
    analytic fallback uses), and the fixed overhead of one whole-graph run."""
    configs = calibration_configs(backend.device, sizes)
    peak, bandwidth = (_positive_seconds(backend, configs[k], warmups, repeats, k)
                       for k in ("peak", "bandwidth"))
    tiny = backend.measure(configs["overhead"], warmups, repeats).seconds
    mm, add = configs["peak"], configs["bandwidth"]
    flops = OPS["matmul"].flops({}, mm.inputs, mm.outputs)
    nbytes = 4 * (sum(t.size for t in add.inputs) + add.outputs[0].size)
    return {"peak_flops": flops / peak, "bandwidth": nbytes / bandwidth, "overhead_s": tiny,
            "run_overhead_s": backend.run_overhead(warmups, repeats, configs["overhead"], tiny),
            "measured_on": {k: c.key for k, c in configs.items()}}


def _positive_seconds(backend, config: OpConfig, warmups: int, repeats: int, what: str) -> float:
    """A marginal timing can come out 0 with few repeats on a noisy machine; the peak
    and bandwidth divide by it, so measure again with more before giving up."""
    for n in (repeats, max(repeats, 5) * 4):
        seconds = backend.measure(config, warmups, n).seconds
        if seconds > 0:
            return seconds
    raise ProfileError(f"calibration: {what} ({config.key}) measured 0 s even with {n} repeats; "
                       f"the machine is too noisy to calibrate on")


def new_profile(backend, warmups: int = 2, repeats: int = 10,
                calibration_sizes: tuple[int, int] | None = None) -> Profile:
    """An empty profile for ``backend`` with its metadata and calibration
    (``calibration_sizes``: see ``calibration_configs``)."""
    meta = {"device": backend.device, "backend": backend.name, "dtype": CALIBRATION_DTYPE,
            **backend.metadata(),
            "python": platform.python_version(), "platform": platform.platform(),
            "created": now(), "updated": now(), "warmups": warmups, "repeats": repeats,
            "models": []}
    meta["calibration"] = calibrate(backend, warmups, repeats, calibration_sizes)
    return Profile(meta)


def run_metadata(backend) -> dict:
    """What an existing profile must agree with before ``backend``'s measurements join it."""
    return {"device": backend.device, "backend": backend.name, "dtype": CALIBRATION_DTYPE,
            **backend.metadata()}


@dataclass
class ProfileRun:
    measured: int = 0
    kept: int = 0            # already in the profile
    failed: dict[str, str] = field(default_factory=dict)   # key -> why
    skipped: int = 0         # not reached before the deadline
    seconds: float = 0.0


def profile_configurations(configs: Iterable[OpConfig], backend, profile: Profile, warmups: int = 2,
                           repeats: int = 10, replace: bool = False, progress: bool = True,
                           desc: str = "profiling", deadline: float | None = None,
                           checkpoint=None) -> ProfileRun:
    """Time every configuration ``profile`` lacks (all of them with ``replace``) and
    add it. A configuration that cannot run is reported, not fatal: the cost model
    estimates it. None is started after ``deadline`` (a ``time.perf_counter()``
    value); those left are counted as skipped. ``checkpoint(profile)``, when given,
    is called every CHECKPOINT_S so that a killed run leaves what it measured."""
    from tqdm import tqdm

    profile.check_compatible(run_metadata(backend))
    run = ProfileRun()
    start = time.perf_counter()
    todo = []
    for c in configs:
        if c.key in profile.entries and not replace:
            run.kept += 1
        else:
            todo.append(c)
    saved = start
    for done, config in enumerate(tqdm(todo, desc=desc, unit="config", file=sys.stderr,
                                       disable=not progress, leave=False)):
        if deadline is not None and time.perf_counter() >= deadline:
            run.skipped = len(todo) - done
            break
        try:
            m = backend.measure(config, warmups, repeats)
        except TasoEggError as e:
            run.failed[config.key] = str(e)
            continue
        finally:
            backend.release()  # a GPU holds every copy's weights until then
        profile.add(config, m.as_entry(), replace=True)
        run.measured += 1
        if checkpoint is not None and time.perf_counter() - saved >= CHECKPOINT_S:
            profile.meta["updated"] = now()
            checkpoint(profile)
            saved = time.perf_counter()
    if run.measured:
        profile.meta["updated"] = now()
    run.seconds = time.perf_counter() - start
    return run
