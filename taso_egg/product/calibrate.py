"""A graph's nodes as onnxruntime runs them: one profiled run of the graph, exported,
mapped back to the graph's nodes, and the cost model calibrated on it
(``cost.CalibratedCost``).

onnxruntime renames what it fuses (a conv with its activation in NCHWc layout is named
after its output, a GELU's five nodes become one ``Gelu``), so its kernels are mapped
through the graph it runs (written with its profile), by tensor names: kernels joined
by tensors the export does not name (its reorders, a Gemm's reshapes) form one unit, and
a unit computes every node of the graph on the paths from the named tensors it reads to
the named tensors it writes."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import numpy as np

from ..cost import CalibratedCost, CostModel, node_config
from ..cost.calibrated import spread
from ..graph import Graph
from ..ops import OPS

# Profiled runs after the warm-up: each kernel's median over them is its time; five
# cost a few seconds on the largest exports measured.
PROFILE_RUNS = 5
# onnxruntime's NchwcTransformer names a node it moves to the NCHWc layout after the
# tensor it computes, with this suffix.
NCHWC_SUFFIX = "_nchwc"


@dataclass
class RuntimeProfile:
    """What one profiled run of a graph says of its nodes."""

    # (seconds per run, graph nodes it computes, its dearest kernel's operator type)
    units: list[tuple[float, list[int], str]]
    kernel_seconds: float                  # per run, every kernel


def runtime_profile(graph: Graph, feeds, runs: int = PROFILE_RUNS) -> RuntimeProfile:
    """``graph`` exported and profiled in onnxruntime (ORT_ENABLE_ALL, one thread,
    ``runs`` runs after a warm-up), each kernel's time mapped to the graph's nodes."""
    import onnx

    from ..onnx_io.exporter import export_fed_named
    from .timing import kernel_times

    model, names = export_fed_named(graph)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/optimized.onnx"
        events = kernel_times(model, feeds, runs, optimized_path=path)
        ran = onnx.load(path, load_external_data=False).graph
    seconds = seconds_per_run(events, runs)
    nodes = [(n.name, list(n.input), list(n.output), n.op_type) for n in ran.node]
    return RuntimeProfile(kernel_units(graph, nodes, names, seconds), sum(seconds.values()))


def seconds_per_run(events: list[dict], runs: int) -> dict[str, float]:
    """Each kernel's seconds in a run (``timing.kernel_times``' events of ``runs`` runs):
    the median over the runs, so that a burst of load during one run does not make its
    kernels look dear (the extractor would take that for a property of theirs)."""
    durations: dict[str, list[float]] = {}
    for event in events:
        durations.setdefault(event["name"], []).append(event["us"] * 1e-6)
    seconds = {}
    for name, times in durations.items():
        per = max(1, len(times) // runs)  # a kernel run more than once a run: its runs' sums
        seconds[name] = float(np.median([sum(times[i:i + per]) for i in range(0, per * runs, per)]))
    return seconds


def kernel_units(graph: Graph, nodes, names: dict, seconds: dict[str, float]) -> list[tuple[float, list[int], str]]:
    """The runtime's kernels (``nodes``: name, input and output tensor names and
    operator type, in the order it runs them) grouped into units joined by tensors
    ``names`` does not know (ONNX name -> (graph node, output)), each unit with its
    ``seconds``, the graph nodes it computes and the operator type of its dearest
    kernel. A node already computed by an earlier unit is not computed again; a unit
    that computes no node adds its time to the unit that wrote what it reads."""
    nodes = _nchwc_named(nodes, names)
    parent = list(range(len(nodes)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    producer: dict[str, int] = {}
    for i, (_, _, outs, _) in enumerate(nodes):
        for t in outs:
            producer[t] = i
    for i, (_, ins, _, _) in enumerate(nodes):
        for t in ins:
            if t and t not in names and t in producer:  # the runtime's own tensor
                parent[find(i)] = find(producer[t])
    units: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        units.setdefault(find(i), []).append(i)
    folded = graph.weight_only_nodes()
    done: set[int] = set()
    result: list[tuple[float, list[int], str]] = []
    written: dict[str, int] = {}  # tensor -> the unit of ``result`` that computed it
    for members in sorted(units.values(), key=min):  # the runtime's order
        outs = {t for i in members for t in nodes[i][2]}
        read = {t for i in members for t in nodes[i][1] if t in names}
        boundary = {names[t][0] for t in read - outs}
        covered: list[int] = []
        stack = [names[t][0] for t in outs if t in names]
        while stack:
            nid = stack.pop()
            if nid in done or nid in boundary or nid in folded or OPS[graph.nodes[nid].op].is_leaf:
                continue
            done.add(nid)
            covered.append(nid)
            stack.extend(t.node for t in graph.nodes[nid].inputs)
        seconds_of_unit = sum(seconds.get(nodes[i][0], 0.0) for i in members)
        source = next((written[t] for t in sorted(read) if t in written), None)
        if not covered and source is not None:
            # it computes nothing new (a reorder back out of NCHWc, a copy): the work
            # of the unit that computed what it reads
            result[source] = (result[source][0] + seconds_of_unit, *result[source][1:])
            continue
        written.update(dict.fromkeys(outs, len(result)))
        dearest = max(members, key=lambda i: (seconds.get(nodes[i][0], 0.0), -i))
        result.append((seconds_of_unit, covered, nodes[dearest][3]))
    return result


def _nchwc_named(nodes, names: dict):
    """The runtime's kernels with the tensors its NCHWc layout writes named as the
    export's: a node it moves to that layout is named after the tensor it computes
    (``t12_0_nchwc``) and writes a tensor of its own (``reorder_token_5``); the rest
    of the layout reads that. Without this, a convnet's body is one unit."""
    alias = {}
    for name, _, outs, _ in nodes:
        computed = name.removesuffix(NCHWC_SUFFIX)
        if name.endswith(NCHWC_SUFFIX) and computed in names and len(outs) == 1 and outs[0] not in names:
            alias[outs[0]] = computed
    return [(name, [alias.get(t, t) for t in ins], [alias.get(t, t) for t in outs], op) for name, ins, outs, op in nodes]


def calibrated_cost(graph: Graph, model: CostModel, feeds, runs: int = PROFILE_RUNS) -> CalibratedCost:
    """``model`` calibrated on one onnxruntime profile of ``graph`` (``runtime_profile``)."""
    profile = runtime_profile(graph, feeds, runs)
    folded = graph.weight_only_nodes()
    configs = {n.id: node_config(n, [t.node in folded for t in n.inputs])
               for n in graph.nodes.values() if n.id not in folded and not OPS[n.op].is_leaf}
    predicted = {nid: model.cost(c) for nid, c in configs.items()}
    measured, _ = spread(profile.units, predicted)
    kind = {nid: op_type for _, nodes, op_type in profile.units for nid in nodes}
    return CalibratedCost.fit(model, [(configs[nid], measured[nid], kind.get(nid, "")) for nid in configs])
