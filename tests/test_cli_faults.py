"""Bad input and faults on the command line: one line on stderr, exit 1, the input
intact, no partial output, an existing output untouched, no temporary left behind;
and checked before any heavy work starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from taso_egg.cli import main

from conftest import init, make_model, vi

OLD = b"an earlier output, to be kept"


def _matmul_model(batch=4, opset=17):
    w = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    return make_model([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                      [vi("x", [batch, 64])], [vi("y", [batch, 64])], [init("W", w)], opset=opset)


def _write_inputs(folder: Path) -> None:
    onnx.save(_matmul_model(), folder / "model.onnx")
    onnx.save(_matmul_model(opset=30), folder / "opset30.onnx")
    (folder / "binary.rules").write_bytes(bytes(range(256)) * 4)
    ext = folder / "ext"
    ext.mkdir()
    onnx.save(_matmul_model(), ext / "model.onnx", save_as_external_data=True, location="model.data",
              size_threshold=0)
    (ext / "model.data").unlink()


# (row, arguments after "optimize" with {d} the folder, what the one line must say)
FAULTS = [
    ("no such file", ["{d}/missing.onnx"], "missing.onnx: no such file"),
    ("not an ONNX file", ["{d}/binary.rules"], "not a readable ONNX model"),
    ("missing external data", ["{d}/ext/model.onnx"], "external weight data cannot be read"),
    ("opset 30", ["{d}/opset30.onnx"], "opset 30"),
    ("--input-shape overrides a static dim", ["{d}/model.onnx", "--input-shape", "x=8,64"],
     "where the model fixes 4"),
    ("--input-shape names no input", ["{d}/model.onnx", "--input-shape", "z=1,64"],
     "'z', which is not an input"),
    ("binary --rules file", ["{d}/model.onnx", "--rules", "{d}/binary.rules"], "not UTF-8 text"),
    ("--measure too large", ["{d}/model.onnx", "--measure", "100000"], "or from 10 to 500"),
    ("--measure too few to decide", ["{d}/model.onnx", "--measure", "5"], "cannot confirm a gain"),
    ("--extract-time-limit 0", ["{d}/model.onnx", "--extract-time-limit", "0"], "positive number"),
    ("--node-limit 0", ["{d}/model.onnx", "--node-limit", "0"], "nodes=0"),
]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("row,args,message", FAULTS, ids=[f[0] for f in FAULTS])
def test_bad_input_is_one_line_and_touches_nothing(row, args, message, tmp_path, capsys, monkeypatch):
    import taso_egg.rules.corpus as corpus

    _write_inputs(tmp_path)
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = _snapshot(tmp_path)
    # Validation comes before the corpus: loading it here would be a bug.
    monkeypatch.setattr(corpus, "load_corpus", lambda *a, **k: pytest.fail("corpus loaded before validation"))
    argv = ["optimize", *[a.format(d=tmp_path) for a in args], "-o", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("taso-egg: error: ") and message in err[0], err
    assert _snapshot(tmp_path) == before  # inputs intact, output untouched, nothing added


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in: a read-only one where permissions
    bind (not as root), else /sys (read-only even for root)."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "probe").touch()
    except OSError:
        return folder
    (folder / "probe").unlink()
    sysfs = Path("/sys")
    try:
        (sysfs / "taso-egg-probe").touch()
    except OSError:
        return sysfs
    pytest.fail("no unwritable folder on this machine to test with")


@pytest.mark.parametrize("where", ["read-only folder", "missing folder", "a folder"])
def test_unwritable_output_fails_before_the_work(where, tmp_path, capsys, monkeypatch):
    import taso_egg.rules.corpus as corpus

    _write_inputs(tmp_path)
    out = {"read-only folder": lambda: _unwritable_folder(tmp_path) / "out.onnx",
           "missing folder": lambda: tmp_path / "nowhere" / "out.onnx",
           "a folder": lambda: tmp_path / "ext"}[where]()
    monkeypatch.setattr(corpus, "load_corpus", lambda *a, **k: pytest.fail("corpus loaded before the "
                                                                          "output was checked"))
    before = _snapshot(tmp_path)
    assert main(["optimize", str(tmp_path / "model.onnx"), "-o", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"taso-egg: error: cannot write {out}"), err
    assert _snapshot(tmp_path) == before
    for command in (["convert", str(tmp_path / "model.onnx")], ["zoo", "nasrnn-small"]):
        assert main([*command, "-o", str(out)]) == 1
        assert "cannot write" in capsys.readouterr().err


def test_external_data_is_written_back_as_external_data(tmp_path, capsys):
    from taso_egg.check.runtime import onnx_outputs

    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    onnx.save(_matmul_model(), src, save_as_external_data=True, location="weights.bin", size_threshold=0)
    for command in ("optimize", "convert"):
        out = tmp_path / f"{command}.onnx"
        assert main([command, str(src), "-o", str(out), *(["--measure", "0"] if command == "optimize" else [])]) == 0
        capsys.readouterr()
        assert (tmp_path / f"{command}.onnx.data").is_file()
        raw = onnx.load(out, load_external_data=False)
        assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in raw.graph.initializer)
        feeds = {"x": np.ones((4, 64), np.float32)}
        ref = onnx_outputs(onnx.load(src), feeds)
        got = onnx_outputs(onnx.load(out), feeds)
        assert np.allclose(ref["y"], got["y"], rtol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convert.onnx", "convert.onnx.data", "in",
                                                          "optimize.onnx", "optimize.onnx.data"]


_SIGTERM_MID_WRITE = textwrap.dedent("""
    import os, signal, sys, time
    import onnx
    from taso_egg import cli

    real_save = onnx.save

    def save_then_die(model, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"half a model")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives here, mid-write
        real_save(model, path, *args, **kwargs)

    onnx.save = save_then_die
    sys.exit(cli.main(["zoo", "nasrnn-small", "-o", sys.argv[1]]))
""")


def test_sigterm_mid_write_leaves_no_temporary(tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_MID_WRITE, str(out)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "taso-egg: terminated"
    assert out.read_bytes() == OLD
    assert sorted(os.listdir(tmp_path)) == ["out.onnx"]


def test_optimize_shows_each_phase(tmp_path, capsys):
    src = tmp_path / "model.onnx"
    onnx.save(_matmul_model(), src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--measure", "0"]) == 0
    out, err = capsys.readouterr()
    for phase in ("saturating", "iteration  1", "extracting (ilp, time limit 60 s)"):
        assert phase in err
    # the input is kept (nothing to gain), so the extracted graph is not checked
    assert "checking the extracted graph" not in err and "check: none needed" in out


def test_extract_time_limit_reaches_the_extractor(monkeypatch, tmp_path, capsys):
    import taso_egg.product.optimize_graph as api

    seen = []
    real = api.extract_graph

    def spy(sat, extractor, model, time_limit=None, **more):
        seen.append((extractor, time_limit))
        return real(sat, extractor, model, time_limit, **more)

    monkeypatch.setattr(api, "extract_graph", spy)
    src = tmp_path / "model.onnx"
    onnx.save(_matmul_model(), src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--measure", "0",
                 "--extract-time-limit", "7.5"]) == 0
    # the runtime form's fusion pass (greedy, before saturation: calibration prices it) aside
    assert [call for call in seen if call[0] != "greedy-dag"] == [("ilp", 7.5)]


@pytest.mark.parametrize("command", ["extract", "compare", "search", "zoo", "convert", "profile"])
def test_every_writer_checks_its_output_before_the_work(command, tmp_path, capsys):
    import json

    egraph = tmp_path / "e.json"
    egraph.write_text(json.dumps({"nodes": {"a.0": {"op": "x", "cost": 1.0, "eclass": "a", "children": []}},
                                  "root_eclasses": ["a"]}))
    onnx.save(_matmul_model(), tmp_path / "model.onnx")
    target = _unwritable_folder(tmp_path) / "out"
    argv = {"extract": ["extract", str(egraph), "-o", str(target)],
            "compare": ["compare", "nasrnn-small", "-o", str(target / "results")],
            "search": ["search", "nasrnn-small", "-o", str(target)],
            "zoo": ["zoo", "nasrnn-small", "-o", str(target)],
            "convert": ["convert", str(tmp_path / "model.onnx"), "-o", str(target)],
            "profile": ["profile", "nasrnn-small", "--backend", "numpy", "-o", str(target)]}[command]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith("taso-egg: error: cannot "), err
    assert out == ""  # nothing ran: no table, no progress


def test_help_states_the_node_ceiling_and_the_bounds(capsys):
    from taso_egg.cli import build_parser

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["optimize"].format_help().split())
    assert "never holds more than twice the limit" in text
    assert "--extract-time-limit" in text and "N rounds at most (10 to 500" in text
