"""The operator table is the single source: each operator's declarative shape cases
(``OpSpec.shape``) agree with its Python shape rule (``infer``) in every back end that
reads them: the Python evaluator, the Z3 verifier's typing facts, and the e-graph's
egglog analysis. One table-driven pass over every operator, on every operator
configuration of the zoo models, of every corpus rule's example (the study file's
included) and of every operator's contract example (tests/test_operator_contract.py),
plus hand-made ones for operators those never hold."""

from __future__ import annotations

import functools

import pytest
import z3

from taso_egg.research import zoo
from taso_egg.egraph.convert import egraph_form
from taso_egg.egraph.language import SORTS, egraph_params
from taso_egg.errors import TasoEggError
from taso_egg.graph import Graph
from taso_egg.ops import OPS
from taso_egg.ops.base import PARAM_KINDS
from taso_egg.ops.shapes import MAX_RANK, evaluate
from taso_egg.rules.prove import encode, shape_facts
from taso_egg.rules.instantiate import instantiate
from taso_egg.rules.corpus import load_corpus


def _hand_made() -> list:
    return list(_hand_graph().nodes.values())


def _hand_graph() -> Graph:
    """Configurations of operators no zoo model or rule example exercises enough."""
    g = Graph()
    x = g.new_input((2, 8, 6, 6))
    v = g.new_input((3, 5))
    g.scalar_mul(v, g.new_weight(()))
    g.split(v, 1, (2, 3))
    g.split(v, -2, (1, 2))
    g.merge_gconv(g.new_weight((8, 2, 3, 3)), groups=4, count=2)
    g.conv2d(x, g.new_weight((8, 8, 3, 3)), strides=(2, 2), padding=(1, 0, 1, 2))
    g.conv2d(x, g.new_weight((8, 4, 3, 3)), padding="VALID", bias=g.new_weight((8,)))
    g.maxpool2d(x, (3, 3), (2, 2), padding="SAME")
    g.avgpool2d(x, (2, 2), (1, 1), padding=(1, 1, 0, 0))
    g.matmul(g.new_input((2, 3, 4, 5)), g.new_weight((5, 7)))
    g.matmul(g.new_input((2, 3, 4, 5)), g.new_input((2, 3, 5, 7)))
    g.matmul(g.new_input((2, 1, 4, 5)), g.new_input((3, 5, 7)))  # broadcast batch: a barrier
    g.add(g.new_input((4, 1, 3)), g.new_input((5, 1)))  # ranks differ: reshaped first
    g.concat(-1, [v, g.new_input((3, 2))])
    g.transpose(g.new_input((1, 2, 3, 4, 5, 6)), (5, 4, 3, 2, 1, 0))
    g.add_node("softmax", [x], axis=1)
    for op in ("ewsub", "ewdiv"):
        g.add_node(op, [g.new_input((4, 1, 3)), g.new_input((5, 1))])
        g.add_node(op, [v, g.new_input((3, 5))])
    g.add_node("erf", [x])
    g.add_node("layernorm", [v, g.new_weight((5,)), g.new_weight((5,))])
    g.add_node("layernorm", [x, g.new_weight((6,)), g.new_weight((6,))])
    g.add_node("relu6", [x])
    g.add_node("gelu", [v])
    g.add_node("gelu", [x], approximate="tanh")
    g.add_node("pow", [v], exponent=3.0)
    nan = g.add_node("isnan", [x])[0]
    g.add_node("where", [nan, g.new_weight((1, 1, 1, 1)), x])
    mask = g.new_input((2, 1, 1, 6), dtype="int64")
    flag = g.add_node("cast", [mask], to="bool")[0]
    both = g.add_node("logical_and", [flag, g.add_node("equal", [mask, g.new_input((2, 1, 6, 1), dtype="int64")])[0]])[0]
    g.add_node("expand", [both], shape=(2, 3, 6, 6))
    return g


@functools.lru_cache(maxsize=1)
def examples() -> dict:
    """One node per distinct operator configuration, keyed by op."""
    from test_operator_contract import BUILT, _graph

    nodes = _hand_made()
    for op in BUILT:  # each operator's contract example row
        nodes += _graph(op)[0].nodes.values()
    for build in zoo.MODELS.values():
        nodes += build().nodes.values()
    for rule in load_corpus(study=True):  # the study file's constants too
        try:
            g, _, _ = instantiate(rule)
        except TasoEggError:
            continue
        nodes += g.nodes.values()
    seen: dict = {}
    for n in nodes:
        key = (n.op, repr(sorted(n.params.items())), tuple(t.type for t in n.inputs))
        seen.setdefault(key, n)
    by_op: dict[str, list] = {}
    for n in seen.values():
        by_op.setdefault(n.op, []).append(n)
    return by_op


SHAPED = [op for op in OPS if OPS[op].shape]


def _uncovered(node) -> bool:
    """The configurations the e-graph does not hold, by design: batched matmuls
    whose batch dims differ (broadcast), and ranks past MAX_RANK."""
    ins = [t.shape for t in node.inputs]
    if node.op == "matmul":
        a, b = ins
        return len(b) != 2 and (len(a) != len(b) or a[:-2] != b[:-2])
    return any(len(s) > MAX_RANK for s in ins + [node.outputs[0].shape])


def test_every_operator_but_opaque_states_its_shape_as_data():
    # onnxruntime's attention kernels, written after extraction (product/fuse_attention.py):
    # no rule names them, and where a graph holding them enters an e-graph they are
    # barriers, as opaque nodes are
    assert sorted(op for op in OPS if not OPS[op].shape) == ["gqa", "opaque", "rotary"]


@pytest.mark.parametrize("op", SHAPED)
def test_shape_cases_agree_with_infer(op):
    nodes = examples().get(op, [])
    assert nodes, f"no example configuration of {op}"
    checked = 0
    for n in nodes:
        form = egraph_form(n)
        if form is None:
            params = dict(n.params, axis=n.params["axis"] % len(n.outputs[0].shape))
            if OPS[op].multi_output:  # every output
                for i, out in enumerate(n.outputs):
                    assert evaluate(OPS[op].shape, params, [n.inputs[0].shape], i) == out.shape, n
            else:  # n-ary: nested binary steps, as the e-graph holds it
                shape = n.inputs[-1].shape
                for t in reversed(n.inputs[:-1]):
                    shape = evaluate(OPS[op].shape, params, [t.shape, shape])
                assert shape == n.outputs[0].shape, n
            checked += 1
            continue
        got = evaluate(OPS[op].shape, *form)
        if got is None:
            assert _uncovered(n), f"{op}: no shape case holds for a valid {n} (inputs {form[1]})"
        else:
            assert got == n.outputs[0].shape, f"{op}: cases give {got}, infer {n.outputs[0].shape} for {n}"
            checked += 1
    assert checked


@pytest.mark.parametrize("op", SHAPED)
def test_shape_cases_reject_what_infer_rejects(op):
    """Perturb each input dim of each example by +1: where infer then refuses the
    configuration, no shape case may hold, except the checks the cases leave to the
    graph (listed: the e-graph only ever holds terms built from valid graphs and rules
    whose both sides checked)."""
    lenient = {"split": "sizes must sum to the split dim", "reshape": "element count"}
    for n in examples().get(op, [])[:60]:
        form = egraph_form(n)
        if form is None or n.op in lenient:
            continue
        params, shapes = form
        spec = OPS[op]
        for i, s in enumerate(shapes):
            for d in range(len(s)):
                bent = list(shapes)
                bent[i] = s[:d] + (s[d] + 1,) + s[d + 1:]
                try:
                    spec.infer(params, [type(t.type)(sh, t.type.dtype) for t, sh in zip(n.inputs, bent)])
                    continue
                except TasoEggError:
                    pass
                assert evaluate(spec.shape, params, bent) is None, \
                    f"{op}: a shape case holds for inputs {bent} that infer refuses"


def _z3_out(n, form):
    """The Z3 facts of ``n``'s operator function applied to ``n``'s concrete
    parameters and input shapes: (solver, result _Shape), or None where a parameter
    is not modelled (explicit pads)."""
    op = n.op
    spec = OPS[op]
    params, shapes = form
    try:
        values = [encode._literal(params[p.name], encode._param_sort(op, p.name)) for p in spec.params]
    except encode._Unsupported:
        return None
    f = encode._Encoder().func(op, len(shapes))
    ins = [z3.FreshConst(encode.Tensor, "t") for _ in shapes]
    out = f(*values, *ins)
    # the shape axiom's body, instantiated on this term (the prover gets it by E-matching)
    facts = shape_facts._shape_facts(op, values, [encode._Shape(t) for t in ins], encode._Shape(out), None)
    if facts is None:
        return None
    solver = z3.Solver()
    solver.set("timeout", 5000)
    solver.add(facts)
    for t, s in zip(ins, shapes):
        solver.add(encode.rank(t) == len(s), *[encode.dim(t, i) == (s[i] if i < len(s) else 0)
                                                 for i in range(MAX_RANK)])
    return solver, out


@pytest.mark.parametrize("op", [op for op in SHAPED if not OPS[op].multi_output])
def test_z3_shape_facts_agree_with_infer(op):
    """Sound: the facts never contradict infer's output shape. And where they model a
    configuration fully (not explicit pads, not a barrier), they fix that shape."""
    fixed = 0
    for n in examples().get(op, [])[:25]:
        form = egraph_form(n)
        if form is None or _uncovered(n):
            continue
        built = _z3_out(n, form)
        if built is None:
            continue
        solver, out = built
        want = n.outputs[0].shape
        is_want = z3.And(encode.rank(out) == len(want),
                         *[encode.dim(out, i) == (want[i] if i < len(want) else 0) for i in range(MAX_RANK)])
        solver.push()
        solver.add(is_want)
        assert solver.check() == z3.sat, f"{op}: the Z3 facts contradict infer's {want} for {n}"
        solver.pop()
        solver.add(z3.Not(is_want))
        if solver.check() == z3.unsat:
            fixed += 1
        else:
            padding = n.params.get("padding")
            assert padding is not None and padding != "SAME", \
                f"{op}: the Z3 facts leave {n}'s output shape open"
    assert fixed, f"no {op} configuration is fixed by the Z3 facts"


def test_egglog_analysis_gives_infer_shapes():
    """The compiled shape rules, run on the e-graph of graphs holding every hand-made
    configuration and two zoo models: each node's e-class gets infer's shape."""
    import egglog.bindings as eb

    from taso_egg.egraph.convert import graph_to_program
    from taso_egg.egraph.language import declarations

    for g in (_hand_graph(), zoo.MODELS["squeezenet-small"](), zoo.MODELS["bert-small"]()):
        program = graph_to_program(g)
        queries = [(n, f"$n{n.id}") for n in g.nodes.values() if len(n.outputs) == 1
                   and f"(let $n{n.id} " in program.text and f"(let $n{n.id} (Opaque " not in program.text]
        assert len(queries) > len(g.nodes) // 2
        egraph = eb.EGraph(num_threads=1)
        egraph.parse_and_run_program(declarations() + program.text + "(run-schedule (saturate analysis))")
        outputs = egraph.parse_and_run_program("\n".join(f"(extract (shape {v}))" for _, v in queries))
        assert len(outputs) == len(queries)
        for (n, _), text in zip(queries, outputs):
            want = "(vec-of " + " ".join(map(str, n.outputs[0].shape)) + ")" if n.outputs[0].shape \
                else "(vec-empty)"
            assert str(text).strip() == want, f"{n}: e-graph shape {text}, infer {n.outputs[0].shape}"


def test_every_parameter_kind_has_a_sort_in_each_back_end():
    used = {p.kind for op in OPS for p in OPS[op].params} | \
        {p.kind for op in OPS for p in egraph_params(op)}
    assert used <= set(PARAM_KINDS)
    in_egraph = {p.kind for op in OPS if not (OPS[op].inputs[1] is None and OPS[op].egraph_inputs is None)
                 for p in egraph_params(op)}
    assert in_egraph <= set(SORTS)
    in_rules = {p.kind for op in OPS if OPS[op].in_rules for p in OPS[op].params}
    assert in_rules <= set(encode._SORTS)
