"""``OpConfig``: one operator configuration, the key a profile measures once and a cost
model looks up."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ProfileError, TasoEggError
from ..ops import OPAQUE, OPS, TensorType


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
        return bool(self.inputs) and all(self.constant) and self.op != OPAQUE.name

    @property
    def key(self) -> str:
        """Canonical text key, e.g. ``matmul {"activation":"NONE"} float32[8,16],float32[16,4]:const``.
        Outputs are left out: the shape rule derives them from the rest."""
        params = json.dumps({k: jsonable(v) for k, v in self.params}, sort_keys=True,
                            separators=(",", ":"))
        ins = ",".join(f"{t.dtype}[{','.join(map(str, t.shape))}]" + (":const" if c else "")
                       for t, c in zip(self.inputs, self.constant))
        return f"{self.op} {params} {ins}"

    def to_json(self) -> dict:
        """What a profile entry or a configuration list records of it (outputs follow)."""
        return {"op": self.op, "params": {k: jsonable(v) for k, v in self.params},
                "inputs": [[list(t.shape), t.dtype, c] for t, c in zip(self.inputs, self.constant)]}

    @staticmethod
    def from_json(entry: dict, key: str | None = None) -> OpConfig:
        """The configuration ``to_json`` wrote; with ``key``, checked to be that one."""
        try:
            inputs = [TensorType(tuple(shape), dtype) for shape, dtype, _ in entry["inputs"]]
            config = OpConfig.of(entry["op"], entry["params"], inputs,
                                 constant=[c for _, _, c in entry["inputs"]])
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"not an operator configuration: {str(entry)[:200]} ({e!r})") from None
        except TasoEggError as e:
            raise ProfileError(f"{key or entry.get('op')}: {e}") from None
        if key is not None and config.key != key:
            raise ProfileError(f"configuration {key!r} reads back as {config.key!r}")
        return config


def node_config(node, constant=None) -> OpConfig:
    """The configuration a graph node runs as; ``constant``: per input, whether it is
    known before run time."""
    return OpConfig.of(node.op, node.params, [t.type for t in node.inputs], node.outputs, constant)
