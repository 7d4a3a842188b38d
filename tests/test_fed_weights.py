"""Bounded memory: a model's weights are read once into arrays that the imports, the
candidates and the onnxruntime sessions share (``onnx_io.fed``); no model is
serialized to bytes with its weights (protobuf refuses past 2 GB); large models are
timed one session at a time; external data is written back as external data."""

from __future__ import annotations

import weakref

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from taso_egg.product import timing
from taso_egg.cli import main

RNG = np.random.default_rng(0)
HIDDEN = 256  # weights of 64 KiB each: past fed.STUB_BYTES


def _mlp(path, external: bool):
    """Two matmuls of one input summed (merged into one by the rules), batch symbolic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HIDDEN])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    weights = [numpy_helper.from_array((RNG.standard_normal((64, HIDDEN)) * 0.1).astype(np.float32), name)
               for name in ("w1", "w2")]
    model = helper.make_model(helper.make_graph(nodes, "mlp", [x], [y], weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=external, location=f"{path.name}.weights", size_threshold=0)
    return sum(w.raw_data.__len__() for w in weights)


def test_no_model_is_serialized_with_its_weights(tmp_path, monkeypatch, capsys):
    """Timing, the check at two sizes and writing give onnxruntime and protobuf the
    model without its large weights: every SerializeToString of a ModelProto is far
    smaller than the weights (on main, each session got the model serialized whole)."""
    from taso_egg.check.runtime import onnx_outputs

    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    weight_bytes = _mlp(src, external=True)
    sizes = []
    serialize = onnx.ModelProto.SerializeToString

    def recorded(self, *args, **kwargs):
        data = serialize(self, *args, **kwargs)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", recorded)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out)]) == 0  # default measurement: timed, checked
    text = capsys.readouterr().out
    monkeypatch.undo()
    assert "timing" in text or "measured" in text, text
    assert sizes and max(sizes) < weight_bytes / 4, (max(sizes), weight_bytes)
    # written back with external data, the interface kept, outputs equal at two batch sizes
    raw = onnx.load(out, load_external_data=False)
    assert (tmp_path / "out.onnx.data").is_file()
    assert all(t.data_location == TensorProto.EXTERNAL for t in raw.graph.initializer if len(t.dims) > 1)
    assert [d.dim_param for d in raw.graph.input[0].type.tensor_type.shape.dim] == ["batch", ""]
    for batch in (1, 5):
        feeds = {"x": RNG.standard_normal((batch, 64)).astype(np.float32)}
        ref, got = onnx_outputs(onnx.load(src), feeds), onnx_outputs(onnx.load(out), feeds)
        assert np.allclose(ref["y"], got["y"], rtol=1e-5, atol=1e-6)


def test_imports_share_the_read_weights(tmp_path):
    """A file is read into arrays once; the imports at both sizes hold those arrays,
    not copies (on main every import copied every weight out of protobuf)."""
    from taso_egg.product.dynamic import DynamicModel
    from taso_egg.onnx_io.fed import FedModel
    from taso_egg.onnx_io.reading import read_model_file

    for external in (False, True):
        path = tmp_path / f"model{external}.onnx"
        _mlp(path, external)
        model, is_external = read_model_file(path, fed=True)
        assert isinstance(model, FedModel) and is_external == external
        assert sorted(model.arrays) == ["w1", "w2"]
        assert all(not t.raw_data for t in model.graph.initializer)
        dyn = DynamicModel.load(model)
        for graph in (dyn.graph, dyn.second_graph()):
            held = {n.params["name"]: graph.weight_array(n) for n in graph.weights()}
            assert all(held[k] is model.arrays[k] for k in ("w1", "w2"))


def test_models_are_timed_one_session_at_a_time(tmp_path, monkeypatch):
    """Each round builds, samples and frees one session per model: never two alive at
    once, every model sampled every round."""
    from taso_egg.onnx_io.reading import read_model_file

    path = tmp_path / "model.onnx"
    _mlp(path, external=False)
    model, _ = read_model_file(path, fed=True)
    alive, most = [], []
    make = timing.make_session

    def counted(*args, **kwargs):
        session = make(*args, **kwargs)
        alive.append(1)
        most.append(len(alive))
        weakref.finalize(session, alive.pop)
        return session

    monkeypatch.setattr(timing, "make_session", counted)
    feeds = {"x": np.ones((2, 64), np.float32)}
    runs = timing.ort_runs({"a": model, "b": model}, feeds, 3)
    assert {k: len(v) for k, v in runs.items()} == {"a": 3, "b": 3}
    assert len(most) == 6 and max(most) == 1


def test_fed_model_written_inline_is_the_model(tmp_path):
    """Written tensor by tensor (no whole copy in protobuf), the file holds the bytes
    protobuf writes for the model with its weights inside: the input's own bytes."""
    from taso_egg.onnx_io.exporter import save_atomically
    from taso_egg.onnx_io.fed import inline
    from taso_egg.onnx_io.reading import read_model_file

    path = tmp_path / "model.onnx"
    _mlp(path, external=False)
    model, _ = read_model_file(path, fed=True)
    save_atomically(model, tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").read_bytes() == path.read_bytes() == inline(model).SerializeToString()


def _tied_lm(path, vocab: int = 300, width: int = 64):
    """A tiny language model whose head is its token embedding, tied as the exporters
    write it: logits = h @ Transpose(wte); h the embedded tokens through two matmuls
    of one input summed (merged by the rules, so the result is written)."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["h"]),
             helper.make_node("MatMul", ["h", "w1"], ["a"]), helper.make_node("MatMul", ["h", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Transpose", ["wte"], ["head"], perm=[1, 0]),
             helper.make_node("MatMul", ["r", "head"], ["logits"])]
    weights = [numpy_helper.from_array((RNG.standard_normal(shape) * 0.1).astype(np.float32), name)
               for name, shape in (("wte", (vocab, width)), ("w1", (width, width)), ("w2", (width, width)))]
    model = helper.make_model(helper.make_graph(nodes, "tied", [ids], [logits], weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return model


def test_tied_weight_is_written_once(tmp_path, capsys):
    """A weight read both as it is and through a layout view (a tied LM head) is written
    once, the view as its operator on it: the written file is no larger than the
    input's plus a few KB (on main the exporter folded the transpose into a second
    copy of the embedding), and computes what the input computes."""
    from taso_egg.check.runtime import onnx_outputs

    src = tmp_path / "tied.onnx"
    original = _tied_lm(src)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--measure", "0"]) == 0
    text = capsys.readouterr().out
    assert "(the input" not in [line for line in text.splitlines() if line.startswith("wrote ")][-1], text
    written = onnx.load(out)
    embedding = 300 * 64
    assert [t.name for t in written.graph.initializer if np.prod(t.dims) == embedding] == ["wte"]
    assert out.stat().st_size <= src.stat().st_size + 4096, (out.stat().st_size, src.stat().st_size)
    feeds = {"ids": RNG.integers(0, 300, (2, 5)).astype(np.int64)}
    assert np.allclose(onnx_outputs(original, feeds)["logits"], onnx_outputs(written, feeds)["logits"],
                       rtol=1e-5, atol=1e-5)


def test_check_runs_read_the_weights_in_place(tmp_path, monkeypatch):
    """The check's onnxruntime runs get a fed model's weights as inputs, the arrays
    themselves, never as initializers (onnxruntime copies those into every session: on
    main each check run held a second copy of every weight), and compute the same."""
    import onnxruntime as ort

    from taso_egg.onnx_io.reading import read_model_file
    from taso_egg.check.runtime import onnx_outputs

    path = tmp_path / "model.onnx"
    _mlp(path, external=False)
    model, _ = read_model_file(path, fed=True)
    given, fed = [], []
    monkeypatch.setattr(ort.SessionOptions, "add_external_initializers",
                        lambda self, names, values: given.extend(names))
    run = ort.InferenceSession.run

    def recorded(self, names, feeds, *args, **kwargs):
        fed.extend(a for a in feeds.values())
        return run(self, names, feeds, *args, **kwargs)

    monkeypatch.setattr(ort.InferenceSession, "run", recorded)
    feeds = {"x": RNG.standard_normal((3, 64)).astype(np.float32)}
    got = onnx_outputs(model, feeds)["y"]
    assert given == []
    assert all(any(a is w for a in fed) for w in model.arrays.values())
    monkeypatch.undo()
    assert np.array_equal(got, onnx_outputs(str(path), feeds)["y"])


_SESSION_MEMORY_RUN = """
import json, sys
import numpy as np
from onnx import TensorProto, helper
from taso_egg.product import timing
from taso_egg.onnx_io.fed import FedModel, stub

def rss():  # resident and peak resident MiB
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return [int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")]

def since(base):  # MiB more than ``base`` (resident and peak), the peak reset
    now = rss()
    open("/proc/self/clear_refs", "w").write("5")
    return [now[0] - base, now[1] - base]

def mlp(scale):  # a token table (gathered: not prepacked) and four matmul weights (prepacked)
    rng = np.random.default_rng(0)
    arrays = {"wte": rng.standard_normal((256 * scale, 1024), dtype=np.float32)}
    arrays.update({f"w{i}": rng.standard_normal((1024, 1024), dtype=np.float32) * 0.03 for i in range(4)})
    nodes, h = [helper.make_node("Gather", ["wte", "ids"], ["h"])], "h"
    for i in range(4):
        nodes.append(helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"]))
        h = f"m{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, 16, 1024])],
                              [stub(k, a) for k, a in arrays.items()])
    return FedModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), arrays)

feeds = {"ids": np.zeros((1, 16), np.int64)}
timing.ort_runs({"a": mlp(1)}, feeds, 1)  # onnxruntime's own first-session memory, out of the figures
model = mlp(64)  # 64 MiB of table, 16 of matmuls
out = {}
base = since(0)[0]
session = timing.make_session(model)
session.run(None, feeds)
out["built"] = since(base)
del session
timing.ort_runs({"a": model, "b": model}, feeds, 2)
out["rounds"] = since(base)
timing.kernel_times(model, feeds, 1, optimized_path=sys.argv[1])
out["profiled"] = since(base)
print(json.dumps(out))
"""


def test_sessions_read_the_weights_in_place(tmp_path):
    """A timed session (all optimizations, prepacking on) keeps what it prepacks and
    reads the rest of the weights in place: it builds with at most 1.25x the weights
    more and keeps the prepacked matmuls, not the gathered table; sessions built one at
    a time give their memory back when freed; the calibration profile, which writes the
    graph onnxruntime runs, builds within 1.25x too. On main a session kept a copy of
    the table, a round held the freed sessions' memory while it built the next, and the
    profile built with 2x. In a fresh process, from VmRSS and VmHWM."""
    import json
    import subprocess
    import sys

    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/status")
    done = subprocess.run([sys.executable, "-c", _SESSION_MEMORY_RUN, str(tmp_path / "ran.onnx")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    mib = json.loads(done.stdout.split("\n")[-2])
    print(mib)
    weights, matmuls = 80, 16
    (built, built_peak), (after_rounds, rounds_peak), (_, profiled_peak) = mib["built"], mib["rounds"], mib["profiled"]
    assert built < matmuls + 0.25 * weights and built_peak < 1.25 * weights
    assert after_rounds < 0.25 * weights and rounds_peak < 1.25 * weights
    assert profiled_peak < 1.25 * weights


_MAPPED_MEMORY_RUN = """
import json, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from taso_egg.product import timing
from taso_egg.onnx_io import fed
from taso_egg.onnx_io.reading import read_model_file

def rss():  # resident MiB
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(status["VmRSS"].split()[0]) / 1024

rng = np.random.default_rng(0)
weights = [numpy_helper.from_array(rng.standard_normal((1024, 4096), dtype=np.float32), f"w{i}") for i in range(4)]
nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(4)]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 4096]) for i in range(4)],
                          weights)
path = sys.argv[1]
onnx.save(helper.make_model(graph), path, save_as_external_data=True, location="w.data", size_threshold=0)
del weights, graph
base = rss()
model = read_model_file(path, fed=True)[0]
sums = [float(a.sum(dtype=np.float64)) for a in model.arrays.values()]  # every page read
out = {"read": rss() - base}
fed.release_mapped_pages()
out["released"] = rss() - base
out["same"] = sums == [float(a.sum(dtype=np.float64)) for a in model.arrays.values()]
fed.release_mapped_pages()
merged = np.concatenate([model.arrays["w0"], model.arrays["w1"]], axis=1)  # computed: 32 MiB
candidate = fed.file_backed(fed.FedModel(model.model, {**model.arrays, "w0": merged}))
out["spilled"] = candidate.arrays["w0"] is not merged and bool(np.array_equal(candidate.arrays["w0"], merged))
del merged
timing.return_freed_memory()  # the merged array's own memory too
out["candidate released"] = rss() - base
print(json.dumps(out))
"""


def test_weights_read_from_files_and_computed_ones_leave_memory_between_sessions(tmp_path):
    """Weights in external data are mapped, not copied: read, they are resident; once a
    session is done with them (``fed.release_mapped_pages``) they are not, and read
    again unchanged. A candidate's computed weights (a merged projection) are moved to
    a file as well (``fed.file_backed``, its threshold lowered here) and leave memory
    alike: a 1B-wide Llama's merged projections were resident beside the original's
    weights and onnxruntime's prepacked copy. In a fresh process, from VmRSS."""
    import json
    import subprocess
    import sys

    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/status")
    run = _MAPPED_MEMORY_RUN.replace("import json, sys", "import json, sys\nfrom taso_egg.onnx_io import fed as _f\n"
                                     "_f.SPILL_BYTES = 1 << 20")
    done = subprocess.run([sys.executable, "-c", run, str(tmp_path / "m.onnx")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    mib = json.loads(done.stdout.split("\n")[-2])
    print(mib)
    weights = 64  # four 16 MiB matrices
    assert mib["read"] > 0.75 * weights
    assert mib["released"] < 0.25 * weights and mib["same"]
    assert mib["spilled"] and mib["candidate released"] < 0.25 * weights


def test_only_a_mapped_models_computed_weights_are_moved_to_a_file(monkeypatch):
    """``fed.file_backed`` leaves a model whose weights are all in memory (read from one
    file, nothing mapped) as it is, and one whose computed weights are below its
    threshold; the arrays it moves keep their values, dtype and shape."""
    from taso_egg.onnx_io import fed

    plain = fed.FedModel(onnx.ModelProto(), {"w": np.ones((64, 64), np.float32)})
    monkeypatch.setattr(fed, "SPILL_BYTES", 1)
    assert fed.file_backed(plain) is plain and fed.file_backed(None) is None
    import mmap
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(np.arange(4096, dtype=np.float32).tobytes())
        f.flush()
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped = np.frombuffer(mapping, dtype=np.float32).reshape(64, 64)
    computed = (mapped.T * 2).astype(np.float16)
    model = fed.FedModel(onnx.ModelProto(), {"w": mapped, "c": computed})
    moved = fed.file_backed(model)
    assert moved.arrays["w"] is mapped and fed._mapped_root(moved.arrays["c"])
    assert moved.arrays["c"].dtype == np.float16 and np.array_equal(moved.arrays["c"], computed)
    monkeypatch.setattr(fed, "SPILL_BYTES", computed.nbytes + 1)
    assert fed.file_backed(model) is model
