"""Graph -> egglog program, and serialized e-graph + choice -> Graph.

Both directions are iterative (no recursion), so a 2,000-layer chain converts. The
way in writes one ``let`` per graph node. Conv biases become an explicit broadcast add
(TASO's conv has no bias, so its rules apply), and a post-pass fuses them back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..errors import ExtractionError
from ..graph import Graph, Node, Tensor
from ..ops import CONCAT, CONV2D, EWADD, INPUT, OPAQUE, OPS, RESHAPE, SCALAR, SPLIT, TensorType, WEIGHT
from ..ops.shapes import evaluate
from .language import (OP_OF_CONSTRUCTOR, constructor, decode_padding, egraph_params, encode,
                       encode_param, returns_tuple, tensor_arity)


# Operators the e-graph of any graph may hold beyond the graph's own: the conversion
# writes conv biases as a broadcast add plus activation, broadcasts as reshapes, and
# 0-d weights also as the scalars of their values.
CONVERSION_OPS = frozenset({RESHAPE.name, EWADD.name, SCALAR.name} | {op for op in OPS if OPS[op].activation})
_ACTIVATION_OP = {OPS[op].activation: op for op in OPS if OPS[op].activation}


@dataclass
class GraphProgram:
    text: str
    output_vars: list[str]
    opaque: dict[str, Node]  # opaque key -> original node (its parameters and types)
    # (node id, output index) -> the variable bound to that tensor of the graph
    tensor_vars: dict[tuple[int, int], str] = field(default_factory=dict)


def _var(t: Tensor, multi: set[int], names: str = "$n") -> str:
    return f"{names}{t.node}_{t.index}" if t.node in multi else f"{names}{t.node}"


def egraph_form(node: Node) -> tuple[dict, list[tuple]] | None:
    """The parameters and input shapes the e-graph's shape cases (OpSpec.shape) see for
    ``node``: an optional conv bias left out (it becomes an add), broadcast operands at
    the output's rank, axes non-negative. None for operators whose e-graph form takes
    other inputs (n-ary concat nests, split and opaque nodes): those always fit."""
    spec = OPS[node.op]
    n = tensor_arity(node.op)
    if spec.multi_output or len(node.inputs) < n or (spec.inputs[1] is None and len(node.inputs) != n):
        return None
    shapes = [t.shape for t in node.inputs[:n]]
    rank = len(node.outputs[0].shape)
    if spec.broadcasts:
        shapes = [(1,) * (rank - len(s)) + s for s in shapes]
    params = dict(node.params)
    if "axis" in params and rank:
        params["axis"] %= rank
    return params, shapes


def _egraph_supported(node: Node) -> bool:
    """Configurations the e-graph's shape rules cover; others enter as barriers
    (batched matmuls whose batch dims broadcast, ranks past MAX_RANK, ...)."""
    if not OPS[node.op].shape:  # onnxruntime's kernels the rules do not name (attention's)
        return node.op == OPAQUE.name
    form = egraph_form(node)
    return form is None or evaluate(OPS[node.op].shape, *form) == node.outputs[0].shape


def graph_to_program(graph: Graph, names: str = "$") -> GraphProgram:
    """The egglog commands that build ``graph``'s terms, as ``let`` globals named
    ``names`` + ``n<node id>`` (and ``h<k>`` for helper terms): another prefix adds a
    second graph beside one already in the e-graph, sharing its terms where equal."""
    lines: list[str] = []
    barriers = {n.id for n in graph.nodes.values() if not _egraph_supported(n)}
    multi = barriers | {n.id for n in graph.nodes.values() if len(n.outputs) > 1 or OPS[n.op].multi_output}
    opaque: dict[str, Node] = {}
    weight_ids = {n.id: i for i, n in enumerate(graph.weights())}
    fresh = iter(range(1 << 62))

    def emit(expr: str) -> str:
        name = f"{names}h{next(fresh)}"
        lines.append(f"(let {name} {expr})")
        return name

    for node in graph.topo_order():
        ins = [_var(t, multi, names + "n") for t in node.inputs]
        op, p = node.op, node.params
        if op == OPAQUE.name or node.id in barriers:
            key = f"{op}#{node.id}"
            opaque[key] = node
            tlist = "(TNil)"
            for v in reversed(ins):
                tlist = f"(TCons {v} {tlist})"
            lines.append(f'(let {names}n{node.id} (Opaque {encode("String", key)} {tlist}))')
            for i, t in enumerate(node.outputs):
                lines.append(f"(let {names}n{node.id}_{i} (Proj {names}n{node.id} {i}))")
                lines.append(f"(set (shape {names}n{node.id}_{i}) {encode('IVec', t.shape)})")
                lines.append(f"(set (dtype {names}n{node.id}_{i}) {encode('String', t.dtype)})")
            continue
        if op == WEIGHT.name:
            expr = f"(Weight {weight_ids[node.id]} {_params(op, p, skip_first=True)})"
        elif op == CONCAT.name:
            expr, axis = ins[-1], p["axis"] % len(node.outputs[0].shape)
            for v in reversed(ins[:-1]):
                expr = f"(Concat {axis} {v} {expr})"
        elif op == SPLIT.name:
            p = dict(p, axis=p["axis"] % len(node.outputs[0].shape))
            expr = f"(Split {_params(op, p)} {ins[0]})"
        elif op == CONV2D.name and len(ins) == 3:
            expr = _conv_with_bias(node, ins, emit)
        elif OPS[op].broadcasts:
            a, b = (_match_rank(v, t.type, len(node.outputs[0].shape), emit)
                    for v, t in zip(ins, node.inputs))
            expr = f"({constructor(op)} {a} {b})"
        else:
            expr = f"({constructor(op)} {_params(op, p)} {' '.join(ins)})"
        lines.append(f"(let {names}n{node.id} {expr})")
        if op == WEIGHT.name and not node.outputs[0].shape and node.id in graph.weight_data \
                and node.outputs[0].dtype in ("float16", "float32", "float64"):
            # a 0-d weight is also the scalar of its value, which rules can name
            value = float(graph.weight_data[node.id])
            if math.isfinite(value):
                lines.append(f"(union {names}n{node.id} ({constructor(SCALAR.name)} {encode('f64', value)} {encode('String', node.outputs[0].dtype)}))")
        if node.id in multi:
            for i in range(len(node.outputs)):
                lines.append(f"(let {names}n{node.id}_{i} (Proj {names}n{node.id} {i}))")
    outputs = [_var(t, multi, names + "n") for _, t in graph.outputs]
    tensor_vars = {(n.id, i): _var(n.out(i), multi, names + "n") for n in graph.nodes.values() for i in range(len(n.outputs))}
    return GraphProgram("\n".join(lines) + "\n", outputs, opaque, tensor_vars)


def _params(op: str, p: dict, skip_first: bool = False) -> str:
    params = egraph_params(op)[1:] if skip_first else egraph_params(op)
    return " ".join(encode_param(q, p[q.name]) for q in params)


def _match_rank(var: str, t: TensorType, rank: int, emit) -> str:
    if len(t.shape) == rank:
        return var
    shape = (1,) * (rank - len(t.shape)) + t.shape
    return emit(f"({constructor(RESHAPE.name)} {encode('IVec', shape)} {var})")


def _conv_with_bias(node: Node, ins: list[str], emit) -> str:
    p = dict(node.params)
    act = p["activation"]
    p["activation"] = "NONE"
    conv = emit(f"(Conv2d {_params(CONV2D.name, p)} {ins[0]} {ins[1]})")
    o = node.inputs[1].shape[0]
    bias = emit(f"({constructor(RESHAPE.name)} {encode('IVec', (1, o, 1, 1))} {ins[2]})")
    out = emit(f"({constructor(EWADD.name)} {conv} {bias})")
    if act != "NONE":
        out = emit(f"({constructor(_ACTIVATION_OP[act])} {out})")
    return out


# --- the way out -------------------------------------------------------------------------

@dataclass
class ENode:
    id: str
    op: str                 # operator name from the table, or "proj", "tnil", "tcons"
    params: dict
    children: list[str]     # child e-class ids (tensor-like sorts only)


@dataclass
class TensorEGraph:
    """The serialized e-graph restricted to tensor classes, with decoded parameters."""
    classes: dict[str, list[ENode]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    roots: list[str] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return sum(len(v) for v in self.classes.values())


_TENSOR_SORTS = ("T", "TTup", "TList")


def read_serialized(data: dict) -> TensorEGraph:
    nodes, class_data = data["nodes"], data.get("class_data", {})
    sort_of = {cid: info.get("type") for cid, info in class_data.items()}
    values: dict[str, object] = {}

    def value(nid: str):
        if nid in values:
            return values[nid]
        node = nodes[nid]
        op = node["op"]
        if op in ("vec-of", "vec-empty"):
            v = tuple(value(c) for c in node["children"])
        elif op.startswith('"'):
            v = json.loads(op)
        else:
            v = float(op) if any(ch in op for ch in ".eEn") else int(op)
        values[nid] = v
        return v

    member = {}
    for nid, node in nodes.items():
        member.setdefault(node["eclass"], nid)
    eg = TensorEGraph()
    for nid, node in nodes.items():
        sort = sort_of.get(node["eclass"])
        op = node["op"]
        if op in ("shape", "dtype"):
            table = eg.shapes if op == "shape" else eg.dtypes
            table[nodes[node["children"][0]]["eclass"]] = value(member[node["eclass"]])
            continue
        if sort not in _TENSOR_SORTS or node.get("subsumed"):
            continue
        eg.classes.setdefault(node["eclass"], []).append(_decode_node(nid, node, nodes, sort_of, value))
    eg.roots = list(data.get("root_eclasses", []))
    return eg


def _decode_node(nid, node, nodes, sort_of, value) -> ENode:
    op = node["op"]
    kids = node["children"]
    if op == "Proj":
        return ENode(nid, "proj", {"index": value(kids[1])}, [nodes[kids[0]]["eclass"]])
    if op in ("TNil", "TCons"):
        return ENode(nid, op.lower(), {}, [nodes[k]["eclass"] for k in kids])
    name = OP_OF_CONSTRUCTOR.get(op)
    if name is None:
        raise ExtractionError(f"serialized e-graph: unknown constructor {op!r} in node {nid}")
    params = {}
    spec = egraph_params(name)
    for p, kid in zip(spec, kids):
        v = value(kid)
        params[p.name] = decode_padding(v) if p.kind == "padding" else v
    children = [nodes[k]["eclass"] for k in kids[len(spec):]]
    return ENode(nid, name, params, children)


def weight_only_classes(eg: TensorEGraph) -> set[str]:
    """The classes computed from weights alone (folded at export)."""
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for cid, nodes in eg.classes.items():
            if cid in out:
                continue
            for n in nodes:
                leaf_const = n.op != "proj" and n.op in OPS and OPS[n.op].is_constant
                derived = n.op not in (OPAQUE.name, INPUT.name, "tnil", "tcons") and n.children and \
                    all(c in out for c in n.children)
                if leaf_const or derived:
                    out.add(cid)
                    changed = True
                    break
    return out


def add_fused_convs(eg: TensorEGraph) -> TensorEGraph:
    """Add, in place, the convs the graph builder fuses as e-nodes of their own: a bias
    add of a conv's class (an unfused two-input conv) and a weight-only per-channel
    bias gets, in its class, a ``conv2d`` e-node of three children (input, kernel,
    bias); an activation of such an add's class gets one with that activation. The
    builder writes one as the conv, add and activation it stands for, which
    ``fuse_bias_and_activation`` makes one conv again. So extraction can price a conv
    with its bias and activation as the one kernel that runs, instead of the conv,
    a broadcast add and an activation apart."""
    weight_only = weight_only_classes(eg)
    fused: dict[str, list[ENode]] = {}  # add's class -> its fused convs
    for cid, nodes in list(eg.classes.items()):
        for n in nodes:
            if n.op != EWADD.name or len(n.children) != 2:
                continue
            for conv_cls, bias_cls in (n.children, n.children[::-1]):
                shape = eg.shapes.get(conv_cls)
                if bias_cls in weight_only and conv_cls not in weight_only and shape is not None \
                        and len(shape) == 4 and fusable_bias(eg.shapes.get(bias_cls, ()), shape[1]):
                    for m in eg.classes[conv_cls]:
                        if m.op == CONV2D.name and len(m.children) == 2 and m.params["activation"] == "NONE":
                            fused.setdefault(cid, []).append(
                                ENode(f"{n.id}/{m.id}", CONV2D.name, dict(m.params), m.children + [bias_cls]))
                    break
    for cid, nodes in list(eg.classes.items()):
        for n in nodes:
            act = OPS[n.op].activation if n.op in OPS else ""
            if act and len(n.children) == 1:
                eg.classes[cid].extend(ENode(f"{n.id}/{f.id}", CONV2D.name, dict(f.params, activation=act),
                                             list(f.children)) for f in fused.get(n.children[0], ()))
    for cid, convs in fused.items():
        eg.classes[cid].extend(convs)
    return eg


def build_graph(eg: TensorEGraph, picks: list[tuple[str, str]], source: Graph,
                opaque: dict[str, Node], classes: dict | None = None) -> Graph:
    """Rebuild a Graph from an extraction: (class, chosen node id) pairs, children
    before parents (as ``extract.choice_check.used_classes`` orders a validated choice).
    ``classes``, when given, is filled with the e-class each tensor of the returned
    graph was built from, ``(node id, output index) -> class id`` (the check compares
    them with the input's tensors of the same class)."""
    by_id = {n.id: n for nodes in eg.classes.values() for n in nodes}
    g = Graph(opset=source.opset)
    g.ir_version = source.ir_version
    weights = {n.params["name"]: n for n in source.weights()}
    # Every input of the source, in its order, used or not: the model's interface
    # (what callers feed) does not change with what the extraction picked.
    inputs = {n.params["name"]: g.new_input(n.params["shape"], name=n.params["name"],
                                            dtype=n.params["dtype"]) for n in source.inputs()}
    built: dict[str, object] = {}  # class -> Tensor, list[Tensor] (tuples) or list (TList)
    for cid, nid in picks:
        n = by_id[nid]
        kids = [built[c] for c in n.children]
        built[cid] = inputs[n.params["name"]] if n.op == INPUT.name else \
            _build_node(g, n, kids, weights, source, opaque)
    for (name, _), cid in zip(source.outputs, eg.roots):
        g.mark_output(built[cid], name)
    if classes is not None:
        classes.update({(t.node, t.index): cid for cid, t in built.items() if isinstance(t, Tensor)})
    return fuse_bias_and_activation(g, classes)


def _build_node(g: Graph, n: ENode, kids, weights, source, opaque):
    if n.op == "tnil":
        return []
    if n.op == "tcons":
        return [kids[0]] + kids[1]
    if n.op == "proj":
        return kids[0][n.params["index"]]
    if n.op == WEIGHT.name:
        src = weights[n.params["name"]]
        t = g.new_weight(n.params["shape"], name=n.params["name"], dtype=n.params["dtype"])
        if src.id in source.weight_data:  # stand-in data (none stored) regenerates by name
            g.weight_data[t.node] = source.weight_data[src.id]
        return t
    if n.op == OPAQUE.name:
        orig = opaque[n.params["key"]]
        return g.add_node(orig.op, kids[0], orig.name, **orig.params)
    params = dict(n.params)
    if n.op == CONCAT.name:
        return g.add_node(CONCAT.name, kids, axis=params["axis"])[0]
    if n.op == CONV2D.name and len(kids) == 3:  # a fused conv (add_fused_convs), fused again below
        out = g.add_node(EWADD.name, [g.add_node(CONV2D.name, kids[:2], **dict(params, activation="NONE"))[0],
                                    kids[2]])[0]
        act = params["activation"]
        return out if act == "NONE" else g.add_node(_ACTIVATION_OP[act], [out])[0]
    outs = g.add_node(n.op, kids, **params)
    return outs if returns_tuple(n.op) else outs[0]


def fusable_bias(shape: tuple, channels: int) -> bool:
    """Whether a weight-only tensor of ``shape`` added to a conv's output of
    ``channels`` channels is a per-channel bias the conv can take."""
    return tuple(shape) in ((1, channels, 1, 1), (channels, 1, 1))


def fuse_bias_and_activation(g: Graph, classes: dict | None = None) -> Graph:
    """Undo the bias split of the way in: conv -> add(reshaped weight-only bias) ->
    activation becomes one conv node again, flattening nested concats as well.
    ``classes`` (tensor -> e-class, as ``build_graph`` fills it) is carried over to
    the returned graph, in place."""
    users: dict[tuple[int, int], list[Node]] = {}
    for n in g.nodes.values():
        for t in n.inputs:
            users.setdefault((t.node, t.index), []).append(n)
    outputs = {(t.node, t.index) for _, t in g.outputs}

    def sole_user(t: Tensor):
        us = users.get((t.node, t.index), [])
        return us[0] if len(us) == 1 and (t.node, t.index) not in outputs else None

    weight_only = g.weight_only_nodes()
    replace: dict[int, tuple] = {}  # node id to drop -> how its output is rebuilt
    for n in list(g.topo_order()):
        if n.op != CONV2D.name or len(n.inputs) != 2 or n.params["activation"] != "NONE":
            continue
        add = sole_user(n.out())
        if add is None or add.op != EWADD.name:
            continue
        other = add.inputs[1] if add.inputs[0].node == n.id else add.inputs[0]
        if other.node not in weight_only or not fusable_bias(other.shape, n.outputs[0].shape[1]):
            continue
        act_node = sole_user(add.out())
        act = OPS[act_node.op].activation if act_node is not None and act_node.op in OPS else ""
        act = act or "NONE"
        replace[n.id] = (other, add, act_node if act != "NONE" else None, act)
    out = _flatten_concats(_rebuild_with_fusions(g, replace, classes) if replace else g)
    if classes is not None:  # tensors the post-passes dropped have no class any more
        for key in [k for k in classes if k[0] not in out.nodes]:
            del classes[key]
    return out


def _rebuild_with_fusions(g: Graph, replace, classes: dict | None = None) -> Graph:
    new = Graph(opset=g.opset)
    new.ir_version = g.ir_version
    mapping: dict[tuple[int, int], Tensor] = {}
    alias: dict[tuple[int, int], tuple[int, int]] = {}
    for conv_id, (bias, add, act_node, act) in replace.items():
        last = act_node if act_node is not None else add
        alias[(last.id, 0)] = (conv_id, 0)
    skip = {add.id for _, add, _, _ in replace.values()} | \
           {a.id for _, _, a, _ in replace.values() if a is not None}
    # each fused conv must also come after its bias
    for n in g.topo_order({conv_id: {bias.node} for conv_id, (bias, _, _, _) in replace.items()}):
        if n.id in skip:
            continue
        ins = [mapping[alias.get((t.node, t.index), (t.node, t.index))] for t in n.inputs]
        if n.op == INPUT.name:
            outs = [new.new_input(n.params["shape"], n.params["name"], n.params["dtype"])]
        elif n.op == WEIGHT.name:
            outs = [new.new_weight(n.params["shape"], name=n.params["name"], dtype=n.params["dtype"])]
            if n.id in g.weight_data:  # stand-in data (none stored) regenerates by name
                new.weight_data[outs[0].node] = g.weight_data[n.id]
        elif n.id in replace:
            bias_t, _, _, act = replace[n.id]
            o = n.outputs[0].shape[1]
            src = g.nodes[bias_t.node]
            if src.op == RESHAPE.name and src.inputs[0].shape == (o,):
                b = mapping[(src.inputs[0].node, src.inputs[0].index)]  # the bias as it came in
            else:
                b = new.reshape(mapping[(bias_t.node, bias_t.index)], (o,))
            params = dict(n.params, activation=act)
            outs = new.add_node(CONV2D.name, ins + [b], n.name, **params)
        else:
            outs = new.add_node(n.op, ins, n.name, **n.params)
        for i, t in enumerate(outs):
            mapping[(n.id, i)] = t
    for name, t in g.outputs:
        new.mark_output(mapping[alias.get((t.node, t.index), (t.node, t.index))], name)
    if classes is not None:
        # a fused conv computes its last node's class (the add or the activation); the
        # bare conv's and the add's values before the activation no longer exist
        old = dict(classes)
        classes.clear()
        for key, cid in old.items():
            t = mapping.get(alias.get(key, key)) if key[0] not in replace else None
            if t is not None and (key in alias or key[0] not in skip):
                classes[(t.node, t.index)] = cid
    _drop_unused(new)
    return new


def _flatten_concats(g: Graph) -> Graph:
    """concat(a, concat(b, c)) on one axis -> concat(a, b, c), where only concats on
    that axis read the inner one (which then is never materialized: each reader copies
    its parts, which costs what copying it would). Extraction prices nested concats
    the same way (``pricing.nested_concats``)."""
    readers: dict[int, set] = {}
    for n in g.nodes.values():
        for t in n.inputs:
            readers.setdefault(t.node, set()).add(n.params.get("axis") if n.op == CONCAT.name else "other")
    outputs = {t.node for _, t in g.outputs}
    changed = False
    for n in g.topo_order():
        if n.op != CONCAT.name:
            continue
        flat = []
        for t in n.inputs:
            src = g.nodes[t.node]
            if src.op == CONCAT.name and src.params["axis"] == n.params["axis"] \
                    and readers[src.id] == {n.params["axis"]} and src.id not in outputs:
                flat.extend(src.inputs)
                changed = True
            else:
                flat.append(t)
        n.inputs = tuple(flat)
    if changed:
        _drop_unused(g)
    return g


def _drop_unused(g: Graph) -> None:
    live = {t.node for _, t in g.outputs}
    for n in reversed(g.topo_order()):
        if n.id in live:
            live.update(t.node for t in n.inputs)
    for nid in [nid for nid in g.nodes if nid not in live and g.nodes[nid].op != INPUT.name]:
        del g.nodes[nid]
        g.weight_data.pop(nid, None)
