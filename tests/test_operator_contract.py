"""The operator contract: every operator of the table, on its one example row
(EXAMPLES, the single place a new operator adds one), keeps each promise the
table makes for it: its shape rule (``infer``) and its kernel agree, its shape cases
(``OpSpec.shape``) give infer's shape, it exports to ONNX and onnxruntime computes
what its kernel does, the export imports back as the operator, it survives the
egglog round trip (graph -> e-graph -> extracted graph, same values), and where rules
may name it the Z3 encoding has its function and a sort for each parameter.

tests/test_op_table.py checks the shape cases on many more configurations (the zoo's,
every rule example's); this file is the one row per operator a new one must pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from taso_egg import executor
from taso_egg.graph import Graph
from taso_egg.ops import OPS, TensorType
from taso_egg.ops.shapes import evaluate


@dataclass(frozen=True)
class Example:
    """``inputs``: (shape, dtype) per tensor input; those at ``weights`` are
    initializers (a kernel, a normalization's vectors: as models hold them; drawn
    positive where the operator needs it). ``reimports``: the exported ONNX reads back
    as this operator (False where the export is a composition of standard operators
    or a folded constant, as the reason says)."""

    inputs: tuple = ()
    params: dict = field(default_factory=dict)
    weights: tuple = ()
    reimports: bool | str = True
    opset: int | None = None  # the graph's (None: the default)


F = "float32"
# onnxruntime's contrib kernels (behind an If where the kernel refuses some input)
# import as opaque nodes: carried unchanged, as any operator the table lacks
OPAQUE_CONTRIB = "opaque: an onnxruntime contrib kernel, carried unchanged when read back"
X4 = ((2, 4, 5, 5), F)
M = ((3, 4), F)

EXAMPLES: dict[str, Example] = {
    "ewadd": Example((M, ((1, 4), F))),
    "ewmul": Example((M, M)),
    "ewsub": Example((M, ((3, 1), F))),
    "ewdiv": Example((M, M), weights=(1,)),
    "smul": Example((M, ((), F)), weights=(1,)),
    "relu": Example((M,)),
    "relu6": Example((M,)),
    "sigmoid": Example((M,)),
    "tanh": Example((M,)),
    "erf": Example((M,)),
    "hardswish": Example((X4,)),
    # below opset 20 exported as onnxruntime's contrib FastGelu, which imports opaque
    "gelu": Example((M,), {"approximate": "tanh"}, opset=20),
    "pow": Example((M,), {"exponent": 3.0}),
    "concat": Example((M, ((3, 2), F)), {"axis": 1}),
    "split": Example((M,), {"axis": 1, "sizes": (1, 3)}),
    "reshape": Example((M,), {"shape": (2, 6)}),
    "transpose": Example((X4,), {"perm": (0, 2, 3, 1)}),
    "enlarge": Example((((4, 4, 1, 3), F), ((4, 4, 3, 3), F)), weights=(0, 1),
                       reimports="a weight-only operator: export folds it into an initializer"),
    "merge_gconv": Example((((8, 2, 3, 3), F),), {"groups": 4, "count": 2}, weights=(0,),
                           reimports="a weight-only operator: export folds it into an initializer"),
    "input": Example(),
    "weight": Example(),
    "const_iconv": Example((), {"shape": (4, 4, 3, 3)}),
    "const_imm": Example((), {"shape": (4, 4)}),
    "const_one": Example((), {"shape": (2, 4)}),
    "const_pool": Example((), {"shape": (4, 1, 3, 3)}),
    "scalar": Example((), {"value": 0.5}),
    "isnan": Example((M,)),
    "equal": Example((((2, 6), "int64"), ((2, 6), "int64"))),
    "logical_and": Example((((2, 6), "bool"), ((1, 6), "bool"))),
    "where": Example((((3, 4), "bool"), M, M)),
    "cast": Example((((2, 6), "int64"),), {"to": "float32"}),
    "expand": Example((((1, 4), F),), {"shape": (3, 4)}),
    "nan_to_zero": Example((M,)),
    "conv2d": Example((X4, ((4, 4, 3, 3), F)), {"padding": "SAME", "activation": "RELU"}, weights=(1,)),
    "conv2d_sum": Example((X4, ((4, 4, 3, 3), F), X4), {"padding": "SAME"}, weights=(1,),
                          reimports="exported as Conv and Add, which runtimes fuse again"),
    "matmul": Example((M, ((4, 5), F)), weights=(1,)),
    "maxpool2d": Example((X4,), {"kernel": (3, 3), "strides": (2, 2), "padding": "VALID"}),
    "avgpool2d": Example((X4,), {"kernel": (3, 3), "strides": (1, 1), "padding": "SAME",
                                 "count_include_pad": 0}),
    "global_avgpool": Example((X4,)),
    "batchnorm": Example((X4,) + (((4,), F),) * 4, weights=(1, 2, 3, 4)),
    "bn_factor": Example((((4,), F),) * 2, weights=(0, 1),
                         reimports="a weight-only operator: export folds it into an initializer"),
    "bn_shift": Example((((4,), F),) * 4, weights=(0, 1, 2, 3),
                        reimports="a weight-only operator: export folds it into an initializer"),
    "softmax": Example((M,), {"axis": 1}),
    "layernorm": Example((M, ((4,), F), ((4,), F)), weights=(1, 2)),
    "opaque": Example(),  # any ONNX node: tests/test_onnx_io.py carries them
    # batch 1, two new tokens on a cache of three: the input GroupQueryAttention takes
    "gqa": Example((((1, 2, 32), F), ((1, 2, 16), F), ((1, 2, 16), F), ((1, 2, 3, 8), F), ((1, 2, 3, 8), F),
                    ((1, 2, 32), F), ((1, 2, 3, 8), F), ((1, 1, 2, 5), F)),
                   {"num_heads": 4, "kv_num_heads": 2, "scale": 0.35, "nan_to_zero": 1},
                   reimports=OPAQUE_CONTRIB),
    "rotary": Example((((2, 3, 16), F), ((2, 1, 3, 4), F), ((2, 1, 3, 4), F), ((2, 5), F)), {"num_heads": 2},
                      reimports=OPAQUE_CONTRIB),
}

RUN = [op for op in OPS if not OPS[op].is_leaf and EXAMPLES[op].inputs]
BUILT = RUN + [op for op in OPS if OPS[op].is_leaf and EXAMPLES[op].params]  # generated constants too


def test_every_operator_has_one_example_row():
    assert set(EXAMPLES) == set(OPS), \
        f"rows missing: {sorted(set(OPS) - set(EXAMPLES))}, rows for no operator: {sorted(set(EXAMPLES) - set(OPS))}"


def _graph(op: str) -> tuple[Graph, list]:
    ex, spec = EXAMPLES[op], OPS[op]
    g = Graph(opset=ex.opset)
    ins = []
    for i, (shape, dtype) in enumerate(ex.inputs):
        if i in ex.weights:
            rng = np.random.default_rng(i)
            data = rng.standard_normal(shape).astype(dtype)
            ins.append(g.new_weight(shape, np.abs(data) + 0.5 if i in spec.positive_inputs else data))
        else:
            ins.append(g.new_input(shape, dtype=dtype))
    outs = g.add_node(op, ins, **ex.params)
    for i, t in enumerate(outs):
        g.mark_output(t, f"y{i}")
    return g, outs


@pytest.mark.parametrize("op", list(OPS))
def test_shape_rule_and_kernel_agree(op):
    ex, spec = EXAMPLES[op], OPS[op]
    if op in ("input", "weight", "opaque"):
        pytest.skip("no kernel of its own: a leaf fed from outside, or a one-node ONNX model")
    params = spec.normalize_params(ex.params)
    types = [TensorType(s, d) for s, d in ex.inputs]
    want = spec.infer(params, types)
    rng = np.random.default_rng(0)
    arrays = [rng.random(s) < 0.5 if d == "bool" else rng.standard_normal(s).astype(d) for s, d in ex.inputs]
    arrays = [np.abs(a) + 0.5 if i in spec.positive_inputs else a for i, a in enumerate(arrays)]
    got = spec.kernel(np, params, *arrays)
    assert [(tuple(a.shape), str(a.dtype)) for a in got] == [(t.shape, t.dtype) for t in want]
    if spec.shape:
        assert evaluate(spec.shape, params, [t.shape for t in types]) in (want[0].shape, tuple(t.shape for t in want))


@pytest.mark.parametrize("op", RUN)
def test_onnxruntime_computes_what_the_kernel_does(op):
    import onnxruntime as ort

    from taso_egg.onnx_io.exporter import export_onnx

    g, _ = _graph(op)
    feeds = executor.random_inputs(g)
    want = executor.run(g, feeds)
    session = ort.InferenceSession(export_onnx(g).SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=f"{op}: output {name}")


@pytest.mark.parametrize("op", RUN)
def test_the_export_imports_back_as_the_operator(op):
    from taso_egg.onnx_io.exporter import export_onnx
    from taso_egg.onnx_io.importer import load_onnx

    back = load_onnx(export_onnx(_graph(op)[0]))
    if EXAMPLES[op].reimports is True:
        assert op in {n.op for n in back.nodes.values()}, f"{op} reads back as {sorted({n.op for n in back.nodes.values()})}"
    elif EXAMPLES[op].reimports == OPAQUE_CONTRIB:
        assert "opaque" in {n.op for n in back.nodes.values()}
    else:
        assert "opaque" not in {n.op for n in back.nodes.values()}


@pytest.mark.parametrize("op", BUILT)
def test_the_egglog_round_trip_keeps_it(op):
    """No rules: extraction gives back the same operators (the bridge's rank-matching
    reshapes may stay) and the same values."""
    from collections import Counter

    from taso_egg.product.optimize_graph import extract_graph
    from taso_egg.cost import load_cost_model
    from taso_egg.egraph.saturate import saturate

    g, _ = _graph(op)
    back = extract_graph(saturate(g, rules=[]), "greedy-dag", load_cost_model("analytic")).graph
    drop = Counter({"reshape": 10**6})
    assert back.op_counts() - drop == g.op_counts() - drop
    feeds = executor.random_inputs(g)
    want, got = executor.run(g, feeds), executor.run(back, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{op}: output {name}")


@pytest.mark.parametrize("op", [op for op in OPS if OPS[op].in_rules])
def test_rules_may_name_it_in_the_prover(op):
    from taso_egg.egraph.language import tensor_arity
    from taso_egg.rules.prove import encode

    import z3

    spec = OPS[op]
    f = encode._Encoder().func(op, tensor_arity(op))
    sorts = [f.domain(i) for i in range(f.arity())]
    params = [encode._param_sort(op, p.name) for p in spec.params]
    assert sorts == params + [z3.IntSort()] * spec.multi_output + [encode.Tensor] * tensor_arity(op)
    assert f.range() == encode.Tensor
