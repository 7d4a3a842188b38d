"""One home for every default: every command's options that ``taso_egg.options``
declares are built from its dataclasses (so their defaults are the dataclasses'), and
no command declares such an option of its own with another default; the library's
functions take the same defaults."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from taso_egg import options as opts


def _option_classes():
    return [c for c in vars(opts).values()
            if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == opts.__name__]


def _flags() -> dict[str, tuple]:
    """Canonical flag -> (options class, field name)."""
    return {f.metadata["flag"]: (c, f.name) for c in _option_classes() for f in dataclasses.fields(c)
            if "flag" in f.metadata}


def _parsers():
    """(name, parser) for the taso-egg command and each of its subcommands (nested
    ones too) and the benchmarks' commands."""
    from taso_egg.research import benchmarks as bench
    from taso_egg.cli import build_parser
    from taso_egg.extract import gym_bench as extract_bench
    from taso_egg.profiling import latency_bench as profiling_bench

    out = []

    def walk(name, parser):
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(f"{name} {sub}", p)

    walk("taso-egg", build_parser())
    for module in (bench, extract_bench, profiling_bench):
        out.append((module.__name__, module.build_parser()))
    return out


# A command whose option shares a canonical flag but means something else there.
OTHER_MEANINGS = {("taso-egg search", "--time-limit"): "the backtracking search's own seconds",
                  ("taso-egg rules generate", "--seed"): "the fingerprints' random draw"}

PARSERS = _parsers()


@pytest.mark.parametrize("name,parser", PARSERS, ids=[n for n, _ in PARSERS])
def test_every_commands_shared_options_come_from_the_dataclasses(name, parser):
    flags = _flags()
    for action in parser._actions:
        tagged = getattr(action, "option_field", None)
        if tagged is not None:
            cls, field_name = tagged
            assert action.default == getattr(cls, field_name), (name, action.option_strings)
            continue
        for flag in action.option_strings:
            if flag in flags and (name, flag) not in OTHER_MEANINGS:
                pytest.fail(f"{name}: {flag} is declared by hand, not from {flags[flag][0].__name__}."
                            f"{flags[flag][1]}")


def test_the_command_parses_to_the_librarys_default_options():
    from taso_egg.cli import build_parser
    from taso_egg.cli_args import optimize_options_from_args

    args = build_parser().parse_args(["optimize", "m.onnx", "-o", "o.onnx"])
    assert optimize_options_from_args(args) == opts.OptimizeOptions()
    args = build_parser().parse_args(["optimize", "m.onnx", "-o", "o.onnx", "--measure", "0",
                                      "--extractor", "greedy-dag", "--node-limit", "500"])
    assert optimize_options_from_args(args) == opts.OptimizeOptions().replace(
        measure=0, extractor="greedy-dag", limits=opts.Limits(nodes=500))


def test_the_librarys_functions_take_the_same_defaults():
    from taso_egg.product import optimize_graph as api
    from taso_egg.research import compare
    from taso_egg.extract import registry
    from taso_egg.research.search import search

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    assert default(api.extract_graph, "extractor") == opts.ExtractionOptions.extractor
    assert default(registry.extract, "extractor") == opts.ExtractionOptions.extractor
    assert default(search.backtracking_search, "budget") == opts.SearchOptions.budget
    assert default(search.backtracking_search, "alpha") == opts.SearchOptions.alpha
    assert default(search.backtracking_search, "profile") == opts.DEFAULT_PROFILE
    assert default(compare.compare_model, "ilp_seconds") == opts.ExtractionOptions.time_limit
    assert inspect.signature(api.optimize).parameters["options"].default is None  # OptimizeOptions()
    assert len(inspect.signature(api.optimize).parameters) <= 6


def test_the_extractor_names_are_the_registrys():
    from taso_egg.extract import EXTRACTORS

    assert tuple(EXTRACTORS) == opts.EXTRACTOR_NAMES
    assert set(opts.DAG_EXTRACTORS) <= set(EXTRACTORS)


@pytest.mark.parametrize("bad,match", [
    ({"min_gain": 1.0}, "min_gain"), ({"measure": -1}, "measure"), ({"measure": 501}, "measure"), ({"measure": 5}, "cannot confirm a gain"),
    ({"extractor": "foo"}, "unknown extractor"), ({"time_limit": 0}, "time limit"),
    ({"nodes": 0}, "nodes"), ({"budget": 0}, None), ({"nope": 1}, "no option"),
])
def test_impossible_options_are_one_clear_error(bad, match):
    from taso_egg.errors import TasoEggError

    with pytest.raises(TasoEggError, match=match):
        if "budget" in bad:
            opts.SearchOptions(**bad)
        else:
            opts.OptimizeOptions().replace(**bad)


def test_the_command_refuses_an_impossible_option_in_one_line(tmp_path, capsys):
    from taso_egg.cli import main

    assert main(["optimize", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--measure", "501"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--measure" in err[0]
    assert not (tmp_path / "o.onnx").exists()
