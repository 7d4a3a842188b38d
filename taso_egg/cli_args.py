"""Command-line pieces the commands share (``taso-egg`` and the commands plugged into
it), below all of them so that none imports another's module: ``--input-shape``, and
the saturation limits' options made from the ``Limits`` dataclass."""

from __future__ import annotations

import argparse
import dataclasses

from .errors import TasoEggError


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
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
        except ValueError:
            raise TasoEggError(f"--input-shape {item!r}: expected NAME=D1,D2,... (e.g. x=1,3,224,224)")
        if not name or not shapes[name]:
            raise TasoEggError(f"--input-shape {item!r}: expected NAME=D1,D2,...")
    return shapes


def add_limit_arguments(p) -> None:
    """One option per field of ``Limits``: its flag and help from the field's metadata,
    its type and default from the field. Read them back with ``limits_from_args``."""
    from .egraph.saturate import Limits

    for f in dataclasses.fields(Limits):
        p.add_argument(f.metadata["flag"], type=type(f.default), default=f.default,
                       dest=_limit_dest(f), help=f.metadata["help"].format(default=f.default))


def limits_from_args(args):
    """The ``Limits`` that ``add_limit_arguments``' options ask for (LimitError if out of range)."""
    from .egraph.saturate import Limits

    return Limits(**{f.name: getattr(args, _limit_dest(f)) for f in dataclasses.fields(Limits)})


def _limit_dest(f) -> str:
    return f.metadata["flag"].lstrip("-").replace("-", "_")
