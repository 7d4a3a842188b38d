"""The generator's workers on Ray (rules/workers.py, ``--ray``): a small generation on a
local Ray instance of two workers writes the byte-identical corpus of a run in local
processes; a task's error arrives as itself; a missing ray or a bad address is one
error line. Ray starts once (about 10 s), for the tests of one class."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import sys

import pytest

from taso_egg.cli import main
from taso_egg.errors import RuleError
from taso_egg.generator.rules_command import split_texts
from taso_egg.generator.enumerate import LeafSpec, Menu, choice
from taso_egg.generator.pipeline import generate_rules
from taso_egg.rules import workers
from taso_egg.rules.corpus import load_rule_file


def _menu() -> Menu:
    """Size 2 over this gives ten proved rules in about a second: derivation batches,
    float checks and proofs all run in the workers."""
    leaves = (LeafSpec("x0", (2, 4), "activation", "x"), LeafSpec("x1", (2, 4), "activation", "x"),
              LeafSpec("w0", (4, 4), "weight", "w"))
    ops = (choice("ewadd"), choice("ewmul"), choice("relu"), choice("matmul", activation="NONE"),
           choice("transpose", perm=(1, 0)))
    return Menu("ray-test", leaves, ops)


# A proof record's seconds differ between any two runs, local or not.
SECONDS = re.compile(rb"\(seconds [0-9.e+-]+\)")


def _corpus() -> dict:
    """The bytes of the rule files ``rules generate`` would write, proof seconds masked."""
    rules, _ = generate_rules(2, _menu(), jobs=2)
    return {str(path): SECONDS.sub(b"(seconds _)", text.encode())
            for path, text in split_texts(rules, "gen.rules", "test").items()}


@pytest.fixture(scope="module")
def local_corpus():
    return _corpus()  # in local processes: before the Ray session of the class below


@pytest.fixture(scope="class")
def on_ray():
    """A local Ray instance of 2 CPUs for the tests of one class (stopped after them:
    the tests below this class see local processes again)."""
    if importlib.util.find_spec("ray") is None:  # fail, not skip: CI must run these
        pytest.fail("ray is not installed: bash scripts/install.sh installs the ray extra")
    with workers.ray_workers(workers.RAY_LOCAL, 2):
        yield


class TestOnRay:
    def test_generation_is_byte_identical_to_local_processes(self, local_corpus, on_ray, monkeypatch):
        maps = []
        imap = workers._RayPool.imap
        monkeypatch.setattr(workers._RayPool, "imap",
                            lambda self, fn, items, chunksize=1: maps.append(fn) or imap(self, fn, items, chunksize))
        on_ray_corpus = _corpus()
        # every kind of batch work went to Ray: derivation, float checks, proofs
        assert {fn.__name__ for fn in maps} == {"_batch", "_generalize", "_prove_in_worker"}
        assert on_ray_corpus == local_corpus
        assert local_corpus["gen.rules"].count(b"(rule ") >= 5

    def test_a_task_error_arrives_as_itself(self, on_ray):
        with workers.worker_pool(2) as pool:
            assert isinstance(pool, workers._RayPool)
            assert list(workers.map_in_order(pool, workers.check_jobs, list(range(1, 40)), 2)) == list(range(1, 40))
            with pytest.raises(RuleError, match=r"^jobs must be a positive integer, got 0$"):
                list(workers.map_in_order(pool, workers.check_jobs, [1, 2, 0, 3], 2))


    def test_verify_joins_a_running_instance_by_address(self, on_ray, tmp_path):
        """What a cluster's user does: ``--ray HOST:PORT`` from another process."""
        import ray

        rules = tmp_path / "two.rules"
        rules.write_text("(rule t-add :lhs (ewadd ?a ?b) :rhs (ewadd ?b ?a) :example ((?a [2 3]) (?b [2 3])))\n"
                         "(rule t-bad :lhs (ewadd ?a ?b) :rhs (ewmul ?b ?a) :example ((?a [2 3]) (?b [2 3])))\n")
        address = ray.get_runtime_context().gcs_address
        done = subprocess.run([sys.executable, "-m", "taso_egg.cli", "rules", "verify", str(rules), "--jobs", "2",
                               "--ray", address], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        statuses = [r.proof.status for r in load_rule_file(rules)]
        assert statuses == ["proved", "refuted"]


def _error_line(capsys, *argv) -> str:
    assert main(["rules", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no traceback
    return err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_that_does_not_answer_is_one_line(capsys, tmp_path):
    port = _closed_port()
    err = _error_line(capsys, "generate", "--size", "2", "-o", str(tmp_path / "g.rules"), "--jobs", "2",
                      "--ray", f"127.0.0.1:{port}")
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in err
    assert "give HOST:PORT" in _error_line(capsys, "verify", str(tmp_path / "g.rules"), "--jobs", "2",
                                           "--ray", "nowhere")
    assert not (tmp_path / "g.rules").exists()


def test_ray_missing_or_one_job_is_one_line(capsys, tmp_path, monkeypatch):
    assert "--jobs 1" in _error_line(capsys, "verify", str(tmp_path / "g.rules"), "--jobs", "1",
                                     "--ray", "local")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert "pip install 'taso-egg[ray]'" in _error_line(capsys, "verify", str(tmp_path / "g.rules"),
                                                        "--jobs", "2", "--ray", "local")
