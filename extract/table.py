"""Plain-text tables for the CLI and the benchmark."""

from __future__ import annotations


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_gap(gap: float | None) -> str:
    if gap is None:
        return "-"
    return f"{100 * gap:.2f}%" if gap == 0 or gap >= 5e-5 else "<0.01%"


def fmt_bound(bound: float | None) -> str:
    return "-" if bound is None else f"{bound:.6f}"
