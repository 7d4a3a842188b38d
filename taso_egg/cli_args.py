"""Command-line pieces every command shares (``taso-egg`` and the commands plugged
into it), below all of them so that none imports another's module."""

from __future__ import annotations

from .errors import TasoEggError

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
