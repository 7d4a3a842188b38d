"""The comparison runner and the pictures: small models, few repeats; structure and
consistency are asserted, never timings."""

from __future__ import annotations

import csv
import json
import math

import matplotlib
import pytest

matplotlib.use("Agg")

from taso_egg.research import zoo  # noqa: E402
from taso_egg.check.whole_graph import check_graphs_equivalent  # noqa: E402
from taso_egg.cli import main  # noqa: E402
from taso_egg.research.compare import METHODS, compare_model, format_table, save  # noqa: E402
from taso_egg.cost import AnalyticCost, graph_cost  # noqa: E402
from taso_egg.errors import TasoEggError  # noqa: E402

COST = AnalyticCost()


@pytest.fixture(scope="module")
def nasrnn_result():
    return compare_model("nasrnn-small", zoo.nasrnn_small(steps=1), COST, budget=8, ilp_seconds=10,
                         measure_repeats=1)


def test_every_method_returns_a_checked_graph_no_worse_than_the_input(nasrnn_result):
    r = nasrnn_result
    g = zoo.nasrnn_small(steps=1)
    assert set(r.runs) == set(METHODS)
    assert r.original_cost == pytest.approx(graph_cost(g, COST))
    for run in r.runs.values():
        assert run.cost == pytest.approx(graph_cost(run.graph, COST))
        assert run.cost <= r.original_cost + 1e-15
        assert run.seconds > 0
        check_graphs_equivalent(g, run.graph, seed=3)
    assert r.runs["backtracking"].explored <= 8
    assert r.runs["eqsat-ilp"].cost <= r.runs["eqsat-greedy"].cost + 1e-15
    assert r.runs["eqsat-ilp"].cost < r.original_cost  # the step's matmul pairs merge


def test_measurements_cover_every_graph_and_runtime(nasrnn_result):
    r = nasrnn_result
    assert set(r.measured_ms) == {"ort", "executor"}
    for times in r.measured_ms.values():
        assert set(times) == {"original", *METHODS}
        assert all(ms > 0 for ms in times.values())
    for m in METHODS:
        assert r.speedup("ort", m) == pytest.approx(r.measured_ms["ort"]["original"] / r.measured_ms["ort"][m])
    assert math.isnan(r.speedup("gpu", "eqsat-ilp"))


def test_saved_table_json_and_picture_agree(nasrnn_result, tmp_path):
    paths = save([nasrnn_result], tmp_path, {"note": "test"})
    assert [p.name for p in paths] == ["compare.csv", "compare.json", "compare.png"]
    rows = list(csv.DictReader(open(paths[0])))
    assert len(rows) == 1 and rows[0]["model"] == "nasrnn-small"
    assert float(rows[0]["eqsat-ilp_cost_ms"]) == pytest.approx(nasrnn_result.runs["eqsat-ilp"].cost * 1e3)
    data = json.loads(paths[1].read_text())
    assert data["meta"] == {"note": "test"}
    assert data["models"][0]["runs"]["backtracking"]["explored"] == nasrnn_result.runs["backtracking"].explored
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = format_table([nasrnn_result])
    assert "nasrnn-small" in text and "ORT x" in text


def test_compare_cli_rejects_an_unknown_model(capsys):
    assert main(["compare", "no-such-model", "--repeats", "0", "--profile", "analytic"]) == 1
    assert "no-such-model" in capsys.readouterr().err


def test_compare_cli_runs_a_small_model(tmp_path, capsys):
    assert main(["compare", "bert-small", "--budget", "3", "--repeats", "0", "--profile", "analytic",
                 "--ilp-seconds", "5", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bert-small" in out and (tmp_path / "compare.json").exists()


def test_draw_egraph_refuses_a_huge_egraph():
    from taso_egg.egraph.saturate import saturate
    from taso_egg.research.viz import draw_egraph

    eg = saturate(zoo.nasrnn_small(steps=1)).tensor_egraph()
    with pytest.raises(TasoEggError, match="e-nodes"):
        draw_egraph(eg, max_nodes=10)


def test_draw_graph_draws_every_runtime_operator_once():
    import matplotlib.pyplot as plt

    from taso_egg.research.viz import draw_graph

    g = zoo.bert_small(layers=1)
    ax = draw_graph(g, hide_weights=True)
    labels = [t for t in ax.texts if t.get_text()]  # arrows are empty annotations
    runtime = len(g.nodes) - len(g.weight_only_nodes())
    assert len(labels) == runtime
    plt.close("all")


def test_executor_times_the_deployed_graphs(monkeypatch):
    """Weight-only work is folded at export; timing the raw graph would charge the
    executor for it, so measure() times what export_onnx deploys."""
    from taso_egg.product import timing

    seen = []
    real = timing.exported_graph
    monkeypatch.setattr(timing, "exported_graph", lambda g: seen.append(g) or real(g))
    g = zoo.nasrnn_small(steps=1)
    times = timing.measure(g, {"same": g}, repeats=1, runtimes=("executor",))
    assert set(times["executor"]) == {"original", "same"} and len(seen) == 2
