"""The graph IR: a DAG of operator nodes whose edges are typed tensors.

A node has an operator from the table, canonical parameters, input tensors (each an
output of another node) and output types computed by the operator's shape rule when
the node is added, so a Graph is shape-correct by construction. Weight data lives
beside the structure (``weight_data``), never in it, so structure hashes ignore it.
"""

from __future__ import annotations

import copy
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import GraphError, ShapeError
from .ops import INPUT, OPAQUE, OPS, TensorType, WEIGHT
from .ops.leaves import weight_values


@dataclass(frozen=True)
class Tensor:
    """Output ``index`` of node ``node``; ``type`` is filled by the graph."""

    node: int
    index: int
    type: TensorType = field(compare=False, hash=False)

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    def dim(self, i: int) -> int:  # TASO's spelling
        return self.type.shape[i]

    def __repr__(self) -> str:
        return f"Tensor(n{self.node}:{self.index} {self.type})"


@dataclass(eq=False)
class Node:
    id: int
    op: str
    params: dict[str, Any]
    inputs: tuple[Tensor, ...]
    outputs: tuple[TensorType, ...]
    name: str = ""

    def out(self, i: int = 0) -> Tensor:
        return Tensor(self.id, i, self.outputs[i])

    def label(self) -> str:
        return f"node {self.name or self.id} ({self.op})"


class Graph:
    """A computation graph, built with TASO-style methods or by the ONNX importer."""

    def __init__(self, opset: int | None = None):
        from .ops.versions import DEFAULT_OPSET

        self.nodes: dict[int, Node] = {}
        self.weight_data: dict[int, np.ndarray] = {}
        self._outputs: list[tuple[str, Tensor]] = []
        self._names: set[str] = set()
        self._next_id = 0
        self.opset = opset or DEFAULT_OPSET
        self.ir_version = 0  # an imported model's IR version, kept on export
        # an imported decoder's additive masks (where(c, 0, -inf)): tensor -> its ONNX name,
        # and the model they come from, for onnx_io/key_masks.py to prove where asked
        self.masks: dict[tuple[int, int], str] = {}
        self.source = None

    # --- construction --------------------------------------------------------------

    def add_node(self, op: str, inputs: Sequence[Tensor] = (), label: str = "",
                 **params) -> list[Tensor]:
        """Add one operator; its output types come from the table's shape rule."""
        spec = OPS.get(op)
        if spec is None:
            raise GraphError(f"unknown operator {op!r}; known: {sorted(OPS)}")
        where = f"{label or op} ({op}): "
        spec.check_input_count(len(inputs), where)
        for t in inputs:
            if not isinstance(t, Tensor) or t.node not in self.nodes:
                raise GraphError(f"{where}input {t!r} is not a tensor of this graph")
        params = spec.normalize_params(params, where)
        in_types = [t.type for t in inputs]
        try:
            out_types = spec.infer(params, in_types)
        except ShapeError as e:
            raise ShapeError(f"{label + ': ' if label else ''}{e}") from None
        node = Node(self._next_id, op, params, tuple(inputs), tuple(out_types), label)
        self.nodes[node.id] = node
        self._next_id += 1
        for i in spec.positive_inputs:  # e.g. a variance: stand-in data must be > 0
            src = self.nodes[inputs[i].node]
            if src.op == WEIGHT.name and src.id not in self.weight_data:
                self.weight_data[src.id] = np.abs(self.weight_array(src)) + np.asarray(0.5, src.params["dtype"])
        return [node.out(i) for i in range(len(out_types))]

    def _unique_name(self, base: str) -> str:
        return claim_unique_name(base, self._names)

    def new_input(self, dims: Sequence[int], name: str | None = None, dtype: str = "float32") -> Tensor:
        name = self._claim(name, "input")
        try:
            return self.add_node("input", (), name, name=name, shape=tuple(dims), dtype=dtype)[0]
        except Exception:
            self._names.discard(name)  # a rejected call must not use up the name
            raise

    def new_weight(self, dims: Sequence[int], data: np.ndarray | None = None,
                   name: str | None = None, dtype: str | None = None) -> Tensor:
        """A weight; without ``data`` it gets deterministic random values (by name)."""
        if data is not None:
            data = np.asarray(data)
            dtype = dtype or str(data.dtype)
            if tuple(data.shape) != tuple(dims):
                raise ShapeError(f"weight {name or ''}: data shape {list(data.shape)} does not "
                                 f"match dims {list(dims)}")
        name = self._claim(name, "weight")
        try:
            t = self.add_node("weight", (), name, name=name, shape=tuple(dims), dtype=dtype or "float32")[0]
        except Exception:
            self._names.discard(name)  # a rejected call must not use up the name
            raise
        if data is not None:
            self.weight_data[t.node] = data.astype(t.dtype, copy=False)
        return t

    def _claim(self, name: str | None, kind: str) -> str:
        if name is None:
            return self._unique_name(f"{kind}{len(self._names)}")
        if name in self._names:
            raise GraphError(f"duplicate {kind} name {name!r}")
        self._names.add(name)
        return name

    def mark_output(self, t: Tensor, name: str | None = None) -> None:
        if not isinstance(t, Tensor) or t.node not in self.nodes:
            raise GraphError(f"output {t!r} is not a tensor of this graph")
        name = name or f"output{len(self._outputs)}"
        if any(n == name for n, _ in self._outputs):
            raise GraphError(f"duplicate output name {name!r}")
        self._outputs.append((name, t))

    # --- TASO-style builder ------------------------------------------------------------

    def conv2d(self, input: Tensor, weight: Tensor, strides=(1, 1), padding="SAME",
               activation="NONE", bias: Tensor | None = None) -> Tensor:
        ins = (input, weight) if bias is None else (input, weight, bias)
        return self.add_node("conv2d", ins, strides=tuple(strides), padding=_padding(padding),
                             activation=activation.upper())[0]

    def matmul(self, input: Tensor, weight: Tensor, activation="NONE") -> Tensor:
        return self.add_node("matmul", (input, weight), activation=activation.upper())[0]

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        return self.add_node("ewadd", (x, y))[0]

    def mul(self, x: Tensor, y: Tensor) -> Tensor:
        return self.add_node("ewmul", (x, y))[0]

    def scalar_mul(self, x: Tensor, scalar) -> Tensor:
        """x times a scalar: a Python number (becomes a 0-d weight) or a 0-d tensor."""
        if not isinstance(scalar, Tensor):
            scalar = self.new_weight((), data=np.asarray(scalar, dtype=x.dtype))
        return self.add_node("smul", (x, scalar))[0]

    def relu(self, input: Tensor) -> Tensor:
        return self.add_node("relu", (input,))[0]

    def sigmoid(self, input: Tensor) -> Tensor:
        return self.add_node("sigmoid", (input,))[0]

    def tanh(self, input: Tensor) -> Tensor:
        return self.add_node("tanh", (input,))[0]

    def maxpool2d(self, input: Tensor, kernels, strides, padding="VALID", activation="NONE") -> Tensor:
        return self.add_node("maxpool2d", (input,), kernel=tuple(kernels), strides=tuple(strides),
                             padding=_padding(padding), activation=activation.upper())[0]

    def avgpool2d(self, input: Tensor, kernels, strides, padding="VALID", activation="NONE",
                  count_include_pad: int = 1) -> Tensor:
        return self.add_node("avgpool2d", (input,), kernel=tuple(kernels), strides=tuple(strides),
                             padding=_padding(padding), activation=activation.upper(),
                             count_include_pad=int(count_include_pad))[0]

    def global_avgpool(self, input: Tensor) -> Tensor:
        return self.add_node("global_avgpool", (input,))[0]

    def batchnorm(self, input: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor,
                  epsilon: float = 1e-5) -> Tensor:
        return self.add_node("batchnorm", (input, scale, bias, mean, var), epsilon=float(epsilon))[0]

    def concat(self, axis: int, tensors: Sequence[Tensor]) -> Tensor:
        tensors = list(tensors)
        if tensors:
            axis = axis % max(len(tensors[0].shape), 1)
        return self.add_node("concat", tensors, axis=axis)[0]

    def split(self, input: Tensor, axis: int, sizes) -> list[Tensor]:
        if isinstance(sizes, int):  # TASO also accepts a number of equal parts
            n = sizes
            if n <= 0 or input.shape[axis] % n:
                raise ShapeError(f"split: cannot cut dimension {axis} of {input.type} into {n} "
                                 f"equal parts")
            sizes = [input.shape[axis] // n] * n
        return self.add_node("split", (input,), axis=axis % max(len(input.shape), 1),
                             sizes=tuple(int(s) for s in sizes))

    def reshape(self, input: Tensor, shape) -> Tensor:
        from .ops.layout import resolve_reshape

        return self.add_node("reshape", (input,), shape=resolve_reshape(input.shape, shape))[0]

    def transpose(self, input: Tensor, perm, shuffle: bool = False) -> Tensor:
        # TASO's `shuffle` chose a memory layout; it changes no values, so it is ignored.
        return self.add_node("transpose", (input,), perm=tuple(int(p) for p in perm))[0]

    def enlarge(self, weight: Tensor, ref: Tensor) -> Tensor:
        return self.add_node("enlarge", (weight, ref))[0]

    def merge_gconv(self, weight: Tensor, groups: int, count: int) -> Tensor:
        return self.add_node("merge_gconv", (weight,), groups=groups, count=count)[0]

    def constant(self, kind: str, dims, dtype: str = "float32") -> Tensor:
        """TASO's generated constants: 'iconv', 'imm', 'one' or 'pool'."""
        return self.add_node(f"const_{kind}", (), shape=tuple(dims), dtype=dtype)[0]

    # --- reading -------------------------------------------------------------------

    @property
    def outputs(self) -> list[tuple[str, Tensor]]:
        """Marked outputs; a graph with none marked (TASO style) outputs its sinks."""
        if self._outputs:
            return list(self._outputs)
        used = {(t.node, t.index) for n in self.nodes.values() for t in n.inputs}
        sinks = [n.out(i) for n in self.nodes.values() if not OPS[n.op].is_leaf
                 for i in range(len(n.outputs)) if (n.id, i) not in used]
        return [(f"output{k}", t) for k, t in enumerate(sinks)]

    def inputs(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.op == INPUT.name]

    def weights(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.op == WEIGHT.name]

    def weight_array(self, node: Node) -> np.ndarray:
        data = self.weight_data.get(node.id)
        if data is None:
            data = weight_values(node.params["shape"], node.params["dtype"], node.params["name"])
            self.weight_data[node.id] = data
        return data

    def op_counts(self, runtime_only: bool = False) -> Counter:
        """Operators by type (leaves excluded); ``runtime_only`` also leaves out the
        weight-only work that export folds into constants."""
        folded = self.weight_only_nodes() if runtime_only else set()
        return Counter(n.op for n in self.nodes.values()
                       if n.op not in (INPUT.name, WEIGHT.name) and n.id not in folded)

    def weight_only_nodes(self) -> set[int]:
        """Nodes computed from weights and constants alone: folded into initializers at
        export, so free at run time."""
        out: set[int] = set()
        for n in self.topo_order():
            spec = OPS[n.op]
            if spec.is_constant or (not spec.is_leaf and n.op != OPAQUE.name and n.inputs
                                    and all(t.node in out for t in n.inputs)):
                out.add(n.id)
        return out

    def topo_order(self, extra_deps: Mapping[int, set[int]] | None = None) -> list[Node]:
        """Nodes in dependency order (Kahn's algorithm, ties by id for determinism).
        ``extra_deps`` adds ordering edges (node id -> ids that must come first)."""
        import heapq

        indegree = {nid: 0 for nid in self.nodes}
        users: dict[int, list[int]] = {nid: [] for nid in self.nodes}
        for n in self.nodes.values():
            for src in {t.node for t in n.inputs} | set((extra_deps or {}).get(n.id, ())):
                if src not in self.nodes:
                    raise GraphError(f"{n.label()}: input comes from missing node {src}")
                indegree[n.id] += 1
                users[src].append(n.id)
        ready = [nid for nid, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            nid = heapq.heappop(ready)
            order.append(self.nodes[nid])
            for u in users[nid]:
                indegree[u] -= 1
                if indegree[u] == 0:
                    heapq.heappush(ready, u)
        if len(order) != len(self.nodes):
            stuck = sorted(nid for nid, d in indegree.items() if d > 0)
            names = ", ".join(self.nodes[i].label() for i in stuck[:5])
            raise GraphError(f"graph has a cycle through {names}")
        return order

    def validate(self) -> None:
        """Check edges, types and acyclicity; raise GraphError/ShapeError naming the node."""
        for n in self.nodes.values():
            for t in n.inputs:
                src = self.nodes.get(t.node)
                if src is None or t.index >= len(src.outputs):
                    raise GraphError(f"{n.label()}: dangling input {t!r}")
                if src.outputs[t.index] != t.type:
                    raise ShapeError(f"{n.label()}: input {t!r} disagrees with its producer "
                                     f"({src.outputs[t.index]})")
            spec = OPS[n.op]
            if spec.infer(n.params, [t.type for t in n.inputs]) != list(n.outputs):
                raise ShapeError(f"{n.label()}: stored output types {list(map(str, n.outputs))} "
                                 f"differ from the shape rule")
        for name, t in self.outputs:
            if t.node not in self.nodes:
                raise GraphError(f"output {name!r} refers to a missing node")
        self.topo_order()

    def structural_hash(self) -> str:
        """A hash of the computation: operators, parameters and wiring, with inputs and
        weights identified by name. Node ids and insertion order do not matter."""
        digest: dict[int, bytes] = {}
        for n in self.topo_order():
            digest[n.id] = node_digest(node_local_bytes(n), n.inputs, digest.__getitem__)
        return outputs_digest(self.outputs, digest.__getitem__)

    def copy(self) -> Graph:
        """A copy to rewrite: its own node table and outputs, sharing the (immutable)
        Node objects and weight arrays with this graph."""
        out = copy.copy(self)
        out.nodes = dict(self.nodes)
        out.weight_data = dict(self.weight_data)
        out._outputs = list(self._outputs)
        out._names = set(self._names)
        return out

    @property
    def has_named_outputs(self) -> bool:
        """Whether outputs were marked (else ``outputs`` names the sinks)."""
        return bool(self._outputs)

    @property
    def next_id(self) -> int:
        """The id the next added node gets (ids grow in creation order)."""
        return self._next_id

    def redirect_output(self, old: Tensor, new: Tensor) -> int:
        """Graph outputs that were ``old`` become ``new`` (names kept); how many."""
        hits = 0
        for k, (name, t) in enumerate(self._outputs):
            if t == old:
                self._outputs[k] = (name, new)
                hits += 1
        return hits

    def drop_unread(self) -> None:
        """Remove the nodes no output reads (inputs stay: they are the interface), in
        place: what a pass that rewires a graph leaves behind."""
        live: set[int] = set()
        stack = [t.node for _, t in self.outputs]
        while stack:
            i = stack.pop()
            if i not in live:
                live.add(i)
                stack.extend(t.node for t in self.nodes[i].inputs)
        for i in [i for i, n in self.nodes.items() if i not in live and n.op != INPUT.name]:
            del self.nodes[i]
            self.weight_data.pop(i, None)

    def summary(self) -> str:
        counts = self.op_counts()
        ops = ", ".join(f"{op} x{c}" for op, c in sorted(counts.items()))
        return (f"Graph: {len(self.inputs())} inputs, {len(self.weights())} weights, "
                f"{sum(counts.values())} operators ({ops})")

    def __repr__(self) -> str:
        return self.summary()


_INDEX_BYTES = [i.to_bytes(2, "little") for i in range(1 << 16)]


def node_local_bytes(node: Node) -> bytes:
    """What identifies a node besides its inputs: operator and parameters."""
    return node.op.encode() + repr(sorted(node.params.items())).encode()


def node_digest(local: bytes, inputs: Sequence[Tensor], digest_of) -> bytes:
    """One node's structural digest from its local bytes and its inputs' digests
    (``digest_of(node_id)``). Search code updates hashes incrementally with it."""
    h = hashlib.blake2b(local, digest_size=16)
    for t in inputs:
        h.update(digest_of(t.node) + _INDEX_BYTES[t.index])
    return h.digest()


def outputs_digest(outputs: Sequence[tuple[str, Tensor]], digest_of) -> str:
    """The graph's structural hash from its named outputs' node digests."""
    top = hashlib.blake2b(digest_size=16)
    for name, t in outputs:
        top.update(name.encode())
        top.update(digest_of(t.node) + _INDEX_BYTES[t.index])
    return top.hexdigest()


def claim_unique_name(base: str, used: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``used``; claims it."""
    name, k = base, 1
    while name in used:
        name, k = f"{base}_{k}", k + 1
    used.add(name)
    return name


def _padding(padding):
    if isinstance(padding, str):
        return padding.upper()
    return tuple(int(v) for v in padding)


def new_graph() -> Graph:
    """TASO's entry point: ``g = taso_egg.new_graph()``."""
    return Graph()
