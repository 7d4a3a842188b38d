"""A transformer whose output is read at one position (a causal LM's logits at the last
position, a classifier's at token 0) computes its head, final LayerNorm, last layer and
that layer's attention rows for that position alone: the Gather/Slice of the position
imports as a part of a split (part 1 for the last, part 0 for the first), and the
split-* rules (stated for any part, ``(proj ?i ...)``) move it up through every
per-position operator and into attention's query side (keys and values stay whole)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import onnx
from onnx import helper

import taso_egg
from taso_egg.product.optimize_graph import extract_graph
from taso_egg.check.runtime import onnx_outputs
from taso_egg.cost import AnalyticCost
from taso_egg.egraph.saturate import saturate
from taso_egg.rules.corpus import load_corpus
from test_onnx_io import rand

from conftest import assert_close, check_against_ort, init, make_model, vi

B, S, E, H, V = 2, 20, 8, 2, 40  # batch, positions (past the all-indices split's 16), width, heads, vocabulary
D = E // H


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _linear(x, w, b, y, flat, unflat):
    """x w + b: a MatMul and an Add, or (``flat``, a batch of one) as the dynamo exporter
    writes GPT-2's: the input flattened to positions by features, a Gemm, reshaped back."""
    if not flat:
        return [_n("MatMul", [x, w], [y + "_mm"]), _n("Add", [y + "_mm", b], [y])]
    return [_n("Reshape", [x, "flat"], [y + "_2d"]), _n("Gemm", [y + "_2d", w, b], [y + "_mm"]),
            _n("Reshape", [y + "_mm", unflat], [y])]


def _block(i, x, causal, flat, nan_guard=False, own_reshape=False):
    """One pre-norm layer as torch exports GPT-2's: a packed q/k/v projection cut by a
    Split, heads split off by Reshape and Transpose, scores divided by sqrt(d), the causal
    mask added, Softmax (``nan_guard``: then SDPA's Where(IsNaN(p), 0, p), as the dynamo
    exporter writes it), the weighted sum of values (``own_reshape``: then reshaped to its
    own shape, as TorchScript writes it), heads merged back, out-projection, residual; an
    MLP with GELU's tanh formula (Pow by 3, Tanh) and a residual."""
    p = f"b{i}_"
    lin = lambda x, w, y: _linear(x, p + "w_" + w, p + "b_" + w, y, flat, "unflat_" + w)  # noqa: E731
    inits = [init(p + "ln1_s", rand(E) + 1), init(p + "ln1_b", rand(E)), init(p + "ln2_s", rand(E) + 1),
             init(p + "ln2_b", rand(E)), init(p + "w_qkv", rand(E, 3 * E)), init(p + "b_qkv", rand(3 * E)),
             init(p + "w_o", rand(E, E)), init(p + "b_o", rand(E)), init(p + "w_fc", rand(E, 4 * E)),
             init(p + "b_fc", rand(4 * E)), init(p + "w_pr", rand(4 * E, E)), init(p + "b_pr", rand(E))]
    nodes = [
        _n("LayerNormalization", [x, p + "ln1_s", p + "ln1_b"], [p + "a"], axis=-1, epsilon=1e-5),
        *lin(p + "a", "qkv", p + "qkv"),
        _n("Split", [p + "qkv", "qkv_sizes"], [p + "q0", p + "k0", p + "v0"], axis=2)]
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [_n("Reshape", [p + name + "0", "heads"], [p + name + "1"]),
                  _n("Transpose", [p + name + "1"], [p + name], perm=perm)]
    nodes += [_n("MatMul", [p + "q", p + "k"], [p + "s0"]), _n("Div", [p + "s0", "sqrt_d"], [p + "s1"])]
    scores = p + "s1"
    if causal:
        nodes += [_n("Add", [p + "s1", "mask"], [p + "s2"])]
        scores = p + "s2"
    nodes += [_n("Softmax", [scores], [p + "pr"], axis=-1)]
    probs = p + "pr"
    if nan_guard:
        nodes += [_n("IsNaN", [probs], [p + "nan"]), _n("Where", [p + "nan", "zero", probs], [p + "pr0"])]
        probs = p + "pr0"
    nodes += [_n("MatMul", [probs, p + "v"], [p + "o0"])]
    weighted = p + "o0"
    if own_reshape:
        nodes += [_n("Reshape", [weighted, "per_head"], [p + "o0r"])]
        weighted = p + "o0r"
    nodes += [
        _n("Transpose", [weighted], [p + "o1"], perm=[0, 2, 1, 3]), _n("Reshape", [p + "o1", "merged"], [p + "o2"]),
        *lin(p + "o2", "o", p + "o4"),
        _n("Add", [x, p + "o4"], [p + "r1"]),
        _n("LayerNormalization", [p + "r1", p + "ln2_s", p + "ln2_b"], [p + "m0"], axis=-1, epsilon=1e-5),
        *lin(p + "m0", "fc", p + "m2"),
        _n("Mul", [p + "m2", "half"], [p + "g0"]), _n("Pow", [p + "m2", "three"], [p + "g1"]),
        _n("Mul", [p + "g1", "cubic"], [p + "g2"]), _n("Add", [p + "m2", p + "g2"], [p + "g3"]),
        _n("Mul", [p + "g3", "sqrt_2_pi"], [p + "g4"]), _n("Tanh", [p + "g4"], [p + "g5"]),
        _n("Add", [p + "g5", "one"], [p + "g6"]), _n("Mul", [p + "g0", p + "g6"], [p + "g7"]),
        *lin(p + "g7", "pr", p + "m4"),
        _n("Add", [p + "r1", p + "m4"], [p + "r2"])]
    return nodes, inits, p + "r2"


def _model(index, select="Gather", causal=True, layers=2, batch=B, flat=False, nan_guard=False, embed=False,
           own_reshape=False):
    """Hidden states [batch, S, E] through ``layers`` layers, the final LayerNorm and a
    head [E, V], read at position ``index`` by a Gather (the axis dropped) or a Slice (kept).
    ``embed``: the input is token ids [batch, S], looked up in an embedding table."""
    i64 = lambda name, v: init(name, np.asarray(v, np.int64))  # noqa: E731
    f32 = lambda name, v: init(name, np.asarray(v, np.float32))  # noqa: E731
    inits = [i64("qkv_sizes", [E, E, E]), i64("heads", [batch, S, H, D]), i64("merged", [batch, S, E]),
             i64("per_head", [batch, H, S, D]),
             i64("flat", [S, -1]), *(i64("unflat_" + w, [1, S, n]) for w, n in
                                    (("qkv", 3 * E), ("o", E), ("fc", 4 * E), ("pr", E))),
             f32("sqrt_d", math.sqrt(D)), f32("half", 0.5), f32("three", 3.0), f32("cubic", 0.044715),
             f32("sqrt_2_pi", math.sqrt(2 / math.pi)), f32("one", 1.0), f32("zero", 0.0),
             f32("mask", np.triu(np.full((S, S), -1e9, np.float32), 1).reshape(1, 1, S, S)),
             init("lnf_s", rand(E) + 1), init("lnf_b", rand(E)), init("w_head", rand(E, V))]
    nodes, x = [], "h"
    if embed:
        nodes += [_n("Gather", ["wte", "ids"], ["h"], axis=0)]
        inits += [init("wte", rand(V, E))]
    for i in range(layers):
        more, more_inits, x = _block(i, x, causal, flat, nan_guard, own_reshape)
        nodes += more
        inits += more_inits
    nodes += [_n("LayerNormalization", [x, "lnf_s", "lnf_b"], ["f"], axis=-1, epsilon=1e-5),
              _n("MatMul", ["f", "w_head"], ["logits"])]
    if select == "Gather":
        nodes += [_n("Gather", ["logits", "at"], ["y"], axis=1)]
        inits += [i64("at", index)]
    else:
        end = index + 1 if index != -1 else np.iinfo(np.int64).max
        nodes += [_n("Slice", ["logits", "starts", "ends", "axes"], ["y"])]
        inits += [i64("starts", [index]), i64("ends", [end]), i64("axes", [1])]
    inputs = [vi("ids", [batch, S], onnx.TensorProto.INT64)] if embed else [vi("h", [batch, S, E])]
    return make_model(nodes, inputs, [vi("y", None)], inits)


def _select_rules():
    return [r for r in load_corpus() if r.name.startswith(("split-", "gelu-")) or r.name in _RESHAPES_UNDONE]


# What the select needs exporters' reshapes undone for: a Gemm's flattening, a reshape to
# the shape its input has.
_RESHAPES_UNDONE = ("matmul-unflatten", "bias-unflatten", "reshape-own-shape")


def _optimized(model, rules):
    g = taso_egg.load_onnx(model)
    return g, extract_graph(saturate(g, rules=rules), cost_model=AnalyticCost()).graph


def _rows(g, op, where=lambda n: True):
    """The number of positions (the second-to-last axis) each ``op`` node computes."""
    return sorted(n.outputs[0].shape[-2] for n in g.nodes.values() if n.op == op and where(n))


def _by_weight(shape):
    return lambda n: n.inputs[1].shape == shape


def _check_numerics(model, out, batch=B):
    feeds = {"h": rand(batch, S, E)}
    ours, _ = check_against_ort(out, feeds, rtol=1e-4)
    assert_close(onnx_outputs(model, feeds), ours, rtol=1e-4)


@pytest.mark.parametrize("index, select", [(-1, "Gather"), (S - 1, "Gather"), (-1, "Slice"), (0, "Gather"),
                                           (0, "Slice")])
def test_a_position_read_alone_prunes_the_head_and_the_last_layer(index, select):
    """The head's matmul, the final LayerNorm, the last layer's MLP and out-projection and
    its attention rows run for the one position read; the first layer (whose keys and
    values the last one reads) and the last layer's q/k/v projection for all."""
    model = _model(index, select)
    g, out = _optimized(model, _select_rules())
    assert _rows(g, "matmul", _by_weight((E, V))) == [S]
    assert _rows(out, "matmul", _by_weight((E, V))) == [1]
    assert _rows(out, "layernorm") == [1, 1, S, S, S]  # final, last layer's second; the rest whole
    assert _rows(out, "matmul", _by_weight((E, 4 * E))) == [1, S]
    assert _rows(out, "matmul", _by_weight((4 * E, E))) == [1, S]
    assert _rows(out, "matmul", _by_weight((E, E))) == [1, S]  # out-projections
    assert _rows(out, "matmul", _by_weight((E, 3 * E))) == [S, S]  # q/k/v: keys and values need all
    assert _rows(out, "softmax") == [1, S]  # the last layer's query rows alone
    _check_numerics(model, out)


def test_a_middle_position_read_alone_is_part_1_of_three():
    model = _model(7)
    _, out = _optimized(model, _select_rules())
    assert _rows(out, "matmul", _by_weight((E, V))) == [1]
    assert _rows(out, "softmax") == [1, S]
    _check_numerics(model, out)


def _assert_last_layer_pruned(out, layers=2):
    """The head, final LayerNorm and the last layer's MLP, out-projection and attention
    rows on one position; the rest (and the q/k/v projections, keys and values) on all."""
    whole = [S] * (layers - 1)
    assert _rows(out, "matmul", _by_weight((E, V))) == [1]
    assert _rows(out, "layernorm") == [1, 1] + [S] * (2 * layers - 1)
    for w in ((E, 4 * E), (4 * E, E), (E, E)):
        assert _rows(out, "matmul", _by_weight(w)) == [1] + whole
    assert _rows(out, "matmul", _by_weight((E, 3 * E))) == [S] * layers
    assert _rows(out, "softmax") == [1] + whole


def test_a_batch_flattened_for_gemms_prunes_its_linear_layers():
    """GPT-2 as the exporters write it: each linear layer flattens batch and positions
    into rows for a Gemm and reshapes back. One position of every batch row is no part of
    that axis, but the flattening undone (matmul-unflatten, bias-unflatten) leaves a
    matmul over [batch, positions, features], whose rows the select takes."""
    model = _model(-1, batch=1, flat=True)
    _, out = _optimized(model, _select_rules())
    _assert_last_layer_pruned(out)
    _check_numerics(model, out, batch=1)


@pytest.mark.parametrize("flat, own_reshape", [(False, False), (True, False), (True, True)],
                         ids=["matmul", "gemm", "gemm-own-reshape"])
def test_a_causal_lm_with_the_sdpa_nan_guard_computes_its_head_for_the_last_position(flat, own_reshape):
    """A tiny causal LM as the dynamo exporter writes GPT-2: token embedding, a block whose
    attention's softmax is guarded by Where(IsNaN(p), 0, p), the LM head, the last
    position's logits. The guard imports as nan_to_zero and the select moves through it
    into the query side; the result agrees with onnxruntime on the model."""
    model = _model(-1, batch=1, flat=flat, nan_guard=True, embed=True, layers=1, own_reshape=own_reshape)
    g, out = _optimized(model, _select_rules())
    assert g.op_counts()["nan_to_zero"] == 1 and "isnan" not in g.op_counts()
    _assert_last_layer_pruned(out, layers=1)
    assert _rows(out, "nan_to_zero") == [1]
    feeds = {"ids": np.random.default_rng(0).integers(0, V, (1, S)).astype(np.int64)}
    ours, _ = check_against_ort(out, feeds, rtol=1e-4)
    assert_close(onnx_outputs(model, feeds), ours, rtol=1e-4)


def test_symbolic_dims_are_written_with_the_head_on_the_last_position(tmp_path, capsys):
    """optimize on a model whose batch and sequence are symbolic: the result, its head on
    the last position, is written with the input's interface and agrees with it at other
    sizes (the select's splits moved up take the input's own split's sizes there: the
    first part grows with the sequence, not the last)."""
    import onnx
    import onnxruntime as ort

    from taso_egg.cli import main

    model = _model(-1, layers=1, batch=1, causal=False)
    for t in model.graph.initializer:  # heads split off and merged back whatever the sizes (0: copied)
        if t.name in ("heads", "merged"):
            t.CopyFrom(init(t.name, np.asarray([0, 0] + list(onnx.numpy_helper.to_array(t))[2:], np.int64)))
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim, ("batch", "seq")):
        dim.dim_param = name
    path, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, path)
    assert main(["optimize", str(path), "-o", str(out), "--measure", "0", "--input-shape", f"h=1,{S},{E}"]) == 0
    assert "written with the input's symbolic dims" in capsys.readouterr().out
    g = taso_egg.load_onnx(str(out), {"h": (1, S, E)})
    assert _rows(g, "matmul", _by_weight((E, V))) == [1]
    ref, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (path, out))
    for batch, seq in ((1, S), (3, 7), (2, S + 5)):
        feed = {"h": rand(batch, seq, E)}
        np.testing.assert_allclose(got.run(None, feed)[0], ref.run(None, feed)[0], rtol=1e-4, atol=1e-5)


def test_a_cls_classifier_without_a_mask_reads_token_0_alone():
    """A bidirectional encoder (no mask) read at token 0: the same steps with part 0."""
    model = _model(0, causal=False)
    _, out = _optimized(model, _select_rules())
    assert _rows(out, "matmul", _by_weight((E, V))) == [1]
    assert _rows(out, "softmax") == [1, S]
    _check_numerics(model, out)


def test_with_the_default_corpus_the_head_runs_on_the_last_position():
    """The whole default corpus (what optimize saturates with) finds the pruned head too."""
    model = _model(-1)
    g = taso_egg.load_onnx(model)
    out = extract_graph(saturate(g), cost_model=AnalyticCost()).graph
    assert _rows(out, "matmul", _by_weight((E, V))) == [1]
    _check_numerics(model, out)


def test_without_the_select_rules_every_position_is_computed():
    model = _model(-1)
    _, out = _optimized(model, [r for r in _select_rules() if not r.name.startswith("split-")])
    assert _rows(out, "matmul", _by_weight((E, V))) == [S]
    assert _rows(out, "softmax") == [S, S]


def test_the_last_position_of_a_short_sequence_is_part_1_of_two():
    """Along an axis of 16 or less a lone Gather (no sibling Gathers, unlike q, k and v
    of a packed projection) cuts around its index too, so the rules match it at a short
    sequence as well."""
    short = 8
    model = make_model([_n("LayerNormalization", ["h", "s", "b"], ["f"], axis=-1),
                        _n("MatMul", ["f", "w_head"], ["logits"]), _n("Gather", ["logits", "at"], ["y"], axis=1)],
                       [vi("h", [1, short, E])], [vi("y", None)],
                       [init("s", rand(E) + 1), init("b", rand(E)), init("w_head", rand(E, V)),
                        init("at", np.asarray(-1, np.int64))])
    g, out = _optimized(model, _select_rules())
    assert [n.params["sizes"] for n in g.nodes.values() if n.op == "split"] == [(short - 1, 1)]
    assert _rows(out, "matmul") == [1]
    feeds = {"h": rand(1, short, E)}
    ours, _ = check_against_ort(out, feeds, rtol=1e-4)
    assert_close(onnx_outputs(model, feeds), ours, rtol=1e-4)


def test_the_select_reaches_the_last_layer_of_a_deep_model_in_two_iterations():
    """The rules that move a part up one operator run to a fixpoint in every iteration
    (their own ruleset), so a select crosses a whole layer in one iteration (the second:
    GELU's formula is recognized in the first), not one operator per iteration, and reaches
    the last layer before other rules fill the e-graph to its node limit."""
    from taso_egg.options import Limits

    model = _model(-1, layers=4)
    sat = saturate(taso_egg.load_onnx(model), rules=_select_rules(), limits=Limits(iterations=2))
    out = extract_graph(sat, cost_model=AnalyticCost()).graph
    _assert_last_layer_pruned(out, layers=4)
    _check_numerics(model, out)


def test_the_rules_that_move_a_part_up_are_the_select_steps():
    """Rule.moves_a_part_up (which puts a rule in the select ruleset) holds for a rule
    whose right side reads the same part below the operator it moved past, not for one
    that reads a part back from a concat or joins parts."""
    by_name = {r.name: r for r in load_corpus()}
    assert all(by_name[n].moves_a_part_up for n in ("split-matmul", "split-ewadd", "split-nan-to-zero",
                                                    "split-transpose", "split-linear"))
    assert not any(by_name[n].moves_a_part_up for n in ("concat-of-split", "matmul-unflatten",
                                                        "gelu-tanh-from-formula"))
    assert not any(r.moves_a_part_up for r in by_name.values() if r.name.startswith("gen3-"))
