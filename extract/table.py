"""Plain-text tables for the CLI and the benchmark."""

from __future__ import annotations


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_gap(gap: float | None) -> str:
    return "-" if gap is None else f"{100 * gap:.2f}%"
