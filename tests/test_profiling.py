"""Profiling: configuration keys, the profile store (round trip, merge, corrupt and
foreign files), the back ends on tiny configurations (NumPy standing in for CuPy,
CUDA events faked), the profiled cost model's lookups vs fallback, and the CLI.
No test asserts a timing: the machine is shared."""

from __future__ import annotations

import json
import types

import numpy as np
import onnx
import pytest
from taso_egg.rules.corpus import load_corpus

from taso_egg.research import zoo
from taso_egg.cost import (
    AnalyticCost,
    OpConfig,
    ProfiledCost,
    graph_cost,
    load_cost_model,
)
from taso_egg.cost.store import FORMAT, Profile, load_profile
from taso_egg.errors import ProfileError
from taso_egg.options import OptimizeOptions
from taso_egg.ops import TensorType
from taso_egg.profiling import backends
from taso_egg.profiling.backends import (
    KernelBackend,
    OrtBackend,
    make_backend,
    one_op_graph,
)
from taso_egg.profiling.profiler import (
    graph_configurations,
    new_profile,
    profile_configurations,
    saturation_configurations,
)

FAST = {"warmups": 1, "repeats": 2}
# The hand rules whether or not the verifier has signed them off yet: these tests need
# rewrites to happen, not any particular rule.
ALL_RULES = load_corpus(include_unproved=True)


@pytest.fixture(autouse=True)
def short_samples(monkeypatch):
    # Tiny samples and few copies keep every measurement to milliseconds.
    monkeypatch.setattr(backends, "SAMPLE_S", 1e-5)
    monkeypatch.setattr(backends, "DIRECT_ABOVE_S", 1.0)  # everything counts as fast
    monkeypatch.setattr(backends, "MAX_COPIES", 4)
    monkeypatch.setattr("taso_egg.profiling.profiler._CALIBRATION_SIZES",
                        {"cpu": (16, 64), "gpu": (16, 64)})


def _mm(m=4, k=8, n=3, const=True):
    return OpConfig.of("matmul", {}, [TensorType((m, k)), TensorType((k, n))], constant=[False, const])


def _meta(backend="numpy", **over):
    meta = {"device": "cpu", "backend": backend, "device_name": "test cpu", "dtype": "float32",
            "threads": {"blas": 1}, "libraries": {"numpy": "1"},
            "calibration": {"peak_flops": 1e9, "bandwidth": 1e9, "overhead_s": 1e-6,
                            "run_overhead_s": 0.0}}
    meta.update(over)
    return meta


def _entry(seconds):
    return {"seconds": seconds, "spread_s": 0.0, "samples": 1, "loops": 1, "copies": 1, "note": ""}


# --- configuration keys --------------------------------------------------------------

def test_key_is_canonical_and_distinguishes_what_matters():
    a = OpConfig.of("matmul", {"activation": "NONE"}, [TensorType((4, 8)), TensorType((8, 3))], constant=[0, 1])
    b = OpConfig.of("matmul", {}, (TensorType((4, 8)), TensorType((8, 3))), constant=(False, True))
    assert a.key == b.key and a.outputs == (TensorType((4, 3)),)
    assert a.key != _mm(const=False).key            # a constant operand is another configuration
    assert a.key != OpConfig.of("matmul", {"activation": "RELU"}, a.inputs, constant=a.constant).key
    assert a.key != _mm(m=5).key
    assert OpConfig.of("relu", {}, [TensorType((2,), "float16")]).key != \
        OpConfig.of("relu", {}, [TensorType((2,))]).key


def test_graph_and_egraph_configurations_share_keys():
    from taso_egg.egraph.saturate import saturate

    g = zoo.nasrnn(steps=1, hidden=8)
    own = {c.key for c in graph_configurations(g)}
    sat = {c.key for c in saturation_configurations(saturate(g, rules=ALL_RULES))}
    assert own and own <= sat                       # the original is one extraction of the e-graph
    assert any(c.startswith("concat") for c in sat - own)   # and rewrites add configurations
    assert not any(c.startswith(("input", "weight")) for c in sat)


# --- store ---------------------------------------------------------------------------

def test_store_round_trip_and_merge(tmp_path):
    p = Profile(_meta())
    assert p.add(_mm(), _entry(1e-3))
    assert not p.add(_mm(), _entry(2e-3))            # kept unless asked
    path = tmp_path / "p.json"
    p.save(path)
    back = load_profile(path)
    assert back.meta == p.meta and back.entries == p.entries
    assert json.loads(path.read_text())["format"] == FORMAT

    other = Profile(_meta())
    other.add(_mm(), _entry(5e-3))
    other.add(_mm(m=7), _entry(4e-3))
    report = back.merge(other)
    assert (report.added, report.kept, report.replaced) == (1, 1, 0)
    assert back.entries[_mm().key]["seconds"] == 1e-3
    report = back.merge(other, replace=True)
    assert report.replaced == 2 and back.entries[_mm().key]["seconds"] == 5e-3


def test_merge_refuses_other_device_or_versions():
    p = Profile(_meta())
    with pytest.raises(ProfileError, match="libraries"):
        p.merge(Profile(_meta(libraries={"numpy": "2"})))
    with pytest.raises(ProfileError, match="backend"):
        p.merge(Profile(_meta(backend="ort")))


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"format": "something else"}', "not a taso-egg profile"),
    ('{"format": "taso-egg-profile", "version": 99, "meta": {}, "entries": {}}', "version 99"),
    ('{"format": "taso-egg-profile", "version": 1, "meta": [], "entries": {}}', "must be objects"),
])
def test_corrupt_or_foreign_files_raise(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message):
        load_profile(path)


def test_bad_entry_and_missing_file_raise(tmp_path):
    data = Profile(_meta()).to_json()
    data["entries"]["x"] = {"seconds": "fast"}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="entry 'x'"):
        load_profile(path)
    data["entries"] = {}
    data["meta"]["calibration"]["peak_flops"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="peak_flops"):
        load_profile(path)
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(ProfileError, match="no profile named"):
        load_cost_model("no-such-device")


# --- back ends -----------------------------------------------------------------------

def test_one_op_graph_gives_each_copy_its_own_weights():
    g = one_op_graph(_mm(), copies=3)
    assert g.op_counts()["matmul"] == 3 and len(g.inputs()) == 1 and len(g.weights()) == 3
    with pytest.raises(ProfileError, match="folded"):
        one_op_graph(OpConfig.of("relu", {}, [TensorType((2,))], constant=[True]))


@pytest.mark.parametrize("backend", ["numpy", "ort"])
def test_backends_measure_tiny_configurations(backend):
    b = make_backend(backend)
    for config in (_mm(), OpConfig.of("relu", {}, [TensorType((3, 5))])):
        m = b.measure(config, **FAST)
        assert m.seconds >= 0 and m.spread_s >= 0 and m.samples == 2 and m.loops >= 1
        assert m.copies == 4                        # fast: timed as the marginal cost of a copy


def test_slow_configurations_are_timed_directly(monkeypatch):
    monkeypatch.setattr(backends, "DIRECT_ABOVE_S", 0.0)
    assert make_backend("numpy").measure(_mm(), **FAST).copies == 1


def test_ort_reshape_is_timed_as_the_alias_it_is_inside_a_model():
    config = OpConfig.of("reshape", {"shape": (6, 20)}, [TensorType((4, 30))])
    m = OrtBackend().measure(config, **FAST)
    assert "alias" in m.note


def test_ort_leaves_out_the_layout_reorders_at_a_one_op_models_boundary(monkeypatch):
    conv = OpConfig.of("conv2d", {"strides": (1, 1), "padding": "SAME"},
                       [TensorType((1, 16, 8, 8)), TensorType((16, 16, 1, 1))], constant=[False, True])
    b = OrtBackend()
    share = b.boundary_share(conv, copies=4)
    assert 0 < share < 1                        # NCHWc: reorders in, conv, reorders out
    assert b.boundary_share(_mm(), copies=4) == 0  # no blocked layout for matmul
    m = b.measure(conv, **FAST)
    assert "reorders" in m.note
    monkeypatch.setattr(OrtBackend, "boundary_share", lambda self, config, copies: 0.25)
    monkeypatch.setattr(backends._GraphBackend, "measure",
                        lambda self, config, warmups, repeats: backends.Measurement(4e-3, 4e-4, 2, 1))
    m = OrtBackend().measure(conv, **FAST)
    assert m.seconds == pytest.approx(3e-3) and m.spread_s == pytest.approx(3e-4)


def test_ort_times_conv2d_sum_fused_as_in_a_model(tmp_path):
    import onnxruntime as ort

    from taso_egg.onnx_io.exporter import export_onnx

    config = OpConfig.of("conv2d_sum", {"activation": "RELU"},
                         [TensorType((1, 16, 8, 8)), TensorType((16, 16, 1, 1)), TensorType((1, 16, 8, 8))],
                         constant=[False, True, False])
    b = OrtBackend()
    g = b._graph(config, copies=2)
    assert g.op_counts()["maxpool2d"] == 2 and g.op_counts()["conv2d_sum"] == 2
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(export_onnx(g).SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node]
    if "ReorderInput" not in ops:
        pytest.skip("onnxruntime runs no NCHWc kernels on this CPU")
    assert "Add" not in ops and "Relu" not in ops     # fused into the conv, as in a ResNet
    assert 0 < b.boundary_share(config, copies=2) < 1  # the staging pools and reorders


def _numpy_as(name, with_events=False):
    """NumPy under another module name; optionally with CuPy's CUDA-event API faked
    on the host clock, so the event-timed code path runs without a GPU."""
    import time

    mod = types.ModuleType(name)
    mod.__getattr__ = lambda attr: getattr(np, attr)
    if with_events:
        class Event:
            def record(self):
                self.t = time.perf_counter()

            def synchronize(self):
                pass

        mod.cuda = types.SimpleNamespace(Event=Event,
                                         get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)
    return mod


def test_cupy_backend_with_numpy_standing_in():
    stand_in = _numpy_as("fakecupy")
    b = make_backend("cupy", xp=stand_in)
    assert b.device == "gpu" and not b.events
    assert "standing in" in b.metadata()["device_name"]
    profile = new_profile(b, **FAST)
    run = profile_configurations([_mm(), _mm(m=2)], b, profile, progress=False, **FAST)
    assert run.measured == 2 and not run.failed
    assert profile.meta["backend"] == "cupy" and profile.meta["calibration"]["peak_flops"] > 0


def test_cupy_event_clock_path():
    b = KernelBackend(_numpy_as("fakecupy", with_events=True), "cupy")
    assert b.events
    m = b.measure(_mm(), **FAST)
    assert m.seconds >= 0 and m.samples == 2


def test_unknown_backend_and_missing_cupy():
    with pytest.raises(ProfileError, match="unknown back end"):
        make_backend("tpu")
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ProfileError, match="CuPy"):
            make_backend("cupy")


# --- the cost model --------------------------------------------------------------------

def _node_configs(g):
    folded = g.weight_only_nodes()
    return [OpConfig.of(n.op, n.params, [t.type for t in n.inputs], n.outputs,
                        [t.node in folded for t in n.inputs])
            for n in g.nodes.values() if n.op not in ("input", "weight") and n.id not in folded]


def test_profiled_cost_uses_profile_then_calibrated_fallback():
    g = zoo.nasrnn(steps=1, hidden=8)
    configs = _node_configs(g)
    left_out = configs[0]
    p = Profile(_meta())
    for i, c in enumerate(graph_configurations(g)):
        if c.key != left_out.key:
            p.add(c, _entry(1e-3 * (i + 1)))
    model = ProfiledCost(p)
    total = graph_cost(g, model)
    fallback = AnalyticCost("x", 1e9, 1e9, 1e-6).cost(left_out)
    assert fallback > 0
    expected = sum(fallback if c.key == left_out.key else p.entries[c.key]["seconds"] for c in configs)
    assert total == pytest.approx(expected)
    n_left_out = sum(c.key == left_out.key for c in configs)
    assert model.lookups() == {"measured": len(configs) - n_left_out, "estimated": n_left_out, "borrowed": 0,
                               "measured_configs": len(p.entries), "estimated_configs": 1,
                               "borrowed_configs": 0}


def test_an_unprofiled_conv_with_bias_and_activation_borrows_its_bare_time():
    x, w, b = TensorType((1, 4, 8, 8)), TensorType((6, 4, 3, 3)), TensorType((6,))
    params = {"strides": (1, 1), "padding": "SAME"}
    bare = OpConfig.of("conv2d", dict(params, activation="NONE"), [x, w], None, [False, True])
    fused = OpConfig.of("conv2d", dict(params, activation="RELU"), [x, w, b], None, [False, True, True])
    p = Profile(_meta())
    p.add(bare, _entry(2e-3))
    model = ProfiledCost(p)
    assert model.cost(fused) == 2e-3
    assert model.lookups()["borrowed"] == 1 and model.lookups()["estimated"] == 0
    relu = OpConfig.of("conv2d", dict(params, activation="RELU"), [x, w], None, [False, True])
    p.add(relu, _entry(1e-3))  # the nearer sibling (same activation) wins
    assert ProfiledCost(p).cost(fused) == 1e-3
    other = OpConfig.of("conv2d", dict(params, activation="NONE"), [TensorType((1, 4, 9, 9)), w], None,
                        [False, True])
    assert ProfiledCost(p).cost(other) != 2e-3  # another shape is estimated, not borrowed


def test_weight_only_work_costs_nothing():
    p = Profile(_meta())
    model = ProfiledCost(p)
    t = TensorType((4, 4))
    assert model.cost(OpConfig.of("matmul", {}, [t, t], [t], [True, True])) == 0.0
    assert model.lookups()["measured"] + model.lookups()["estimated"] == 0
    assert model.cost(OpConfig.of("matmul", {}, [t, t], [t], [False, True])) > 0


def test_optimize_uses_the_named_profile(tmp_path):
    from taso_egg.product.optimize_graph import optimize

    g = zoo.nasrnn(steps=1, hidden=8)
    p = Profile(_meta())
    for c in graph_configurations(g):
        p.add(c, _entry(1e-4))
    path = tmp_path / "tiny.json"
    p.save(path)
    r = optimize(g, rules=ALL_RULES, options=OptimizeOptions().replace(profile=str(path), measure=0))
    assert str(path.stem) in r.cost_model or "test cpu" in r.cost_model
    lookups = r.stats.cost_lookups
    assert lookups["measured"] > 0 and lookups["estimated"] > 0   # rewrites bring new configurations
    assert optimize(g, options=OptimizeOptions().replace(profile="analytic", measure=0)).cost_model.startswith("analytic")


def test_shipped_profiles_load_and_cover_the_benchmark_graphs():
    from taso_egg.cost.store import profiles_dir

    for name in ("cpu-ort", "cpu-numpy"):
        assert (profiles_dir() / f"{name}.json").is_file(), f"the shipped profile {name} is missing"
        model = load_cost_model(name)
        graph_cost(zoo.nasrnn(), model)
        assert model.lookups()["estimated"] == 0 and model.lookups()["measured"] > 0


# --- CLI -------------------------------------------------------------------------------

def test_profile_cli_on_a_tiny_model(tmp_path, capsys):
    from taso_egg.cli import main

    out = tmp_path / "tiny.json"
    assert main(["profile", "nasrnn-small", "--backend", "numpy", "-o", str(out), "--quiet",
                 "--repeats", "1", "--warmups", "0", "--graph-only"]) == 0
    first = load_profile(out)
    g = zoo.nasrnn_small()
    assert set(first.entries) == {c.key for c in graph_configurations(g)}
    assert first.meta["models"] == ["nasrnn-small"] and first.meta["threads"] == {"blas": 1}
    # A second run merges: nothing is re-measured.
    assert main(["profile", "nasrnn-small", "--backend", "numpy", "-o", str(out), "--quiet",
                 "--repeats", "1", "--warmups", "0", "--graph-only"]) == 0
    assert "0 configurations measured" in capsys.readouterr().out
    assert load_profile(out).entries == first.entries
    # A profile from another back end is not merged into.
    assert main(["profile", "nasrnn-small", "--backend", "ort", "-o", str(out), "--quiet",
                 "--graph-only"]) == 1
    assert "cannot merge" in capsys.readouterr().err
    assert main(["profile", "no-such-model", "-o", str(out)]) == 1
    assert main(["profile", "nasrnn-small", "--device", "gpu", "--backend", "ort", "-o", str(out)]) == 1


def test_calibration_measures_again_when_a_timing_comes_out_zero():
    """A marginal timing of 0 s (few repeats, noisy machine) must not reach the
    division that turns it into a peak: measure again, else a clear error."""
    from types import SimpleNamespace

    from taso_egg.errors import ProfileError
    from taso_egg.profiling.profiler import calibrate

    class Flaky:
        device = "cpu"

        def __init__(self, zeros):
            self.zeros, self.calls = zeros, 0

        def measure(self, config, warmups, repeats):
            self.calls += 1
            return SimpleNamespace(seconds=0.0 if self.calls <= self.zeros else 1e-3)

        def run_overhead(self, warmups, repeats, tiny, tiny_cost):
            return 0.0

    cal = calibrate(Flaky(zeros=1), 0, 1)
    assert cal["peak_flops"] > 0 and cal["bandwidth"] > 0
    with pytest.raises(ProfileError, match="measured 0 s"):
        calibrate(Flaky(zeros=10), 0, 1)


def test_profile_cli_only_the_named_operators(tmp_path, capsys):
    from taso_egg.cli import main

    out = tmp_path / "relu.json"
    assert main(["profile", "nasrnn-small", "--backend", "numpy", "-o", str(out), "--quiet",
                 "--repeats", "1", "--warmups", "0", "--graph-only", "--ops", "relu", "tanh"]) == 0
    assert {e.split()[0] for e in load_profile(out).entries} == {"relu", "tanh"}
    assert main(["profile", "nasrnn-small", "--ops", "no_such_op", "-o", str(out)]) != 0
    assert "no_such_op" in capsys.readouterr().err


def test_bench_predicts_from_a_same_run_profile_too(capsys):
    from taso_egg.profiling import latency_bench as bench

    assert bench.main(["--models", "nasrnn-small", "--repeats", "1", "--skip-numpy", "--same-run",
                       "--min-gain", "0"]) == 0
    out = capsys.readouterr().out
    assert "same-run ms" in out
    rows = [line.split() for line in out.splitlines()
            if line.startswith("nasrnn-small ort") and "%" in line]
    assert [r[2] for r in rows] == ["original", "optimized"]
    assert all(len(r) >= 10 and float(r[-2]) > 0 for r in rows)   # same-run prediction, error


def test_shipped_profiles_price_what_the_runtime_runs():
    from taso_egg.product.optimize_graph import runtime_form
    from taso_egg.rules.corpus import load_corpus

    model = load_cost_model("cpu-ort")
    fused = runtime_form(zoo.resnet50(), load_corpus(), model)
    assert fused.op_counts()["conv2d_sum"] == 16      # every residual add, fused
    model.reset_counts()
    graph_cost(fused, model)
    assert model.lookups()["estimated"] == 0


def test_the_runtime_form_applies_the_rule_family_it_is_given():
    """Rule families are values: every declared fusion is a corpus rule (a renamed rule
    cannot drop out unseen), and runtime_form applies the family it is passed."""
    from taso_egg.product.optimize_graph import runtime_form
    from taso_egg.rules.corpus import FUSIONS, RuleFamily, load_corpus

    rules = load_corpus()
    assert FUSIONS.members <= {r.name for r in rules}
    model = load_cost_model("cpu-ort")
    sums = RuleFamily("sums", frozenset(n for n in FUSIONS.members if "-sum" in n))
    assert runtime_form(zoo.resnet50(), rules, model, fusions=sums).op_counts()["conv2d_sum"] == 16
    graph = zoo.resnet50()
    assert runtime_form(graph, rules, model, fusions=RuleFamily("none", frozenset())) is graph
