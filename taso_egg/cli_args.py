"""Command-line pieces the commands share (``taso-egg`` and the commands plugged into
it), below all of them so that none imports another's module: ``--input-shape``, and
the saturation limits' options made from the ``Limits`` dataclass."""

from __future__ import annotations

import dataclasses

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
