"""Hostile input: malformed models, odd types, output paths that are not plain new
files, usage mistakes, unproved rules, odd e-graphs. Each case runs a command
in-process and asserts its exit code; an error is exactly one stderr line (no
traceback) naming what is wrong; no file in the case's folder changed unless the
case names it as its output. ``scripts/hostile_table.py`` prints the table."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_egg.cli import main


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _save(folder: Path, name: str, model) -> str:
    path = folder / name
    onnx.save(model, path)
    return str(path)


def _conv_weights():
    return numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")


def _relu(folder: Path, name: str = "in.onnx") -> str:
    return _save(folder, name, _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 5])],
                                      [_vi("y", [2, 5])]))


def _attribute(node, name, value):
    node.attribute.append(helper.make_attribute(name, value))
    return node


def _near_overflow(folder: Path) -> str:
    """x * 3e36 through three MatMuls: the extracted graph multiplies the weights
    first, so its float32 outputs overflow in other places than the input's."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"w{i}")
               for i in range(3)]
    nodes = [helper.make_node("Mul", ["x", "c"], ["s"]), helper.make_node("MatMul", ["s", "w0"], ["a"]),
             helper.make_node("MatMul", ["a", "w1"], ["b"]), helper.make_node("MatMul", ["b", "w2"], ["y"])]
    return _save(folder, "in.onnx", _model(nodes, [_vi("x", [8, 16])], [_vi("y", [8, 16])],
                                           [numpy_helper.from_array(np.array(3e36, np.float32), "c"), *weights]))


# --- the cases ------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    klass: str                              # the class: the table groups by it
    setup: Callable[[Path], list[str]]      # makes the files, returns the command line
    rc: int = 1
    says: str = ""                          # a fragment the error line must hold
    writes: tuple[str, ...] = ()            # files (relative) the command may create or change


def _optimize(model: Callable[[Path], str], *extra: str, out: str = "out.onnx"):
    return lambda d: ["optimize", model(d), "-o", str(d / out), "--measure", "0", *extra]


def _invalid(nodes, inputs, outputs, inits=()):
    return lambda d: _save(d, "in.onnx", _model(nodes, inputs, outputs, inits))


X4 = _vi("x", [1, 3, 8, 8])
Y = _vi("y", None)

CASES = [
    # 1. models that break their operators' schemas: one validation pass, first
    Case("conv strides are floats", "schema", _optimize(_invalid(
        [_attribute(helper.make_node("Conv", ["x", "w"], ["y"]), "strides", [1.0, 1.0])], [X4], [Y],
        [_conv_weights()])), says="strides"),
    Case("softmax axis is a string", "schema", _optimize(_invalid(
        [_attribute(helper.make_node("Softmax", ["x"], ["y"]), "axis", "1")], [_vi("x", [2, 5])], [Y])),
        says="axis"),
    Case("conv with one input", "schema", _optimize(_invalid(
        [helper.make_node("Conv", ["x"], ["y"])], [X4], [Y])), says="input size 1"),
    Case("conv with four inputs", "schema", _optimize(_invalid(
        [helper.make_node("Conv", ["x", "w", "b", "b"], ["y"])], [X4], [Y],
        [_conv_weights(), numpy_helper.from_array(np.ones(4, np.float32), "b")])), says="input size 4"),
    Case("two nodes write one tensor", "schema", _optimize(_invalid(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Sigmoid", ["x"], ["y"])],
        [_vi("x", [2, 5])], [Y])), says="'y'"),
    Case("matmul shapes that never fit", "schema", _optimize(_invalid(
        [helper.make_node("MatMul", ["x", "x"], ["y"])], [_vi("x", [2, 5])], [Y])), says="MatMul"),
    Case("convert: conv with one input", "schema", lambda d: [
        "convert", _invalid([helper.make_node("Conv", ["x"], ["y"])], [X4], [Y])(d), "-o", str(d / "o.onnx")],
        says="input size 1"),
    Case("inspect: softmax axis is a string", "schema", lambda d: [
        "inspect", _invalid([_attribute(helper.make_node("Softmax", ["x"], ["y"]), "axis", "1")],
                            [_vi("x", [2, 5])], [Y])(d)], says="axis"),
    # ... values the operator table cannot model: refused in one line, or carried whole
    Case("sequence input", "not tensors", _optimize(_invalid(
        [helper.make_node("SequenceAt", ["s", "i"], ["y"])],
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2, 5]), _vi("i", [], TensorProto.INT64)],
        [Y])), rc=0, writes=("out.onnx",)),
    Case("sequence inside the graph", "not tensors", _optimize(_invalid(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
         helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], [_vi("x", [2, 5])], [Y])),
        rc=0, writes=("out.onnx",)),
    Case("inspect: sequence output", "not tensors", lambda d: ["inspect", _invalid(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["s"])], [_vi("x", [2, 5])],
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)])(d)], says="sequence"),
    Case("optional input", "not tensors", lambda d: ["convert", _invalid(
        [helper.make_node("OptionalGetElement", ["o"], ["y"])],
        [helper.make_value_info("o", helper.make_optional_type_proto(
            helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))], [Y])(d), "-o", str(d / "o.onnx")],
        says="optional"),
    # ... sizes: numbers past int64, feeds past the machine's memory
    Case("--input-shape past int64", "sizes", _optimize(
        lambda d: _save(d, "in.onnx", _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n", 5])], [Y])),
        "--input-shape", "x=99999999999999999999,5"), says="GiB"),
    Case("a [1e5, 1e5] input", "sizes", _optimize(
        lambda d: _save(d, "in.onnx", _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [100000, 100000])],
                                              [Y]))), says="GiB"),
    Case("a zero-size dimension", "sizes", _optimize(
        lambda d: _save(d, "in.onnx", _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [0, 5])], [Y]))),
        says="size 0 at axis 0"),
    Case("a folder as the input", "sizes", lambda d: (d / "m.onnx").mkdir() or [
        "optimize", str(d / "m.onnx"), "-o", str(d / "out.onnx")], says="is a folder"),

    # 2. where the output goes: a regular file where told, or one line
    Case("-o is the input", "output", lambda d: ["optimize", _relu(d), "-o", str(d / "in.onnx")],
         says="is the input"),
    Case("-o is the input by another path", "output", lambda d: (d / "sub").mkdir() or [
        "optimize", _relu(d), "-o", str(d / "sub" / ".." / "in.onnx")], says="is the input"),
    Case("-o is a hard link to the input", "output", lambda d: os.link(_relu(d), d / "link.onnx") or [
        "optimize", str(d / "in.onnx"), "-o", str(d / "link.onnx")], says="is the input"),
    Case("-o is a symbolic link", "output", lambda d: os.symlink(_relu(d, "other.onnx"), d / "link.onnx") or [
        "optimize", _relu(d), "-o", str(d / "link.onnx")], says="symbolic link"),
    Case("-o is a FIFO", "output", lambda d: os.mkfifo(d / "fifo.onnx") or [
        "optimize", _relu(d), "-o", str(d / "fifo.onnx")], says="FIFO"),
    Case("-o is read-only", "output", lambda d: os.chmod(_relu(d, "ro.onnx"), 0o444) or [
        "optimize", _relu(d), "-o", str(d / "ro.onnx")], says="read-only"),
    Case("-o is a folder", "output", lambda d: (d / "o").mkdir() or [
        "optimize", _relu(d), "-o", str(d / "o")], says="folder"),
    Case("-o names a 256-byte file", "output", lambda d: [
        "optimize", _relu(d), "-o", str(d / ("a" * 251 + ".onnx"))], says="bytes long"),
    Case("-o names a 250-byte file", "output", lambda d: [
        "optimize", _relu(d), "-o", str(d / ("b" * 245 + ".onnx")), "--measure", "0"],
        rc=0, writes=("b" * 245 + ".onnx",)),
    Case("convert -o is the input", "output", lambda d: ["convert", _relu(d), "-o", str(d / "in.onnx")],
         says="is the input"),
    Case("zoo -o is a symbolic link", "output", lambda d: os.symlink(_relu(d), d / "link.onnx") or [
        "zoo", "nasrnn-small", "-o", str(d / "link.onnx")], says="symbolic link"),
    Case("extract -o is the e-graph", "output", lambda d: [
        "extract", _egraph(d), "-o", str(d / "g.json")], says="is the input"),

    # 3. usage mistakes: one line naming the command's --help, exit code 1
    Case("--extractor foo", "usage", lambda d: ["optimize", _relu(d), "-o", str(d / "o.onnx"), "--extractor", "foo"],
         says="see taso-egg optimize --help"),
    Case("missing -o", "usage", lambda d: ["optimize", _relu(d)], says="-o/--output"),
    Case("--node-limit 1e3", "usage", lambda d: ["optimize", _relu(d), "-o", str(d / "o.onnx"), "--node-limit", "1e3"],
         says="invalid int value"),
    Case("an unknown option", "usage", lambda d: ["rules", "generate", "--bogus"],
         says="see taso-egg rules generate --help"),
    Case("an unknown command", "usage", lambda d: ["optimise"], says="invalid choice"),

    # 4. rules a user passes: proved, or asked for
    Case("--rules with an unproved rule", "rules", _optimize(_relu, "--rules", "{d}/wrong.rules"),
         says="are not proved: "),
    Case("--allow-unproved, and the rule is wrong", "rules",
         _optimize(_relu, "--rules", "{d}/wrong.rules", "--allow-unproved"),
         says="rules of --rules applied: relu-is-identity"),

    # 6. what is deployed runs in float32: the written model must overflow as the input does
    Case("inputs near float32 overflow through three MatMuls", "float32", _optimize(_near_overflow),
         says="overflows where the input does not"),

    # 7. smaller promises
    Case("--profile is checked before the model loads", "smaller", lambda d: (d / "in.onnx").write_bytes(b"junk") and [
        "optimize", str(d / "in.onnx"), "-o", str(d / "o.onnx"), "--profile", "nosuch"], says="no profile named"),
    Case("an unnamed symbolic dimension is optimized as a named one", "smaller", _optimize(
        lambda d: _save(d, "in.onnx", _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [None, 5])], [Y]))),
        rc=0, says="symbolic dims priced", writes=("out.onnx",)),
    Case("extract: a root e-class named by its node ids' prefix", "smaller", lambda d: [
        "extract", _write(d / "g.json", json.dumps({
            "nodes": {"33.0": {"op": "a", "children": ["1.0"], "eclass": "29", "cost": 1.0},
                      "1.0": {"op": "x", "children": [], "eclass": "1", "cost": 1.0}},
            "root_eclasses": ["33"]}))], rc=0, says=""),
    Case("extract: negative costs are noted", "smaller", lambda d: [
        "extract", _egraph(d, cost=-2.0)], rc=0, says="negative costs"),
]


def _egraph(folder: Path, cost: float = 1.0) -> str:
    path = folder / "g.json"
    path.write_text(json.dumps({"nodes": {"a": {"op": "x", "children": [], "eclass": "1", "cost": cost}},
                                "root_eclasses": ["1"]}))
    return str(path)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# A rule no proof supports (relu is not the identity), as a user might write one.
WRONG_RULE = "(rule relu-is-identity\n  :lhs (relu ?x)\n  :rhs ?x)\n"


# --- running them ---------------------------------------------------------------------------

@dataclass
class Row:
    case: Case
    rc: int
    line: str           # the one error line (or the first of stderr), "" when none
    lines: int          # lines on stderr that are errors or tracebacks
    traceback: bool
    intact: bool        # every file the case did not name is as it was
    err: str = ""       # all of stderr


def _snapshot(folder: Path) -> dict[str, tuple]:
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            p = Path(root) / name
            st = os.lstat(p)
            data = p.read_bytes() if stat.S_ISREG(st.st_mode) else (os.readlink(p) if p.is_symlink() else b"")
            out[str(p.relative_to(folder))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), data)
    return out


def run_case(case: Case, folder: Path, capsys) -> Row:
    (folder / "wrong.rules").write_text(WRONG_RULE)
    argv = [a.replace("{d}", str(folder)) for a in case.setup(folder)]
    before = _snapshot(folder)
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # a traceback's worth: recorded, the case fails
        import traceback

        traceback.print_exc(file=sys.stderr)
        rc = -1
        del e
    out, err = capsys.readouterr()
    after = _snapshot(folder)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    errors = [line for line in err.splitlines() if line.startswith("taso-egg: error")]
    traceback_seen = "Traceback" in err
    return Row(case, rc, (errors or err.splitlines() or [""])[0], len(errors) + traceback_seen,
               traceback_seen, changed <= set(case.writes), err)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile(case, tmp_path, capsys):
    row = run_case(case, tmp_path, capsys)
    assert not row.traceback, row.line
    assert row.rc == case.rc, row.line
    assert row.intact, f"files changed that the case did not name: {row}"
    if case.rc:
        assert row.lines == 1 and row.line.startswith("taso-egg: error: "), row.line
        assert case.says in row.line, row.line
    else:
        assert case.says in row.err, row.err
    for name in case.writes:  # a written model is one onnxruntime loads
        if name.endswith(".onnx"):
            onnxruntime.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])


def test_output_through_a_device_node_is_refused(tmp_path, capsys):
    """A copy of /dev/null made with mknod (root only) stays a device."""
    try:
        os.mknod(tmp_path / "null.onnx", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root")
    row = run_case(Case("-o is a device", "output", lambda d: ["optimize", _relu(d), "-o", str(d / "null.onnx")]),
                   tmp_path, capsys)
    assert row.rc == 1 and row.lines == 1 and "character device" in row.line and row.intact


# --- usage errors, every command alike -------------------------------------------------------

def _commands(parser, path=()):
    """Every (sub)command's argument path, nested subcommands included."""
    import argparse

    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _python_m_mains():
    from taso_egg.research import benchmarks as bench
    from taso_egg.extract import gym_bench as extract_bench
    from taso_egg.profiling import latency_bench as profiling_bench
    from taso_egg.profiling import gpu_run, prepare

    return {"taso_egg.research.benchmarks": bench.main, "taso_egg.extract.gym_bench": extract_bench.main,
            "taso_egg.profiling.latency_bench": profiling_bench.main, "taso_egg.profiling.gpu_run": gpu_run.main,
            "taso_egg.profiling.prepare": prepare.main}


def _usage_error(capsys, call) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as e:
        call()
    return e.value.code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("command", [" ".join(p) for p in _commands(__import__("taso_egg.cli").cli.build_parser())])
def test_every_command_says_a_usage_error_in_one_line(command, capsys):
    code, err = _usage_error(capsys, lambda: main([*command.split(), "--no-such-option"]))
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("taso-egg: error: ")  # the unknown option, or a missing argument
    assert err[0].endswith(f"(see {' '.join(['taso-egg', *command.split()])} --help)")


@pytest.mark.parametrize("module", sorted(_python_m_mains()))
def test_every_python_m_main_says_a_usage_error_in_one_line(module, capsys):
    code, err = _usage_error(capsys, lambda: _python_m_mains()[module](["--no-such-option"]))
    assert code == 1 and len(err) == 1, err
    assert err[0].endswith(f"(see python -m {module} --help)")
