"""Peers side by side (python -m taso_egg.research.benchmarks --onnx DIR --peers): other tools'
models timed in taso-egg's interleaved sessions and checked against the original.
A peer that is missing, does not apply, fails or computes something else is a cell
saying so; the figures are this run's, so only their form is checked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from taso_egg.research import benchmarks as bench
from taso_egg.product import decide, peers, timing
from taso_egg.check.tolerance import RTOL
from taso_egg.product.peers import PeerOutput

from conftest import cluttered_conv_model, init, make_model, vi


def _encoder_layer(causal: str = ""):
    """softmax(x Wq (x Wk)^T + mask) x after a LayerNorm: enough of a transformer to
    be told apart, with a causal mask when ``causal`` is "constant" (a lower-triangular
    boolean initializer) or "range" (key positions <= query positions, from a Range)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1),
             helper.make_node("MatMul", ["h", "wq"], ["q"]),
             helper.make_node("MatMul", ["h", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"])]
    inits = [init("g", np.ones(8, np.float32)), init("b", np.zeros(8, np.float32)),
             init("wq", rng.standard_normal((8, 8)).astype(np.float32)),
             init("wk", rng.standard_normal((8, 8)).astype(np.float32))]
    if causal == "constant":
        inits += [init("mask", np.tril(np.ones((1, 4, 4), bool)))]
    elif causal == "range":
        nodes += [helper.make_node("Range", ["zero", "four", "one"], ["pos"]),
                  helper.make_node("Unsqueeze", ["pos", "axis0"], ["key"]),
                  helper.make_node("Unsqueeze", ["pos", "axis1"], ["query"]),
                  helper.make_node("LessOrEqual", ["key", "query"], ["mask"])]
        inits += [init(name, np.int64(v)) for name, v in (("zero", 0), ("four", 4), ("one", 1))]
        inits += [init("axis0", np.array([0], np.int64)), init("axis1", np.array([1], np.int64))]
    if causal:
        nodes += [helper.make_node("Where", ["mask", "s", "neg"], ["sm"])]
        inits += [init("neg", np.float32(-1e4))]
    nodes += [helper.make_node("Softmax", ["sm" if causal else "s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "x"], ["y"])]
    return make_model(nodes, [vi("x", [1, 4, 8])], [vi("y", [1, 4, 8])], inits)


def test_transformer_kind():
    assert peers.transformer_kind(cluttered_conv_model()) is None
    assert peers.transformer_kind(_encoder_layer()) == "bert"
    assert peers.transformer_kind(_encoder_layer(causal="constant")) == "gpt2"
    assert peers.transformer_kind(_encoder_layer(causal="range")) == "gpt2"  # as GPT-2's export builds it


def test_ort_transformers_leaves_other_models_alone():
    out = peers.ort_transformers(cluttered_conv_model())
    assert out.model is None and out.why == "not a transformer"


def test_ort_transformers_runs_on_a_transformer():
    """onnxruntime's transformers optimizer ships inside onnxruntime: no skip. Its model
    computes what the input does (it finds no BERT attention to fuse in this one)."""
    from taso_egg.check.runtime import onnx_outputs
    from taso_egg.check.tolerance import compare_outputs

    model = _encoder_layer()
    out = peers.ort_transformers(model)
    assert out.why == "" and out.how == f"bert, opt_level {peers.ORT_OPT_LEVEL}"
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 4, 8)).astype(np.float32)}
    compare_outputs(onnx_outputs(model, feeds), onnx_outputs(out.model, feeds))


def test_a_failing_peer_is_a_reason_not_a_crash():
    def broken(model):
        raise RuntimeError("cannot fold\nsecond line")

    model = cluttered_conv_model()
    out = peers.run_peers(model, {"broken": broken, "same": PeerOutput})
    assert out["broken"] == PeerOutput(None, "failed: RuntimeError: cannot fold")
    assert out["same"].model == model and out["same"].model is not model  # each peer gets a copy


def _wrong(model):
    """A peer whose model computes something else: the Conv's weights negated."""
    w = next(t for t in model.graph.initializer if t.name == "w")
    w.CopyFrom(onnx.numpy_helper.from_array(-onnx.numpy_helper.to_array(w), "w"))
    return PeerOutput(model)


def test_peers_cells_faked_and_missing(tmp_path, monkeypatch, capsys):
    """The row's peers in one session: a missing peer, a failing one, one that computes
    something else (timed, its error shown) and one that returns the model unchanged
    (timed, no error, and taso-egg applied after it). Timing is faked so that optimize
    writes its result and every figure is known."""
    def missing(model):
        return PeerOutput(None, f"not installed ({peers.INSTALL_HINT})")

    def failing(model):
        raise ValueError("unsupported opset")

    def every_candidate_twice_as_fast(models, feeds, threads=1):
        return lambda names=None: {name: 2.0 if name == "original" else 1.0 for name in models}

    monkeypatch.setattr(peers, "PEERS", {"onnxsim": missing, "onnxslim": PeerOutput,
                                         "ort-transformers": failing, "wrong": _wrong})
    monkeypatch.setattr(timing, "ort_rounds", every_candidate_twice_as_fast)  # optimize writes its result
    monkeypatch.setattr(decide, "predicted_speedups",  # and times every candidate, whatever a profile says
                        lambda models, *args, **kw: {name: decide.Prediction(2.0, 2.0) for name in models if name != "original"})
    path = tmp_path / "conv.onnx"
    onnx.save(cluttered_conv_model(), path)
    args = bench.build_parser().parse_args(["--onnx", str(tmp_path), "--measure", "10", "--extractors",
                                            "greedy-dag", "--peers"])
    row = bench._onnx_row(str(path), "default", vars(args))  # in this process: the fakes hold
    cells = row["peers"]
    assert cells["onnxsim"]["why"] == "not installed (pip install 'taso-egg[peers]')"
    assert cells["onnxsim"]["speedup1"] is None
    assert cells["ort-transformers"]["why"] == "failed: ValueError: unsupported opset"
    assert cells["wrong"]["error"] > RTOL and cells["wrong"]["speedup1"].ratio == 2.0  # timed, its error shown
    slim = cells["onnxslim"]
    assert slim["why"] == "" and slim["error"] == 0.0 and slim["speedup1"].ratio == slim["speedup2"].ratio == 2.0
    assert row["chosen"] != "original"
    taso = cells[bench.TASO_EGG]
    assert taso["error"] <= RTOL and taso["speedup1"] == row["speedup1"] and row["speedup1"].ratio == 2.0  # the same session's figure
    after = cells[bench.AFTER_SLIM]  # taso-egg on onnxslim's (unchanged) model
    assert after["why"] == "" and after["error"] <= RTOL and after["speedup2"].ratio == 2.0

    bench._peers_table([("conv.onnx", "default", cells)], 5)
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("model"))
    assert header.split()[2:] == [bench.TASO_EGG, "onnxsim", "onnxslim", "ort-transformers", bench.AFTER_SLIM]
    (line,) = [line for line in out if line.startswith("conv.onnx")]
    at = {name: header.index(name) for name in header.split()[2:]}
    assert line[at["onnxsim"]:at["onnxslim"]].startswith("not installed (below)")
    s1, s2, err = line[at["onnxslim"]:at["ort-transformers"]].split()
    assert s1.startswith("2.000x(") and s2.startswith("2.000x(") and float(err) == 0.0
    assert line[at["ort-transformers"]:at[bench.AFTER_SLIM]].startswith("failed (below)")
    assert "    onnxsim: not installed (pip install 'taso-egg[peers]')" in out  # the whole reason
    assert "    ort-transformers: failed: ValueError: unsupported opset" in out


def test_real_onnxslim_in_the_table(tmp_path, capsys):
    pytest.importorskip("onnxslim", reason="onnxslim not installed (pip install 'taso-egg[peers]')")
    onnx.save(cluttered_conv_model(), tmp_path / "conv.onnx")
    assert bench.main(["--onnx", str(tmp_path), "--measure", "10", "--extractors", "greedy-dag", "--peers"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("model") and "onnxslim" in line)
    at = header.index("onnxslim"), header.index("ort-transformers")
    (row,) = [line for line in out[out.index(header):] if line.startswith("conv.onnx")]
    s1, s2, err = row[at[0]:at[1]].split()
    assert float(s1.split("x(")[0]) > 0 and float(s2.split("x(")[0]) > 0 and float(err) <= RTOL
    assert row[at[1]:].startswith("not a transformer")
