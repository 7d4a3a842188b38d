"""``OpConfig``: one operator configuration, the key a profile measures once and a cost
model looks up."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ProfileError
from ..ops import OPS, TensorType


def jsonable(v):
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, bytes):  # opaque operators keep attributes as serialized protos
        return "0x" + v.hex()
    return v


@dataclass(frozen=True)
class OpConfig:
    """One operator configuration: what a profile measures once and a cost model looks up."""

    op: str
    params: tuple[tuple[str, Any], ...]   # normalized by the operator table, sorted by name
    inputs: tuple[TensorType, ...]
    outputs: tuple[TensorType, ...]
    constant: tuple[bool, ...]            # per input: known before run time

    @staticmethod
    def of(op: str, params: dict, inputs: Sequence[TensorType], outputs: Sequence[TensorType] | None = None,
           constant: Sequence[bool] | None = None) -> OpConfig:
        spec = OPS[op]
        norm = spec.normalize_params(params, "profile: ")
        inputs = tuple(inputs)
        outputs = tuple(spec.infer(norm, inputs) if outputs is None else outputs)
        constant = tuple(bool(c) for c in constant) if constant is not None else (False,) * len(inputs)
        if len(constant) != len(inputs):
            raise ProfileError(f"{op}: {len(constant)} constant flags for {len(inputs)} inputs")
        return OpConfig(op, tuple(sorted(norm.items())), inputs, outputs, constant)

    @property
    def param_dict(self) -> dict:
        return dict(self.params)

    @property
    def weight_only(self) -> bool:
        """Folded into a constant at export (opaque nodes never are)."""
        return bool(self.inputs) and all(self.constant) and self.op != "opaque"

    @property
    def key(self) -> str:
        """Canonical text key, e.g. ``matmul {"activation":"NONE"} float32[8,16],float32[16,4]:const``.
        Outputs are left out: the shape rule derives them from the rest."""
        params = json.dumps({k: jsonable(v) for k, v in self.params}, sort_keys=True,
                            separators=(",", ":"))
        ins = ",".join(f"{t.dtype}[{','.join(map(str, t.shape))}]" + (":const" if c else "")
                       for t, c in zip(self.inputs, self.constant))
        return f"{self.op} {params} {ins}"


def node_config(node, constant=None) -> OpConfig:
    """The configuration a graph node runs as; ``constant``: per input, whether it is
    known before run time."""
    return OpConfig.of(node.op, node.params, [t.type for t in node.inputs], node.outputs, constant)
