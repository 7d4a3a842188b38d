"""What the rule generator (generator/enumerate.py) enumerates of each operator: the
one table a new operator joins to have rules discovered for it.

A menu is one of MENUS; each operator lists the ways it is built (``Enumerated``), in
the order the generator tries them (the first graph found for a value is the one
bigger graphs are built on, so the order is part of what a menu generates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# "taso": TASO's operators and real models' (size 3); "reduced": the 2-D matmul, concat
# and split algebra (size 4); "matrix": 2-D only (tests, quick experiments).
MENUS = ("taso", "reduced", "matrix")
_ALL, _TASO, _NOT_REDUCED = MENUS, ("taso",), ("taso", "matrix")


@dataclass(frozen=True)
class Enumerated:
    """One way to build the operator: in ``menus``, with ``params`` fixed (the rest
    default) and ``operands`` restricting each input as generator.enumerate.OpChoice
    says."""

    menus: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    operands: tuple[str, ...] | None = None

    def __post_init__(self):
        if set(self.menus) - set(MENUS):
            raise RuntimeError(f"unknown menu(s) {sorted(set(self.menus) - set(MENUS))}")


_MATRIX = ("matrix",)
# On matrices only: over the 4-D kinds they would multiply the convolutions' graphs.
_NEW_2D = Enumerated(_TASO, operands=_MATRIX)
_POOL = Enumerated(_TASO, {"kernel": (3, 3), "strides": (1, 1), "padding": "SAME"}, ("data",))

# Operator -> its builds, in the generator's order.
ENUMERATED: dict[str, tuple[Enumerated, ...]] = {
    "ewadd": (Enumerated(_ALL),),
    "ewmul": (Enumerated(_NOT_REDUCED),),
    "smul": (Enumerated(_NOT_REDUCED),),
    "relu": (Enumerated(_ALL),),
    "transpose": (Enumerated(_ALL, {"perm": (1, 0)}),),
    "ewsub": (Enumerated(_TASO, operands=_MATRIX * 2),),
    "ewdiv": (Enumerated(_TASO, operands=_MATRIX * 2),),
    "gelu": (_NEW_2D,),
    "softmax": tuple(Enumerated(_TASO, {"axis": a}, _MATRIX) for a in (0, 1)),
    "matmul": (Enumerated(_ALL, {"activation": "NONE"}), Enumerated(_NOT_REDUCED, {"activation": "RELU"})),
    "concat": tuple(Enumerated(_ALL, {"axis": a}) for a in (0, 1)),
    # As in TASO, a split only takes apart what a concat put together.
    "split": tuple(Enumerated(_ALL, {"axis": a}, ("concat",)) for a in (0, 1)),
    # The fused RELU only with stride 1, SAME: conv choices dominate the enumeration
    # (each adds ~130k graphs at size 3), and relu over a conv is in the menu anyway.
    "conv2d": tuple(Enumerated(_TASO, {"strides": s, "padding": p, "activation": "NONE"}, ("data", "weight"))
                    for s in ((1, 1), (2, 2)) for p in ("SAME", "VALID"))
    + (Enumerated(_TASO, {"strides": (1, 1), "padding": "SAME", "activation": "RELU"}, ("data", "weight")),),
    "avgpool2d": (_POOL,),
    "maxpool2d": (_POOL,),
    "enlarge": (Enumerated(_TASO, operands=("weight", "leaf")),),  # the reference only lends its shape
    "layernorm": (Enumerated(_TASO, operands=("matrix", "=p0", "=p1")),),
    "batchnorm": (Enumerated(_TASO, operands=("data", "=p0", "=p1", "=p2", "=v0")),),
}

# How the generator runs many applications of one shape in one kernel call: "batch"
# stacks the inputs along axis 0 (the output stacks alike); "groups" stacks inputs along
# channels and weights along output channels (one grouped convolution whose groups are
# the separate ones). Operators not named run one call each.
STACKED = {"conv2d": "groups", "avgpool2d": "batch", "maxpool2d": "batch"}
