"""Models with symbolic dims: imported at representative sizes, written back with
their symbolic dims, checked at two sizes.

``DynamicModel.load`` imports a model at the sizes ``dims.DimPlan`` chooses (the
graph ``optimize`` prices, saturates and times), told the model's types at the second
sizes so that what depends on the sizes (masks, position ranges) stays computed at run
time; both imports then make the same choices, node for node. ``write_symbolic`` turns the chosen
candidate into a model with the input's interface: the candidate is rebuilt at the
second sizes (the re-export is the input imported there; the extracted graph is
retyped tensor by tensor, each taking the type the input's tensor of its e-class has
at those sizes), both are exported and ``symbolize``d into one model, and that model
is checked against the input in onnxruntime at both sizes. A candidate that cannot be
written so, or differs at either size, is refused with the reason and the tensors
responsible (``SymbolicWrite.culprits``: where a rewrite held only at the priced
sizes), which ``optimize_graph.optimize`` forbids and extracts again without.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import ExecutionError, ShapeError, VerificationError
from ..graph import Graph
from ..onnx_io.importer import OtherSizes, load_onnx, value_types
from ..ops import INPUT, OPAQUE, RESHAPE, SPLIT, WEIGHT
from .dims import DimPlan, Interface, describe_sizes, input_types, tied_sizes
from .symbolize import NotSymbolic, symbolize, writable_sizes


@dataclass
class DynamicModel:
    """An ONNX model and its import at representative sizes (``graph``; ``first``, one
    size per symbol), with the second sizes it is also written and checked at."""

    reference: object                 # the ModelProto, as onnxruntime runs the original
    iface: Interface
    first: dict[str, int]
    second: dict[str, int]
    graph: Graph
    fixed: bool = False               # written with the symbolic dims fixed at ``first``
    # sizes where a dim is 0 (an empty cache; a 0 given), where the written model is
    # also checked: nothing is priced or imported there, the table models no empty tensor
    empty: dict[str, int] | None = None
    new_tokens: frozenset = frozenset()  # the dims a cache grows by, priced at one token
    _second_graph: Graph | None = field(default=None, repr=False)
    # (sizes, seed) -> the reference's outputs there, run once for every candidate checked
    _reference_outputs: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, reference, given: Mapping[str, Sequence[int]] | None = None,
             fixed: bool = False) -> DynamicModel:
        """``given``: input name -> shape (--input-shape), the sizes to price and time at;
        ``fixed``: the model is written with them (--fix-shapes), so everything that
        depends on them may fold. The sizes are chosen once (``dims.DimPlan``); where an
        opaque node cannot take them, the defaulted ones grow."""
        plan = DimPlan.choose(reference, given, fixed)
        iface, first = plan.iface, plan.first
        while True:
            second = plan.second(first)
            grown = plan.grown(first)
            at = second  # the sizes an opaque node is probed at, for the error
            try:
                other = None
                if not fixed and iface.symbolic:
                    second, second_types = _second_that_runs(reference, plan, first, second)
                    other = OtherSizes(second_types, writable_sizes(first, second))
                at = first
                graph = load_onnx(reference, plan.import_shapes(first), other)
            except ExecutionError as e:
                # an opaque node's types probed in onnxruntime: a window longer than
                # its input (a speech encoder's strided convolutions) at these sizes
                if grown is None or not _too_small(e):
                    raise plan.refused(plan.at_sizes(e, at)) from None
                first = grown
                continue
            except ShapeError as e:
                raise plan.at_sizes(e, first) from None
            if grown is None or _runs(reference, graph):
                return cls(reference, iface, first, second, graph, fixed=fixed, empty=plan.empty(first),
                           new_tokens=plan.new_tokens_at(first))
            first = grown

    @property
    def may_be_empty(self) -> frozenset:
        """The symbols that may be 0 at run time (an empty cache): those checked at 0."""
        return frozenset(s for s, v in (self.empty or {}).items() if v == 0)

    @property
    def symbolic(self) -> bool:
        return self.iface.symbolic

    def second_graph(self) -> Graph:
        """The model imported at the second sizes (made when first asked for)."""
        if self._second_graph is None:
            other = None if self.fixed else OtherSizes(value_types(self.reference, self.iface.shapes(self.first)),
                                                       writable_sizes(self.second, self.first))
            self._second_graph = load_onnx(self.reference, self.iface.shapes(self.second), other)
        return self._second_graph


def _second_that_runs(reference, plan: DimPlan, first: Mapping[str, int],
                      second: dict[str, int]) -> tuple[dict[str, int], dict]:
    """``second`` and the model's value types there; where an opaque node refuses those
    sizes, ``second`` with one chosen dim held at its first size, the first such that
    runs (onnxruntime-genai's ``kv_cache_dim``, which GroupQueryAttention takes at the
    head size alone). One probe per chosen dim at most; none runs: the first error."""
    iface, relations = plan.iface, plan.relations
    try:
        return second, value_types(reference, iface.shapes(second))
    except ExecutionError as e:
        refused = e
    set_by_given = plan.given_dims()
    for s in iface.symbols:
        if s in relations or s in set_by_given or second[s] == first[s]:
            continue
        held = tied_sizes({d: v for d, v in second.items() if d not in relations} | {s: first[s]}, relations)
        try:
            return held, value_types(reference, iface.shapes(held))
        except ExecutionError:
            continue
    raise refused


def _runs(reference, graph: Graph) -> bool:
    """Whether the model runs at the sizes ``graph`` was imported at and returns whole
    outputs there. Where the import holds an empty tensor or an opaque node (whose types
    may have come from ONNX's shape inference, which lets a window outlast its input),
    onnxruntime runs the model: sizes too small fail there, or leave an output empty or
    undefined (a conv stack over 64 audio samples has no frames). An empty tensor the
    outputs do not show is the model's own, at every size (Phi-3's rotary pass-through,
    ``q[..., 32:]`` of a 32-wide head): growing the sizes would never fill it."""
    from ..check.runtime import onnx_outputs
    from ..executor import random_inputs

    empty = any(0 in t.shape for n in graph.nodes.values() for t in n.outputs)
    if not empty and not any(n.op == OPAQUE.name for n in graph.nodes.values()):
        return True
    try:
        outputs = onnx_outputs(reference, random_inputs(graph))
    except Exception as e:  # onnxruntime's own errors carry no common type
        return not _too_small(e)
    if not empty:
        return True
    return all(v.size and (v.dtype.kind != "f" or np.isfinite(v).all())
               for v in map(np.asarray, outputs.values()))


def _too_small(error: Exception) -> bool:
    """Whether onnxruntime refused a node for its input's shape (e.g. Conv's "Invalid
    input shape": a window longer than its input): larger sizes may run."""
    return "shape" in str(error).lower()


@dataclass
class SymbolicWrite:
    """``write_symbolic``'s outcome: the model to write, or why there is none."""

    model: object | None
    errors: dict[str, float]   # sizes described -> the worst relative error there
    why: str = ""
    # the candidate's tensors, ``(node id, output index)``, that make it wrong at the
    # second sizes (where the first wrong tensors, their type or values not the input's
    # equal tensor's, come from), as sets to forbid, the narrowest first: ``_regions``;
    # empty where none was found
    culprits: tuple = ()


def write_symbolic(dyn: DynamicModel, candidate: Graph, candidate_classes: Mapping | None = None,
                   input_classes: Mapping | None = None, seed: int = 0) -> SymbolicWrite:
    """``candidate`` (a graph over ``dyn.graph``'s inputs, at its sizes) as a model with
    the input's symbolic dims, checked against the input in onnxruntime at both sizes.
    ``candidate`` is ``dyn.graph`` itself (the re-export) or an extracted graph with the
    e-class of each of its tensors (``candidate_classes``) and of each tensor of
    ``dyn.graph`` (``input_classes``)."""
    if candidate is dyn.graph:
        try:
            # exported as FedModels: both sizes share the input's weight arrays (the
            # second import reads the same ones), so neither copies them into protobuf
            folds: dict = {}
            first, second, shapes = _exports_at_both(dyn.graph, dyn.second_graph(), folds)
            model = symbolize(first, second, dyn.reference, dyn.first, dyn.second, shapes, dyn.may_be_empty)
            del first, second, folds  # in memory: what the model holds is in a file now (fed.file_backed)
            return SymbolicWrite(model, check_at_sizes(dyn, model, seed))
        except (NotSymbolic, VerificationError) as e:
            return SymbolicWrite(None, {}, str(e))
    if candidate_classes is None or input_classes is None:
        return SymbolicWrite(None, {}, "the extracted graph's tensors carry no e-classes to size them by")
    wrong: list = []   # (candidate tensor, why) where the second sizes' type is not the input's
    made: dict = {}    # candidate tensor -> its tensor at the second sizes
    guessed: set = set()  # nodes sized by a guess there
    anchored = set(input_classes.values())
    folds: dict = {}  # the weights both sizes fold alike, folded once
    try:
        at_first = retyped(candidate, candidate_classes, input_classes, dyn.graph, dyn.graph)
        at_second = retyped(candidate, candidate_classes, input_classes, dyn.graph, dyn.second_graph(),
                            wrong, made, guessed)
        if wrong:
            raise NotSymbolic(wrong[0][1])
        first, second, shapes = _exports_at_both(at_first, at_second, folds)
        model = symbolize(first, second, dyn.reference, dyn.first, dyn.second, shapes, dyn.may_be_empty)
        del first, second, folds  # in memory: what the model holds is in a file now (fed.file_backed)
    except NotSymbolic as e:
        return SymbolicWrite(None, {}, str(e), _regions(candidate, candidate_classes, anchored, guessed,
                                                        [key for key, _ in wrong]))
    try:
        return SymbolicWrite(model, check_at_sizes(dyn, model, seed))
    except (NotSymbolic, VerificationError) as e:
        bad = [] if isinstance(e, NotSymbolic) else \
            wrong_values(dyn, candidate, at_second, made, candidate_classes, input_classes, seed)
        return SymbolicWrite(None, {}, str(e), _regions(candidate, candidate_classes, anchored, guessed, bad))


def _exports_at_both(at_first: Graph, at_second: Graph, folds: dict):
    """The two exports ``symbolize`` makes one model of, and each one's tensor shapes
    by ONNX name (what a Reshape target may copy from its input)."""
    from ..onnx_io.exporter import export_fed

    exports, shapes = [], []
    for g in (at_first, at_second):
        names: dict = {}
        exports.append(export_fed(g, shapes_fixed=False, folds=folds, tensor_names=names))
        shapes.append({name: tuple(g.nodes[node].outputs[index].shape) for name, (node, index) in names.items()})
    return exports[0], exports[1], tuple(shapes)


def check_at_sizes(dyn: DynamicModel, model, seed: int = 0) -> dict[str, float]:
    """``model`` against the input in onnxruntime at the first and the second sizes: the
    worst relative error at each; VerificationError where they differ, NotSymbolic
    where the comparison would prove nothing."""
    from ..check.runtime import check_onnx_model
    from ..executor import random_feeds

    errors = {}
    for sizes, graph in ((dyn.first, dyn.graph), (dyn.second, dyn.second_graph())):
        where = describe_sizes(sizes)
        check = check_onnx_model(dyn.reference, model, graph, seed=seed,
                                 what=f"the model with symbolic dims, at {where},",
                                 reference_outputs=dyn._reference_outputs.setdefault((where, seed), {}))
        if check.error is None:
            raise NotSymbolic(f"at {where} onnxruntime's comparison proves nothing ({check.skipped})")
        errors[where] = check.error
    if dyn.empty is not None:
        # where a comparison proves nothing here (the input does not run empty, its
        # outputs are empty), the two sizes above stand; a difference refuses the model
        where = describe_sizes(dyn.empty)
        check = check_onnx_model(dyn.reference, model, None, seed=seed, what=f"the model at {where},",
                                 feeds=random_feeds(input_types(dyn.iface, dyn.empty), seed),
                                 reference_outputs=dyn._reference_outputs.setdefault((where, seed), {}))
        if check.error is not None:
            errors[where] = check.error
    return errors


def retyped(candidate: Graph, candidate_classes: Mapping, input_classes: Mapping, inputs: Graph,
            sized: Graph, wrong: list | None = None, made: dict | None = None, guessed: set | None = None) -> Graph:
    """``candidate`` rebuilt over ``sized`` (the input graph ``inputs`` imported at other
    sizes, node for node): its inputs and weights as ``sized`` has them, and each
    tensor that is in the e-class of an input tensor typed as that tensor is in
    ``sized`` (a reshape's target, a split's sizes, an opaque node's output types
    follow). NotSymbolic where a tensor cannot be so typed; with ``wrong`` (a list),
    each such tensor is appended there as ``(candidate tensor, why)`` and stands in as
    the input's tensor's type, so that every one is found (the graph is then not one
    to run). ``made``, when given, is filled with candidate tensor -> rebuilt tensor,
    ``guessed`` with the nodes whose sizes were guessed (no input tensor equals their
    outputs: ``_sized_params``)."""
    if [(n.op, n.params.get("name")) for n in inputs.nodes.values()] != \
            [(n.op, n.params.get("name")) for n in sized.nodes.values()]:
        raise NotSymbolic("the input imports to different graphs at the two sizes")
    of_class: dict = {}
    for key, cls in input_classes.items():
        of_class.setdefault(cls, key)
    leaves = {n.params["name"]: n for n in sized.nodes.values() if n.op in (INPUT.name, WEIGHT.name)}
    # the input's splits (a select's: a Gather or Slice of one position) by axis length and
    # sizes, with their sizes at the second sizes: a select the rules moved up keeps them
    known = {(n.inputs[0].shape[n.params["axis"]], n.params["sizes"]): s.params["sizes"]
             for n, s in zip(inputs.nodes.values(), sized.nodes.values()) if n.op == SPLIT.name}
    # and its reshapes by input shape and target: a rewrite that moved one (a Gemm's
    # rows, batch and positions merged, reshaped back after its bias) keeps its target
    known.update({(tuple(n.inputs[0].shape), n.params["shape"]): s.params["shape"]
                  for n, s in zip(inputs.nodes.values(), sized.nodes.values()) if n.op == RESHAPE.name})
    # and, for one that keeps its last axis, by the axes before it: the same reshape of
    # a tensor of another last axis (the first half of rotary angles) keeps their target
    known.update({_KEEPS_LAST + (tuple(n.inputs[0].shape[:-1]), n.params["shape"][:-1]): s.params["shape"][:-1]
                  for n, s in zip(inputs.nodes.values(), sized.nodes.values())
                  if n.op == RESHAPE.name and n.inputs[0].shape[-1:] == n.params["shape"][-1:]})

    def wanted(key):
        source = of_class.get(candidate_classes.get(key))
        return None if source is None else sized.nodes[source[0]].outputs[source[1]]

    g = Graph(opset=candidate.opset)
    g.ir_version = candidate.ir_version
    made = {} if made is None else made
    for n in candidate.topo_order():
        wants = [wanted((n.id, i)) for i in range(len(n.outputs))]
        leaf = leaves.get(n.params.get("name")) if n.op in (INPUT.name, WEIGHT.name) else None
        try:
            if n.op == INPUT.name:
                outs = [g.new_input(leaf.params["shape"], name=leaf.params["name"], dtype=leaf.params["dtype"])]
            elif n.op == WEIGHT.name:
                data = sized.weight_array(leaf) if leaf is not None else candidate.weight_array(n)
                outs = [g.new_weight(data.shape, data=data, name=n.params["name"])]
            else:
                ins = [made[(t.node, t.index)] for t in n.inputs]
                params, guess = _sized_params(n, wants, [t.shape for t in ins], known)
                if guess and guessed is not None:
                    guessed.add(n.id)
                outs = g.add_node(n.op, ins, n.name, **params)
        except ShapeError as e:
            why = f"{n.label()} has no form at the second sizes ({e})"
            if wrong is not None:
                wrong.append(((n.id, 0), why))
            if wrong is None or any(w is None for w in wants):  # no type to stand in with
                raise NotSymbolic(why) from None
            outs = [_stand_in(g, w) for w in wants]
        for i, (t, want) in enumerate(zip(outs, wants)):
            if want is not None and t.type != want:
                why = (f"{n.label()} computes {t.type} at the second sizes, where the input's equal "
                       f"tensor is {want}")
                if wrong is None:
                    raise NotSymbolic(why)
                wrong.append(((n.id, i), why))
                t = _stand_in(g, want)
            made[(n.id, i)] = t
    for name, t in candidate.outputs:
        g.mark_output(made[(t.node, t.index)], name)
    return g


def _stand_in(g: Graph, want) -> object:
    """A tensor of type ``want`` in ``g`` where a node cannot compute it (only to go on
    looking for others: such a graph is not run)."""
    return g.new_input(want.shape, name=f"_stand_in_{len(g.nodes)}", dtype=want.dtype)


def _regions(candidate: Graph, classes: Mapping, anchored: set, guessed: set, wrong: Sequence) -> tuple:
    """The tensors of ``candidate`` responsible for its ``wrong`` ones, as sets to
    forbid, the narrowest first (see ``SymbolicWrite.culprits``). Upstream of each
    wrong tensor, back to tensors an input tensor equals (their classes ``anchored``),
    lie the tensors whose sizes were guessed; the nodes sized by a guess there
    (``guessed``, each reshape or split whose rewrite may hold at the priced sizes
    alone), else the wrong node itself; then the whole region. A tensor computed from
    weights alone is the same at every size: never one."""
    if not wrong:
        return ()
    constant: set = set()
    for n in candidate.topo_order():
        if n.op == WEIGHT.name or (n.op != INPUT.name and n.inputs and all(t.node in constant for t in n.inputs)):
            constant.add(n.id)
    narrow: set = set()
    region: set = set()
    for key in wrong:
        mine: set = set()
        stack = [candidate.nodes[key[0]]]
        while stack:
            n = stack.pop()
            if n.op == INPUT.name or n.id in constant or n.id in mine:
                continue
            mine.add(n.id)
            stack += [candidate.nodes[t.node] for t in n.inputs if classes.get((t.node, t.index)) not in anchored]
        narrow |= (mine & guessed) or {key[0]}
        region |= mine

    def tensors(nodes):
        return tuple(sorted((nid, i) for nid in nodes for i in range(len(candidate.nodes[nid].outputs))))

    return tensors(narrow), tensors(region)


# a tensor whose relative error at the second sizes passes this is wrong there, not
# rounded: a rewrite that holds only at the priced sizes is off by the order of the
# values (round-off through a deep model stays far below it)
WRONG_VALUES = 1e-2


def wrong_values(dyn: DynamicModel, candidate: Graph, at_second: Graph, made: Mapping, candidate_classes: Mapping,
                 input_classes: Mapping, seed: int = 0) -> list:
    """The tensors of ``candidate`` whose values at the second sizes first differ from
    the input's equal tensors (run in onnxruntime, ``at_second`` against the input
    imported there, on the same random inputs): each one differs while no tensor
    it is computed from does. Empty where onnxruntime cannot run them."""
    from onnx import ValueInfoProto

    from ..check.runtime import onnx_outputs
    from ..check.tolerance import relative_error
    from ..executor import random_inputs
    from ..onnx_io.exporter import export_fed_named
    from ..onnx_io.fed import FedModel

    sized = dyn.second_graph()
    same = {s.id: n.id for n, s in zip(dyn.graph.nodes.values(), sized.nodes.values())}
    theirs_model, theirs = export_fed_named(sized)
    of_class: dict = {}
    for name, (nid, i) in theirs.items():
        cls = input_classes.get((same[nid], i))
        if cls is not None:
            of_class.setdefault(cls, name)
    mine_model, mine = export_fed_named(at_second)
    name_of = {key: name for name, key in mine.items()}
    pairs = {}  # candidate tensor -> (its ONNX name, the input's equal tensor's)
    for key, cls in candidate_classes.items():
        t = made.get(key)
        if t is not None and cls in of_class and (t.node, t.index) in name_of:
            pairs[key] = (name_of[(t.node, t.index)], of_class[cls])

    def run(fed, names):
        m = type(fed.model)()
        m.CopyFrom(fed.model)
        have = {o.name for o in m.graph.output}
        m.graph.output.extend(ValueInfoProto(name=x) for x in sorted(set(names) - have))
        return onnx_outputs(FedModel(m, fed.arrays), feeds)

    feeds = random_inputs(sized, seed)
    try:
        got = run(mine_model, [a for a, _ in pairs.values()])
        expected = run(theirs_model, [b for _, b in pairs.values()])
    except Exception:  # onnxruntime's own error types: no place to compare from
        return []
    bad, tainted = [], set()
    for n in candidate.topo_order():
        inherited = any((t.node, t.index) in tainted for t in n.inputs)
        for i in range(len(n.outputs)):
            key = (n.id, i)
            pair = pairs.get(key)
            if pair is None:
                if inherited:
                    tainted.add(key)
                continue
            a, b = got[pair[0]], expected[pair[1]]
            if a.shape != b.shape or relative_error(b.astype(np.float64), a.astype(np.float64)) > WRONG_VALUES:
                tainted.add(key)
                if not inherited:
                    bad.append(key)
    return bad


# The key ``known`` files a reshape that keeps its last axis under, beside the axes before it.
_KEEPS_LAST = ("keeps the last axis",)


def _sized_params(node, wants, in_shapes, known: Mapping | None = None) -> tuple[dict, bool]:
    """``node``'s parameters with those that are sizes (a target shape, a split's
    sizes, an opaque node's output types) taken from its outputs' wanted types; a
    reshape or split of a tensor no input tensor equals, as the input's reshape of the
    same shape to the same target, or split of the same sizes along an axis as long,
    has them (``known``), else by a guess (``_reshaped``); and whether it was one."""
    params = dict(node.params)
    if "sizes" in params and [w is None for w in wants].count(True) == 1:
        # a split with one part no input tensor equals: that part takes what is left
        axis = params["axis"]
        have = sum(w.shape[axis] for w in wants if w is not None)
        params["sizes"] = tuple(in_shapes[0][axis] - have if w is None else w.shape[axis] for w in wants)
        return params, False
    if "sizes" in params and all(w is None for w in wants):
        axis = params["axis"]
        same = (known or {}).get((node.inputs[0].shape[axis], params["sizes"]))
        if same is not None and sum(same) == in_shapes[0][axis]:
            params["sizes"] = tuple(same)  # a select moved up (the last position's: (S-1, 1))
            return params, False
        # else the last part takes what the axis gained (a token selected from the
        # front); a guess, tested by the check at both sizes
        sizes = list(params["sizes"])
        sizes[-1] += in_shapes[0][axis] - node.inputs[0].shape[axis]
        params["sizes"] = tuple(sizes)
        return params, True
    if node.op == OPAQUE.name and all(w is None for w in wants):
        # a node no input tensor equals (written after extraction: 4-bit products
        # packed into one): its types where onnxruntime runs it at these shapes
        probed = _probed_types(node, in_shapes)
        if probed is not None:
            params["out_types"] = probed
        return params, False
    if any(w is None for w in wants):
        if "shape" in params and len(node.inputs) == 1 and \
                math.prod(params["shape"]) == node.inputs[0].type.size:
            same = (known or {}).get((tuple(node.inputs[0].shape), params["shape"]))
            if same is None and in_shapes[0][-1:] == params["shape"][-1:] == node.inputs[0].shape[-1:]:
                lead = (known or {}).get(_KEEPS_LAST + (tuple(node.inputs[0].shape[:-1]), params["shape"][:-1]))
                same = None if lead is None else tuple(lead) + tuple(in_shapes[0][-1:])
            if same is not None and math.prod(same) == math.prod(in_shapes[0]):
                params["shape"] = tuple(same)
                return params, False
            params["shape"] = _reshaped(params["shape"], node.inputs[0].shape, in_shapes[0])
            return params, tuple(node.inputs[0].shape) != tuple(in_shapes[0])
        return params, False
    if "shape" in params:
        params["shape"] = tuple(wants[0].shape)
    if "sizes" in params:
        params["sizes"] = tuple(w.shape[params["axis"]] for w in wants)
    if "out_types" in params:
        params["out_types"] = tuple((tuple(w.shape), w.dtype) for w in wants)
    return params, False


def _probed_types(node, in_shapes) -> tuple | None:
    """An opaque node's output types, run once on zeros of ``in_shapes``; None where
    onnxruntime cannot run it so."""
    from ..ops.opaque import run_node

    p = node.params
    arrays = [np.zeros(shape, dtype=t.dtype) for shape, t in zip(in_shapes, node.inputs)]
    try:
        outs = run_node(p["op_type"], p["domain"], p["opset"], p["attrs"],
                        tuple((a.shape, str(a.dtype)) for a in arrays), len(node.outputs), arrays,
                        p["empty_inputs"], p["captured"])
    except (ExecutionError, ShapeError):
        return None
    return tuple((tuple(o.shape), str(o.dtype)) for o in outs)


def _reshaped(target, before, after) -> tuple[int, ...]:
    """A reshape's ``target`` (of a tensor of shape ``before``) for the same tensor at
    other sizes (``after``): the leading and trailing dims it keeps from ``before``
    follow ``after`` (the dims heads are split off or merged between), and the last
    other dim takes what the element count leaves (heads grouped by key head: their
    rows, G S, where a decode step's S of 1 hid the S). A guess where the input holds
    no equal tensor; the check at both sizes tests it."""
    out, kept = list(target), [False] * len(target)
    for i in range(min(len(target), len(before))):
        if target[i] != before[i]:
            break
        out[i], kept[i] = after[i], True
    for j in range(1, min(len(target), len(before)) + 1):
        if kept[-j] or target[-j] != before[-j]:
            break
        out[-j], kept[-j] = after[-j], True
    free = [i for i, k in enumerate(kept) if not k]
    rest = math.prod(out[i] for i in range(len(out)) if i not in free[-1:])
    if math.prod(out) != math.prod(after) and free and rest and math.prod(after) % rest == 0:
        out[free[-1]] = math.prod(after) // rest
    return tuple(out)
