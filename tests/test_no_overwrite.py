"""Commands write where their ``--help`` says, in the working directory by default, and
never over the package's own files (the shipped rule corpus and cost profiles) unless
the user names those files as the output."""

import hashlib
import shutil
from pathlib import Path

import pytest

import taso_egg.rules
from taso_egg.cli import main
from taso_egg.cost.store import load_profile, profiles_dir
from taso_egg.rules.corpus import load_rule_file, uses_generated_constant

RULES_DIR = Path(taso_egg.rules.__file__).parent
PACKAGE_DATA_DIRS = (RULES_DIR, profiles_dir())


def _data_files() -> dict[Path, bytes]:
    return {p: p.read_bytes() for d in PACKAGE_DATA_DIRS for p in sorted(d.iterdir())
            if p.is_file() and p.suffix in (".rules", ".json")}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


@pytest.fixture
def shipped_files_unchanged():
    """Fails the test if it changed, added or removed a rule file or profile of the
    package, and puts the old bytes back (a failing test must not break the corpus
    for everyone else)."""
    before = _data_files()
    yield before
    after = _data_files()
    changed = sorted(str(p) for p in before.keys() | after.keys()
                     if _digest(before.get(p, b"")) != _digest(after.get(p, b"")))
    for p in after.keys() - before.keys():
        p.unlink()
    for p, data in before.items():
        if after.get(p) != data:
            p.write_bytes(data)
    assert not changed, f"the command changed the package's own files: {changed}"


def _help(capsys, *command) -> str:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps the lines


# --- rules generate --------------------------------------------------------------------

def test_rules_generate_writes_to_the_working_directory(tmp_path, monkeypatch, capsys,
                                                        shipped_files_unchanged):
    monkeypatch.chdir(tmp_path)
    assert main(["rules", "generate", "--size", "1", "--jobs", "1", "--rlimit", "2000000"]) == 0
    # the split the generator writes: rules over a generated constant go to the study file
    default = load_rule_file(tmp_path / "generated.rules")
    constants = load_rule_file(tmp_path / "generated-constants.rules")
    assert constants and all(uses_generated_constant(r.lhs) for r in constants)
    assert not any(uses_generated_constant(r.lhs) for r in default)
    assert (tmp_path / "generated.stats.json").is_file()
    assert "./generated.rules" in _help(capsys, "rules", "generate")


def test_rules_generate_will_not_default_onto_the_shipped_corpus(monkeypatch, capsys,
                                                                 shipped_files_unchanged):
    monkeypatch.chdir(RULES_DIR)  # ./generated.rules is the shipped corpus here
    assert main(["rules", "generate", "--size", "1", "--jobs", "1", "--rlimit", "2000000"]) == 1
    assert "-o" in capsys.readouterr().err


# --- rules verify ----------------------------------------------------------------------

@pytest.fixture
def quick_prover(monkeypatch):
    """Every rule 'unknown' at once: where the records are written is under test, not
    the prover (the corpus would take minutes)."""
    from taso_egg.rules.prove import driver
    from taso_egg.rules.prove.prover import ProofResult

    def verify_rules(rules, timeout_s=10.0, progress=None, jobs=1, **kwargs):
        results = [ProofResult(r.name, "unknown", 0.0, (), "stub prover") for r in rules]
        for i, res in enumerate(results):
            if progress:
                progress(i, len(results), res)
        return results

    monkeypatch.setattr(driver, "verify_rules", verify_rules)


def test_rules_verify_needs_the_files_named(tmp_path, monkeypatch, capsys, quick_prover,
                                            shipped_files_unchanged):
    monkeypatch.chdir(tmp_path)
    assert main(["rules", "verify", "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert "name the rule files" in err and "generated.rules" in err
    assert list(tmp_path.iterdir()) == []


def test_rules_verify_writes_into_the_named_file_only(tmp_path, monkeypatch, capsys, quick_prover,
                                                      shipped_files_unchanged):
    monkeypatch.chdir(tmp_path)
    shutil.copy(RULES_DIR / "taso_hand.rules", tmp_path)
    assert main(["rules", "verify", "taso_hand.rules", "--jobs", "1"]) == 0
    rules = load_rule_file(tmp_path / "taso_hand.rules")
    assert rules and all(r.proof.status == "unknown" for r in rules)
    assert "written back into them" in _help(capsys, "rules", "verify")


# --- profile ---------------------------------------------------------------------------

TINY_PROFILE = ["profile", "nasrnn-small", "--backend", "numpy", "--repeats", "1", "--warmups", "0",
                "--graph-only", "--quiet"]


def test_profile_writes_to_the_working_directory(tmp_path, monkeypatch, capsys,
                                                 shipped_files_unchanged):
    monkeypatch.chdir(tmp_path)
    assert main(TINY_PROFILE) == 0
    profile = load_profile(tmp_path / "cpu-numpy.json")
    assert profile.meta["backend"] == "numpy" and profile.entries
    assert "wrote cpu-numpy.json" in capsys.readouterr().out
    assert "./<device>-<backend>.json" in _help(capsys, "profile")


def test_profile_will_not_default_onto_a_shipped_profile(monkeypatch, capsys, shipped_files_unchanged):
    assert (profiles_dir() / "cpu-numpy.json").is_file()
    monkeypatch.chdir(profiles_dir())  # ./cpu-numpy.json is the shipped profile here
    assert main(TINY_PROFILE) == 1
    assert "-o" in capsys.readouterr().err
