"""The GPU run's CPU side (issue 20): the configuration list, the device bundle's
round trip, and scripts/gpu_run.sh end to end with NumPy standing in for CuPy, in a
process where egglog, Z3 and HiGHS cannot be imported (as on the device machine).
No test asserts a timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from taso_egg.research import zoo
from taso_egg.cost import AnalyticCost, ProfiledCost, graph_cost
from taso_egg.cost.store import load_profile
from taso_egg.errors import ProfileError
from taso_egg.profiling import gpu_run
from taso_egg.profiling.bundle import (
    STAGES,
    cost_inputs,
    graph_from_json,
    graph_to_json,
    load_bundle,
    predict,
    read_configs,
)
from taso_egg.profiling.prepare import build_bundle, staged_configurations
from taso_egg.profiling.profiler import graph_configurations, profile_configurations
from taso_egg.product.timing import exported_graph

ROOT = Path(__file__).resolve().parent.parent
MODEL = "squeezenet-small"   # optimized under the analytic GPU model: original != optimized
DRY = ["--xp", "numpy", "--calibration-sizes", "32", "1024", "--warmups", "1", "--repeats", "2",
       "--runs", "2"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    build_bundle([MODEL], out, log=lambda *a: None)
    return out


def _blocker(folder: Path) -> Path:
    """A sitecustomize that makes importing egglog, z3 or highspy fail."""
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(textwrap.dedent("""\
        import importlib.abc, sys

        class _Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("egglog", "z3", "highspy"):
                    raise ImportError(f"{name} is not installed on the device machine")

        sys.meta_path.insert(0, _Block())
        """))
    return folder


def test_list_configs_holds_the_graph_the_egraph_and_the_calibration(tmp_path):
    from taso_egg.cli import main
    from taso_egg.egraph.saturate import saturate
    from taso_egg.profiling.profiler import saturation_configurations

    path = tmp_path / "configs.json"
    assert main(["profile", MODEL, "--device", "gpu", "--list-configs", str(path)]) == 0
    data = json.loads(path.read_text())
    configs = read_configs(data)  # every entry reads back as its key
    keys = {c.key for c, _ in configs}
    stages = [e["stage"] for _, e in configs]
    assert stages == sorted(stages, key=STAGES.index) and stages[:3] == ["calibration"] * 3
    assert data["meta"]["counts"]["calibration"] == 3 and data["meta"]["models"] == [MODEL]
    g = zoo.MODELS[MODEL]()
    assert {c.key for c in graph_configurations(exported_graph(g))} <= keys
    assert {c.key for c in graph_configurations(g)} <= keys
    assert {c.key for c in saturation_configurations(saturate(g))} <= keys
    assert all(e["models"] == [MODEL] for _, e in configs if e["stage"] != "calibration")
    assert not (tmp_path / "gpu-cupy.json").exists()  # nothing timed, no profile written


def test_staged_configurations_keep_the_earliest_stage():
    from taso_egg.profiling.bundle import config_list

    g = zoo.MODELS["nasrnn-small"]()
    pairs = staged_configurations(g, None, {}, [g])
    data = config_list({"m": pairs + pairs}, {})
    assert {e["stage"] for e in data["configs"]} == {"run"}  # "graphs" duplicates fold into "run"
    assert len(data["configs"]) == len(graph_configurations(g))


@pytest.mark.parametrize("name", ["bert-small", "nasnet-a-small", "inception-v3-small", "resnext50-small"])
def test_graph_json_round_trip(name):
    g = zoo.MODELS[name]()
    for graph in (g, exported_graph(g)):
        back = graph_from_json(json.loads(json.dumps(graph_to_json(graph))))
        assert back.structural_hash() == graph.structural_hash()
        assert back.op_counts() == graph.op_counts()
        assert cost_inputs(back) == cost_inputs(graph)


def test_cost_inputs_predict_what_graph_cost_says(bundle):
    _, graphs = load_bundle(bundle)
    configs, _ = load_bundle(bundle)
    by_key = {c.key: c for c, _ in read_configs(configs)}
    profile = load_profile(ROOT / "profiles" / "cpu-numpy.json")
    for model in (AnalyticCost(), ProfiledCost(profile)):
        for which in ("original", "optimized"):
            entry = graphs["models"][MODEL][which]
            g = graph_from_json(entry["graph"])
            predicted, _ = predict(entry["cost_inputs"], by_key, model)
            assert predicted == pytest.approx(graph_cost(g, model), rel=1e-12)


def test_bundle_round_trip(bundle):
    configs, graphs = load_bundle(bundle)
    entry = graphs["models"][MODEL]
    original = exported_graph(zoo.MODELS[MODEL]())
    assert graph_from_json(entry["original"]["graph"]).structural_hash() == original.structural_hash()
    optimized = graph_from_json(entry["optimized"]["graph"])
    assert not entry["unchanged"] and optimized.structural_hash() != original.structural_hash()
    keys = {e["key"] for e in configs["configs"]}
    for which in ("original", "optimized"):  # everything a prediction sums is in the list
        assert {k for k, _ in entry[which]["cost_inputs"]} <= keys
    # optimize checked the result it returned (in onnxruntime or in our executor)
    assert entry["check_error"] is not None or entry["ort_check_error"] is not None
    # the bundle carries no weight data
    assert "weight_data" not in json.dumps(graphs) and (bundle / "graphs.json").stat().st_size < 1e6


def test_gpu_run_dry_run_without_egglog_z3_highspy(bundle, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "TASO_EGG_BUNDLE": str(bundle), "PYTHON": sys.executable,
           "PYTHONPATH": str(_blocker(tmp_path / "block"))}
    blocked = subprocess.run([sys.executable, "-c", "import highspy"], env=env, capture_output=True)
    assert blocked.returncode != 0  # the blocker works
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), *DRY], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # the package staged as pyproject.toml maps it ran, not the tree's own folder
    assert "taso_egg from " in done.stdout and f"taso_egg from {ROOT}" not in done.stdout
    profile = load_profile(out / "gpu-stand-in.json")  # the profile format, validated
    assert "standing in" in profile.meta["device_name"] and "partial" not in profile.meta
    assert profile.meta["kernels"]["conv2d"].startswith("im2col")
    configs, _ = load_bundle(bundle)
    listed = {e["key"] for e in configs["configs"] if e["stage"] != "calibration"}
    assert set(profile.entries) == listed
    assert all(e["mean_s"] is not None and e["seconds"] >= 0 for e in profile.entries.values())
    compare = json.loads((out / "gpu-compare.json").read_text())
    row = compare["models"][MODEL]
    for which in ("original", "optimized"):
        assert row["measured_s"][which] > 0 and row["predicted_s"][which] > 0
        assert row["measured"][which]["runs"] == 2
        assert row["lookups"][which]["estimated"] == 0  # every configuration was profiled
    table = (out / "gpu-compare.txt").read_text()
    assert "meas orig" in table and MODEL in table and "PARTIAL" not in table
    log = (out / "gpu-run.log").read_text()
    assert table.splitlines()[1] in log and "wrote " in log  # the script tees the run's output


def test_gpu_run_stops_at_its_budget_and_says_partial(bundle, tmp_path):
    assert gpu_run.main(["--bundle", str(bundle), "--out", str(tmp_path), *DRY, "--budget", "0.001",
                         "--reserve", "0"]) == 0
    profile = load_profile(tmp_path / "gpu-stand-in.json")
    assert "not profiled (deadline)" in profile.meta["partial"] and not profile.entries
    compare = json.loads((tmp_path / "gpu-compare.json").read_text())
    assert "skipped" in compare["models"][MODEL] and compare["meta"]["partial"]
    assert "PARTIAL" in (tmp_path / "gpu-compare.txt").read_text()


def test_profile_configurations_deadline():
    from taso_egg.profiling.backends import make_backend
    from taso_egg.profiling.profiler import new_profile

    b = make_backend("numpy")
    profile = new_profile(b, 1, 1, calibration_sizes=(16, 64))
    configs = graph_configurations(zoo.MODELS["nasrnn-small"]())
    run = profile_configurations(configs, b, profile, 1, 1, progress=False, deadline=0.0)
    assert run.skipped == len(configs) and run.measured == 0 and not profile.entries


def test_missing_bundle_is_one_clear_error(tmp_path, capsys):
    assert gpu_run.main(["--bundle", str(tmp_path / "none"), "--out", str(tmp_path), *DRY]) == 1
    assert "no such file" in capsys.readouterr().err
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh")], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path), "TASO_EGG_BUNDLE": str(tmp_path / "none")})
    assert done.returncode == 2 and "gpu_prepare.sh" in done.stderr
    with pytest.raises(ProfileError, match="not a bundled graph"):
        graph_from_json({"nodes": [{"op": "relu"}]})


def test_profile_name():
    assert gpu_run.profile_name("NVIDIA H200") == "gpu-h200"
    assert gpu_run.profile_name("NVIDIA H100 80GB HBM3") == "gpu-h100-80gb-hbm3"
    assert gpu_run.profile_name("numpy standing in for CuPy") == "gpu-stand-in"
