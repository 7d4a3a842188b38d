"""Command-line pieces the commands share (``taso-egg`` and the commands plugged into
it), below all of them so that none imports another's module: ``--input-shape``, and
the options made from the dataclasses of ``taso_egg.options`` (their flags, help and
defaults are declared there, once)."""

from __future__ import annotations

import argparse
import dataclasses

from .errors import TasoEggError
from .options import Limits, OptimizeOptions


class CommandParser(argparse.ArgumentParser):
    """The parser of every command (``taso-egg``, its subcommands, plugged or not, and
    the ``python -m`` benchmarks): a usage error is one line on stderr, naming the
    mistake and where help is, and exit code 1, as every other mistake (argparse's
    own: the whole usage and exit code 2). Subparsers are made of the same class."""

    def error(self, message: str):
        message = " ".join(message.split())
        self.exit(1, f"taso-egg: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, _PARSED_BY):  # a subcommand's parser sets it first
            setattr(namespace, _PARSED_BY, self)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but unknown arguments are blamed on the (sub)command that
        was parsing, so that its --help is the one named."""
        namespace, extras = self.parse_known_args(args, namespace)
        parser = vars(namespace).pop(_PARSED_BY)
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace


_PARSED_BY = "_parsed_by"

INPUT_SHAPE_METAVAR = "NAME=D1,D2,..."


def add_input_shape_argument(p, help: str) -> None:
    """``--input-shape NAME=D1,D2,...`` (repeatable); read it with ``parse_input_shapes``."""
    p.add_argument("--input-shape", action="append", metavar=INPUT_SHAPE_METAVAR, help=help)


def parse_input_shapes(items) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items or ():
        name, _, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
        except ValueError:
            raise TasoEggError(f"--input-shape {item!r}: expected NAME=D1,D2,... (e.g. x=1,3,224,224)")
        if not name or not shape:
            raise TasoEggError(f"--input-shape {item!r}: expected NAME=D1,D2,...")
        if shapes.get(name, shape) != shape:
            raise TasoEggError(f"--input-shape gives input {name!r} two shapes: "
                               f"{','.join(map(str, shapes[name]))} and {','.join(map(str, shape))}")
        shapes[name] = shape
    return shapes


def add_option_arguments(p, options_class, flags: dict[str, str] | None = None, only=None) -> None:
    """One option per flagged field of an options dataclass (``taso_egg.options``): its
    flag (``flags`` renames one for a command where the usual flag means something
    else), help, type, choices and default from the field. ``only`` picks fields by
    name. Read them back with ``options_from_args``."""
    for f in _flagged(options_class, only):
        flag = (flags or {}).get(f.name, f.metadata["flag"])
        extra = dict(f.metadata["argparse"])
        if "choices" not in extra:
            extra.setdefault("metavar", flag.lstrip("-").upper().replace("-", "_"))
        action = p.add_argument(flag, type=type(f.default),
                                default=f.default, dest=_dest(options_class, f),
                                help=f.metadata["help"].format(default=f.default), **extra)
        action.option_field = (options_class, f.name)  # what tests/test_options.py holds equal


def options_from_args(args, options_class, only=None, **fixed):
    """The ``options_class`` that ``add_option_arguments``' options ask for (its
    ``__post_init__`` raises a one-line error if a value is out of range); ``fixed``
    sets fields that have no option."""
    values = {f.name: getattr(args, _dest(options_class, f)) for f in _flagged(options_class, only)}
    return options_class(**values, **fixed)


def add_optimize_arguments(p) -> None:
    """Every option of ``OptimizeOptions`` that has a flag (``bench --onnx`` shares them)."""
    for options_class in _optimize_stages().values():
        add_option_arguments(p, options_class)


def optimize_options_from_args(args) -> OptimizeOptions:
    """The ``OptimizeOptions`` that ``add_optimize_arguments``' options ask for (a
    one-line error, before anything loads, when one is out of range)."""
    return OptimizeOptions(**{stage: options_from_args(args, cls) for stage, cls in _optimize_stages().items()})


def _optimize_stages() -> dict:
    """optimize's options, stage by stage (``OptimizeOptions``' fields), each a dataclass."""
    return {f.name: f.default_factory for f in dataclasses.fields(OptimizeOptions)}


def add_limit_arguments(p) -> None:
    """The saturation limits' options (``options.Limits``)."""
    add_option_arguments(p, Limits)


def limits_from_args(args) -> Limits:
    return options_from_args(args, Limits)


def _flagged(options_class, only):
    return [f for f in dataclasses.fields(options_class)
            if "flag" in f.metadata and (only is None or f.name in only)]


def _dest(options_class, f) -> str:
    return f"{options_class.__name__}.{f.name}"
