"""The corpus is parsed once and cached across processes (taso_egg.disk.cache): a hit gives
the rules a parse gives, and a damaged, stale, disabled or unwritable cache falls back
to parsing, silently and correctly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taso_egg.disk import cache
from taso_egg.research import zoo
from taso_egg.rules import corpus

RULES = """
(rule a :lhs (relu (relu ?x)) :rhs (relu ?x) :example ((?x [2 3])) :proof ((status proved)))
(rule b :lhs (ewadd ?x ?y) :rhs (ewadd ?y ?x) :if ((= (shape ?x) (shape ?y)))
  :example ((?x [2 3]) (?y [2 3])) :proof ((status proved)))
"""


@pytest.fixture
def parses(tmp_path, monkeypatch):
    """A private cache folder, no rules parsed in this process yet, and a count of the
    files parsed (each load after the first in a process is then a cache read)."""
    monkeypatch.setenv("TASO_EGG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TASO_EGG_NO_CACHE", raising=False)
    monkeypatch.setattr(corpus, "_PARSED", {})
    calls = []
    real = corpus.parse_rules

    def counting(text, filename="<string>"):
        calls.append(filename)
        return real(text, filename)

    monkeypatch.setattr(corpus, "parse_rules", counting)
    return calls


def _fresh_process(monkeypatch):
    monkeypatch.setattr(corpus, "_PARSED", {})


def _entries(tmp_path):
    return sorted((tmp_path / "cache" / "rules").glob("*.pickle"))


@pytest.fixture
def small_corpus(tmp_path, monkeypatch):
    path = tmp_path / "c.rules"
    path.write_text(RULES)
    monkeypatch.setattr(corpus, "corpus_files", lambda: [path])
    return path


def test_a_hit_gives_the_parsed_rules(parses, tmp_path, monkeypatch):
    parsed = corpus.load_corpus()  # the shipped files but the study one (for time)
    files = len(parses)
    assert files >= 2 and len(_entries(tmp_path)) == files
    _fresh_process(monkeypatch)
    cached = corpus.load_corpus()
    assert len(parses) == files  # nothing parsed again
    assert cached == parsed and [r.source for r in cached] == [r.source for r in parsed]
    assert [r.to_text() for r in cached] == [r.to_text() for r in parsed]


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate", "garbage", "empty",
                                    "valid entry of the wrong type"])
def test_a_damaged_entry_is_ignored_and_the_file_parsed_again(parses, small_corpus, tmp_path,
                                                              monkeypatch, damage):
    parsed = corpus.load_corpus()
    (entry,) = _entries(tmp_path)
    data = entry.read_bytes()
    if damage == "flip a payload byte":
        i = len(data) - 10
        entry.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])
    elif damage == "truncate":
        entry.write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"\x80\x04not a pickle at all")
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a well-formed entry that holds no rules (its checksum is right)
        cache.store("rules", entry.stem, ("not", "rules"))
    _fresh_process(monkeypatch)
    assert corpus.load_corpus() == parsed
    assert len(parses) == 2
    # and the entry is whole again
    _fresh_process(monkeypatch)
    assert corpus.load_corpus() == parsed and len(parses) == 2


def test_a_changed_rule_file_is_parsed_again(parses, small_corpus, monkeypatch):
    assert [r.name for r in corpus.load_corpus()] == ["a", "b"]
    small_corpus.write_text(RULES.replace("(rule b ", "(rule c "))
    _fresh_process(monkeypatch)
    assert [r.name for r in corpus.load_corpus()] == ["a", "c"]
    assert len(parses) == 2
    small_corpus.write_text(RULES)  # back to the first text: its entry is still there
    _fresh_process(monkeypatch)
    assert [r.name for r in corpus.load_corpus()] == ["a", "b"] and len(parses) == 2


def test_a_changed_reader_is_a_miss(parses, small_corpus, monkeypatch):
    corpus.load_corpus()
    _fresh_process(monkeypatch)
    monkeypatch.setattr(corpus, "_reader_digest", lambda: "another reader")
    corpus.load_corpus()
    assert len(parses) == 2


def test_the_reader_digest_follows_the_operator_table_source(tmp_path):
    a, b = tmp_path / "base.py", tmp_path / "nn.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    before = cache.source_digest([a, b])
    assert cache.source_digest([b, a]) == before
    b.write_text("y = 3\n")
    assert cache.source_digest([a, b]) != before
    import taso_egg.ops

    sources = {p.name for p in Path(taso_egg.ops.__file__).parent.glob("*.py")}
    assert {"base.py", "nn.py", "leaves.py"} <= sources  # what _reader_digest hashes


def test_the_cache_can_be_turned_off(parses, small_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("TASO_EGG_NO_CACHE", "1")
    parsed = corpus.load_corpus()
    assert not (tmp_path / "cache").exists()
    _fresh_process(monkeypatch)
    assert corpus.load_corpus() == parsed and len(parses) == 2


def test_an_unwritable_cache_folder_is_silently_skipped(parses, small_corpus, tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("TASO_EGG_CACHE_DIR", str(blocker / "cache"))  # under a file: no folder
    parsed = corpus.load_corpus()
    _fresh_process(monkeypatch)
    assert corpus.load_corpus() == parsed and len(parses) == 2
    assert blocker.read_text() == ""


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TASO_EGG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.folder() == tmp_path / "taso-egg"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, as the XDG spec says
    assert cache.folder() == Path.home() / ".cache" / "taso-egg"
    monkeypatch.setenv("TASO_EGG_CACHE_DIR", str(tmp_path / "here"))
    assert cache.folder() == tmp_path / "here"


def test_entries_are_pruned_to_the_last_used(monkeypatch, tmp_path):
    monkeypatch.setenv("TASO_EGG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "KEEP", 3)
    for i in range(4):
        cache.store("kind", f"k{i}", i)
        os.utime(tmp_path / "kind" / f"k{i}.pickle", (i, i))  # distinct times, oldest first
    assert cache.load("kind", "k1") == 1  # read: now the last used
    cache.store("kind", "k4", 4)
    kept = sorted(p.stem for p in (tmp_path / "kind").glob("*.pickle"))
    assert kept == ["k1", "k3", "k4"] and cache.load("kind", "k4") == 4


def test_study_rules_still_match_a_graph_built_with_a_constant():
    from taso_egg.egraph.saturate import saturate
    from taso_egg.graph import Graph

    g = Graph()
    x = g.new_input((3, 5), name="x")  # not the generator's 2x4: a constant's shape is a parameter
    g.mark_output(g.relu(g.mul(x, g.constant("one", (3, 5)))), "y")
    study = corpus.load_corpus(["generated-constants"])
    sat = saturate(g, rules=study, count_classes=False)
    assert any(n for it in sat.iterations for n in it.matches.values())


def test_no_zoo_model_holds_a_generated_constant():
    for name, build in zoo.MODELS.items():
        if name.endswith("-small"):
            assert not {n.op for n in build().nodes.values()} & corpus.GENERATED_CONSTANTS, name
