"""The ``taso-egg`` command line, run in-process."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from taso_egg.check.runtime import onnx_outputs
from taso_egg.cli import main

from conftest import assert_close, init, make_model, vi


def _model(batch=1):
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("LogSoftmax", ["p"], ["y"], axis=1)]  # opaque here
    return make_model(nodes, [vi("x", [batch, 2, 6, 6])], [vi("y", None)],
                      [init("w", rng.standard_normal((3, 2, 3, 3)).astype(np.float32))])


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "small.onnx"
    onnx.save(_model(), path)
    return path


def _assert_one_error_line(err: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("taso-egg: error: ")
    assert "Traceback" not in err


def test_inspect(model_path, capsys):
    assert main(["inspect", str(model_path)]) == 0
    out, err = capsys.readouterr()
    assert str(model_path) in out
    assert "opset 17" in out
    assert "x float32[1, 2, 6, 6]" in out
    assert "y float32[1, 3, 3, 3]" in out
    assert "weights: 1" in out
    for op in ("conv2d", "relu", "maxpool2d", "opaque"):
        assert op in out
    assert "LogSoftmax x1" in out
    assert "Traceback" not in err


def test_convert(model_path, tmp_path, capsys):
    out_path = tmp_path / "converted.onnx"
    assert main(["convert", str(model_path), "-o", str(out_path)]) == 0
    out, err = capsys.readouterr()
    assert f"wrote {out_path}" in out and "agree" in out
    converted = onnx.load(out_path)
    onnx.checker.check_model(converted)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)}
    assert_close(onnx_outputs(_model(), feeds), onnx_outputs(converted, feeds))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted.onnx", "small.onnx"]


def test_input_shape_option(tmp_path, capsys):
    """A symbolic dim is sized by default (1 for a batch) or by --input-shape; what is
    written keeps it symbolic."""
    path = tmp_path / "dyn.onnx"
    onnx.save(_model(batch="N"), path)
    assert main(["inspect", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert "x float32[1, 2, 6, 6]" in out and "N=1" in out
    assert main(["inspect", str(path), "--input-shape", "x=2,2,6,6"]) == 0
    out, _ = capsys.readouterr()
    assert "x float32[2, 2, 6, 6]" in out
    out_path = tmp_path / "converted.onnx"
    assert main(["convert", str(path), "--input-shape", "x=3x2x6x6", "-o", str(out_path)]) == 0
    assert onnx.load(out_path).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


@pytest.mark.parametrize("bad", ["x", "x=", "=1,2", "x=1,a"])
def test_bad_input_shape_option(model_path, capsys, bad):
    assert main(["inspect", str(model_path), "--input-shape", bad]) == 1
    _, err = capsys.readouterr()
    _assert_one_error_line(err)
    assert "--input-shape" in err


def test_missing_file_error(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.onnx")]) == 1
    out, err = capsys.readouterr()
    _assert_one_error_line(err)
    assert "missing.onnx" in err
    assert out == ""


def test_convert_failing_input_leaves_no_output(tmp_path, capsys):
    data = _model().SerializeToString()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[: len(data) // 2])
    out_path = tmp_path / "out.onnx"
    assert main(["convert", str(bad), "-o", str(out_path)]) == 1
    _, err = capsys.readouterr()
    _assert_one_error_line(err)
    assert "truncated.onnx" in err
    assert not out_path.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["truncated.onnx"]


def test_convert_text_input_keeps_existing_output(tmp_path, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a model\n")
    out_path = tmp_path / "out.onnx"
    out_path.write_bytes(b"old")
    assert main(["convert", str(bad), "-o", str(out_path)]) == 1
    _assert_one_error_line(capsys.readouterr().err)
    assert out_path.read_bytes() == b"old"


def test_convert_to_missing_folder(model_path, tmp_path, capsys):
    assert main(["convert", str(model_path), "-o", str(tmp_path / "nope" / "o.onnx")]) == 1
    _, err = capsys.readouterr()
    _assert_one_error_line(err)
    assert "does not exist" in err


def test_usage_error_is_one_line_and_exit_1(capsys):
    with pytest.raises(SystemExit) as e:
        main(["convert"])
    assert e.value.code == 1
    _assert_one_error_line(capsys.readouterr().err)


# --- optimize ------------------------------------------------------------------------


@pytest.fixture
def nasrnn_path(tmp_path):
    from taso_egg.research import zoo
    from taso_egg.onnx_io.exporter import export_onnx

    path = tmp_path / "nas.onnx"
    export_onnx(zoo.nasrnn_small(steps=1), path)
    return path


def test_optimize_writes_a_checked_faster_model(nasrnn_path, tmp_path, capsys):
    out = tmp_path / "nas.opt.onnx"
    assert main(["optimize", str(nasrnn_path), "-o", str(out), "--measure", "0", "--extractor", "greedy-dag"]) == 0
    text = capsys.readouterr().out
    assert "speedup: not measured; predicted" in text and "check: the written model's outputs equal the input's" in text \
        and "result: the extracted graph replaces the input" in text
    before, after = onnx.load(nasrnn_path), onnx.load(out)
    assert len(after.graph.node) < len(before.graph.node)
    feeds = {"x0": np.ones((1, 16), np.float32), "h0": np.full((1, 16), 0.5, np.float32)}
    assert_close(onnx_outputs(before, feeds), onnx_outputs(after, feeds), rtol=1e-5)


def test_optimize_keeps_the_original_when_the_result_measures_slower(nasrnn_path, tmp_path, fake_timer,
                                                                     capsys):
    # predicted better (it replaces the input without --measure), measured slower
    fake_timer.ms = {"original": 1.0, "re-export": 1.0, "result": 2.0}
    out = tmp_path / "nas.opt.onnx"
    assert main(["optimize", str(nasrnn_path), "-o", str(out), "--extractor", "greedy-dag"]) == 0
    captured = capsys.readouterr()
    assert fake_timer.timed == [["original", "result"]]  # the re-export: the original's twin
    assert "speedup: none confirmed; the original is written (onnxruntime" in captured.out
    assert ("result: the input, unchanged is written: the result measured slower than the original: "
            "0.500x [0.500, 0.500]") in captured.out
    assert "  result          2.000       0.500x     [0.500, 0.500]  slower\n" in captured.out
    assert out.read_bytes() == nasrnn_path.read_bytes()


@pytest.fixture
def cluttered_path(tmp_path):
    from conftest import cluttered_conv_model

    path = tmp_path / "cluttered.onnx"
    onnx.save(cluttered_conv_model(), path)
    return path


def _optimize_measured(path, out, fake_timer, ms: dict, capsys) -> str:
    """``taso-egg optimize`` on ``path``, its candidates timed at the fake times ``ms``."""
    fake_timer.ms = ms
    assert main(["optimize", str(path), "-o", str(out)]) == 0
    return capsys.readouterr().out


def test_optimize_writes_the_original_bytes_when_it_measures_fastest(cluttered_path, tmp_path,
                                                                     fake_timer, capsys):
    out = tmp_path / "o.onnx"
    text = _optimize_measured(cluttered_path, out, fake_timer,
                              {"original": 1.0, "re-export": 1.1, "result": 1.2}, capsys)
    assert "  original        1.000  <- written\n" in text
    assert "(the input, unchanged)" in text
    assert out.read_bytes() == cluttered_path.read_bytes()


def test_optimize_writes_the_re_export_when_it_measures_fastest(cluttered_path, tmp_path, fake_timer,
                                                                capsys):
    out = tmp_path / "o.onnx"
    text = _optimize_measured(cluttered_path, out, fake_timer,
                              {"original": 1.5, "re-export": 1.0, "result": 1.2}, capsys)
    assert "speedup: measured 1.500x [1.500, 1.500] in onnxruntime (the written re-export" in text
    assert "  re-export       1.000       1.500x     [1.500, 1.500]  faster  <- written\n" in text
    assert "(the input, re-exported: the importer's clean-up)" in text
    assert "check: the written model's outputs equal the input's within" in text
    written = onnx.load(out)
    assert [n.op_type for n in written.graph.node] == ["Conv", "Add", "Relu"]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    assert_close(onnx_outputs(onnx.load(cluttered_path), feeds), onnx_outputs(written, feeds), rtol=1e-5)


def test_optimize_without_measurement_names_the_unmeasured_re_export(cluttered_path, tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(cluttered_path), "-o", str(out), "--measure", "0"]) == 0
    text = capsys.readouterr().out
    assert "note: not measured: re-export" in text and "speedup: not measured" in text
    assert out.read_bytes() == cluttered_path.read_bytes()


def test_the_saturation_limits_options_come_from_the_limits_fields():
    """optimize, compare and the benchmark offer one option per Limits field, with its
    default, and read them back into the same Limits."""
    import argparse
    import dataclasses

    from taso_egg.cli import build_parser
    from taso_egg.cli_args import add_limit_arguments, limits_from_args
    from taso_egg.egraph.saturate import Limits

    flags = [f.metadata["flag"] for f in dataclasses.fields(Limits)]
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in ("optimize", "compare"):
        offered = {s for a in commands[name]._actions for s in a.option_strings}
        assert set(flags) <= offered, name
    p = argparse.ArgumentParser()
    add_limit_arguments(p)
    assert limits_from_args(p.parse_args([])) == Limits()
    assert limits_from_args(p.parse_args(["--node-limit", "7", "--time-limit", "2.5"])) == \
        Limits(nodes=7, seconds=2.5)


def test_the_headline_gives_the_result_s_reach_where_it_is_why_it_was_timed(capsys):
    """A result predicted below the margin is timed for what it could reach (its own
    memory-bound kernels a quarter faster): the headline says so beside the speedup,
    and says nothing more where the two agree."""
    from taso_egg import cli
    from taso_egg.product import decide, guard

    report = guard.GuardReport({"result": guard.Comparison(1.002, 0.98, 1.02, "undecided", 10)},
                               {"original": 2.0, "result": 2.0}, 10, 40.0, "futile", 0.95)
    cli._print_guard(report, "original", 1.004, "a profile",
                     {"re-export": decide.Prediction(1.003, 1.003), "result": decide.Prediction(1.007, 1.012)})
    assert "the re-export 1.003x, the result 1.007x (at most 1.012x); the result 1.004x by the cost model" \
        in capsys.readouterr().out
    cli._print_guard(report, "original", 1.004, "a profile", {"result": decide.Prediction(1.07, 1.0702)})
    assert "kernel profiles: the result 1.070x; the result" in capsys.readouterr().out
