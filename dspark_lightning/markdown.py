"""Markdown table cells and rows for the commands' reports (no dependencies)."""

from __future__ import annotations


def cell(v, spec: str = ".2f") -> str:
    """``v`` formatted by ``spec``; an en dash for None or NaN."""
    return "–" if v is None or v != v else format(v, spec)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]
