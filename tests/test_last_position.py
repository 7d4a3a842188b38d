"""``--last-position``: on the caller's word an output becomes its last position (as a
generation loop reads ``logits``), and the select then moves up through the head and
the last layer. Off by default; the change of interface is said back."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import taso_egg
from taso_egg.check.runtime import onnx_outputs
from taso_egg.cli import main
from taso_egg.errors import OnnxImportError
from test_onnx_io import rand
from test_position_select import D, E, V, _block, _by_weight, _rows

from conftest import init, make_model, vi

S = 20  # positions in the test's masks and reshapes


def _full_logits(layers=2, batch=2):
    """Hidden states [batch, S, E] through causal layers, a final LayerNorm and the head:
    logits at every position, as exports return them."""
    i64 = lambda name, v: init(name, np.asarray(v, np.int64))  # noqa: E731
    f32 = lambda name, v: init(name, np.asarray(v, np.float32))  # noqa: E731
    inits = [i64("qkv_sizes", [E, E, E]), i64("heads", [batch, S, E // D, D]), i64("merged", [batch, S, E]),
             i64("per_head", [batch, E // D, S, D]), f32("sqrt_d", math.sqrt(D)), f32("half", 0.5),
             f32("three", 3.0), f32("cubic", 0.044715), f32("sqrt_2_pi", math.sqrt(2 / math.pi)),
             f32("one", 1.0), f32("zero", 0.0),
             f32("mask", np.triu(np.full((S, S), -1e9, np.float32), 1).reshape(1, 1, S, S)),
             init("lnf_s", rand(E) + 1), init("lnf_b", rand(E)), init("w_head", rand(E, V))]
    nodes, x = [], "h"
    for i in range(layers):
        more, more_inits, x = _block(i, x, causal=True, flat=False)
        nodes += more
        inits += more_inits
    nodes += [onnx.helper.make_node("LayerNormalization", [x, "lnf_s", "lnf_b"], ["f"], axis=-1, epsilon=1e-5),
              onnx.helper.make_node("MatMul", ["f", "w_head"], ["logits"])]
    return make_model(nodes, [vi("h", [batch, S, E])], [vi("logits", [batch, S, V])], inits)


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_the_last_position_asked_for_prunes_the_head_and_is_said():
    model = _full_logits()
    before = model.SerializeToString()
    written, report = taso_egg.optimize_model(model, last_position=["logits"], measure=0)
    assert model.SerializeToString() == before  # the caller's model is not changed
    assert _dims(written.graph.output[0]) == [2, 1, V]
    assert "logits along axis 1 read at the last position only" in report.interface_change
    assert report.interface_change in report.headline() and report.interface_change in report.notes
    # the head and the final LayerNorm run on the last position alone
    assert _rows(report.details.result.graph, "matmul", _by_weight((E, V))) == [1]
    feeds = {"h": rand(2, S, E)}
    want = onnx_outputs(model, feeds)["logits"][:, -1:]
    assert np.allclose(onnx_outputs(written, feeds)["logits"], want, rtol=1e-4, atol=1e-5)


def test_without_the_flag_every_position_is_kept():
    written, report = taso_egg.optimize_model(_full_logits(), measure=0)
    assert _dims(written.graph.output[0]) == [2, S, V] and report.interface_change == ""
    assert "last position" not in report.headline()


def test_the_command_writes_the_last_position_and_says_so(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_full_logits(), src)
    assert main(["optimize", str(src), "-o", str(out), "--last-position", "logits:1", "--measure", "0"]) == 0
    text = capsys.readouterr().out
    assert "read at the last position only" in text
    assert _dims(onnx.load(out).graph.output[0]) == [2, 1, V]


@pytest.mark.parametrize("flag, complaint", [
    ("nothing", "has no output 'nothing' (its outputs: logits)"),
    ("logits:3", "rank 3, so it has no such axis"),
    ("logits:x", "expected OUTPUT or OUTPUT:AXIS"),
])
def test_a_wrong_last_position_is_one_line_and_writes_nothing(tmp_path, capsys, flag, complaint):
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_full_logits(layers=1), src)
    assert main(["optimize", str(src), "-o", str(out), "--last-position", flag]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and complaint in err[0]
    assert not out.exists()
    with pytest.raises(OnnxImportError, match="has no such axis"):
        taso_egg.optimize_model(_full_logits(layers=1), last_position={"logits": -4})
