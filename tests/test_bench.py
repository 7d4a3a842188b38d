"""The optimization benchmark's tables (python -m taso_egg.research.benchmarks): rows for zoo models
and for a folder of ONNX files; figures are this run's, so only their form is checked."""

from __future__ import annotations

import onnx

from taso_egg.research import benchmarks as bench

from conftest import cluttered_conv_model


def _rows(text: str, first: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.startswith(first)]


def test_zoo_row_has_phases_memory_and_tensat_ratio(capsys):
    assert bench.main(["--models", "squeezenet-small", "--bert-layers", "1", "--extractors", "greedy-dag"]) == 0
    out = capsys.readouterr().out
    assert "tensat s" in out.splitlines()[0] and "RSS MB" in out.splitlines()[0]
    (row,) = _rows(out, "squeezenet-small")
    assert row[2] == "default" and int(row[3]) > 100  # the rules optimize loads
    nodes, enodes = int(row[4]), int(row[5])
    load, sat, ext, check, total = map(float, row[7:12])
    assert enodes >= nodes > 0
    assert total >= sat + ext + check - 0.05 and load > 0
    assert row[12] == "-" and row[13] == "-"  # Tensat published no -small figures
    assert float(row[14]) > 50  # a Python process with egglog and numpy loaded
    sat_ext_cpu, cpu = float(row[18]), float(row[19])  # CPU seconds: saturation + extraction, optimize
    assert 0 < sat_ext_cpu <= cpu + 0.01
    (layer,) = _rows(out, "bert-L1")
    assert int(layer[4]) < 40  # one layer of TASO's BERT, not eight


def test_zoo_rows_per_corpus(tmp_path, capsys):
    from taso_egg.rules.corpus import load_corpus

    one = tmp_path / "one.rules"
    one.write_text(next(r for r in load_corpus(["generated"]) if not r.multi).to_text())
    assert bench.main(["--models", "squeezenet-small", "--extractors", "greedy-dag",
                       "--corpora", "hand", str(one), "default"]) == 0
    rows = _rows(capsys.readouterr().out, "squeezenet-small")
    hand = len(load_corpus(["taso_hand"]))
    assert [(r[2], int(r[3])) for r in rows] == [("hand", hand), ("one.rules", hand + 1),
                                                 ("default", len(load_corpus()))]


def test_onnx_folder_table(tmp_path, capsys):
    onnx.save(cluttered_conv_model(), tmp_path / "conv.onnx")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    assert bench.main(["--onnx", str(tmp_path), "--measure", "10", "--extractors", "greedy-dag"]) == 0
    out = capsys.readouterr().out
    (broken,) = _rows(out, "broken.onnx")
    assert "failed:" in broken
    (row,) = _rows(out, "conv.onnx")
    assert row[1] == "default" and row[2] == "9"  # the corpus; the file's nodes, clutter included
    row = row[1:]
    assert row[2] == "0" and row[4].endswith("x")  # nothing opaque; the predicted speedup
    assert row[5] == "-" or row[5].endswith("x")  # the re-export's predicted speedup
    assert row[-1] in ("original", "re-export", "result")
    phases = [float(s) for s in row[-2].split("/")]  # seconds per phase, each rounded to 0.1 s
    assert len(phases) == 7 and all(s >= 0 for s in phases)
    assert sum(phases) <= float(row[3]) * 1.01 + 0.05 * (len(phases) + 1)
    if row[6] in ("-", "untimed"):  # computes what the input does, or not timed: no error
        assert row[7] == "-"
    else:  # the prediction's error against the guard's measured speedup of the result
        predicted, measured = float(row[4].rstrip("x")), _cell(row[6])[0]
        assert abs(float(row[7].rstrip("%")) - 100 * (predicted / measured - 1)) < 0.06
    if row[-1] == "original":  # the written file is the original: nothing to time against it
        assert row[8] == row[9] == "same" and row[10] == "-"
    else:
        for cell in row[8:10]:
            ratio, low, high = _cell(cell)
            assert 0 < low <= ratio <= high
        assert float(row[10]) >= 0


def _cell(cell: str) -> tuple[float, float, float]:
    """1.031x(1.012-1.049): the ratio and its interval."""
    return tuple(map(float, cell.rstrip(")").replace("x(", "-").split("-")))


def test_kernel_shares_name_the_operators_the_runtime_runs(tmp_path, capsys):
    onnx.save(cluttered_conv_model(), tmp_path / "conv.onnx")
    assert bench.main(["--onnx", str(tmp_path), "--measure", "10", "--extractors", "greedy-dag",
                       "--kernel-shares"]) == 0
    (line,) = [s for s in capsys.readouterr().out.splitlines() if "kernel time" in s]
    shares = {item.rsplit(" ", 2)[0].strip(): float(item.rsplit(" ", 2)[1])
              for item in line.split(": ", 1)[1].split(", ")}
    assert any("Conv" in op for op in shares)  # onnxruntime's own name for what it runs
    assert abs(sum(shares.values()) - 100) < 0.5


def test_onnx_folder_without_models(tmp_path, capsys):
    assert bench.main(["--onnx", str(tmp_path)]) == 2
    assert "no *.onnx files" in capsys.readouterr().err


def test_the_peers_measurement_gives_every_candidate_a_finite_interval(monkeypatch):
    """Six candidates timed for the fewest rounds (rounds as slow as a transformer's,
    next to the guard's time budget): one look, the level split over the candidates
    only, so every interval is finite and holds the true ratio."""
    import itertools
    import time

    from taso_egg.product import guard
    from taso_egg.research.benchmarks import _measured
    from taso_egg.options import MIN_ROUNDS

    names = ["original", "a", "b", "c", "d", "e"]
    noise = itertools.cycle([1.0, 1.01, 0.99, 1.02, 0.98, 1.005, 0.995])

    def slow_round(timed=None):
        time.sleep(0.02)
        return {n: (100.0 if n == "original" else 90.0) * next(noise) for n in names}

    monkeypatch.setattr(guard, "TIME_BUDGET", 0.03)  # a round takes most of the budget
    monkeypatch.setattr(guard, "MAX_TIME_BUDGET", 0.03)  # and it is not stretched
    for c in _measured(slow_round, names, 200).values():
        assert c.rounds == MIN_ROUNDS and 0 < c.low <= 100 / 90 <= c.high < float("inf")
