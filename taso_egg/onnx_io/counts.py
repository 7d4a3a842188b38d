"""What an ONNX file holds, counted one way everywhere (zoo, inspect, optimize,
search): its operators are the nodes that compute; graph inputs, initializers and
``Constant`` nodes are data, not operators."""

from __future__ import annotations

from collections import Counter

DATA_NODES = ("Constant",)


def operator_counts(model) -> Counter:
    """ONNX op type -> number of operators (nodes other than ``Constant``)."""
    return Counter(n.op_type for n in model.graph.node if n.op_type not in DATA_NODES)


def describe(model) -> str:
    """'12 operators (Conv x4, Relu x8)', most frequent first."""
    counts = operator_counts(model)
    ops = ", ".join(f"{op} x{c}" for op, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{sum(counts.values())} operators" + (f" ({ops})" if ops else "")


def format_table(before: Counter, after: Counter) -> str:
    """Operators by ONNX op type, in the input file and in the written one."""
    lines = [f"{'ONNX operator':<22}{'input':>8}{'written':>9}"]
    for op in sorted(set(before) | set(after)):
        lines.append(f"{op:<22}{before.get(op, 0):>8}{after.get(op, 0):>9}")
    lines.append(f"{'total':<22}{sum(before.values()):>8}{sum(after.values()):>9}")
    return "\n".join(lines)
