"""Shared test rows for the data tests (imported by module name: tests/data is on sys.path under pytest)."""

from __future__ import annotations


def conversations(n: int = 7, multi_turn: bool = True, id_fmt: str = "row-{i}") -> list[dict]:
    """Rows of varied length (byte-level tokenizer: one token per character); every third row has two turns."""
    rows = []
    for i in range(n):
        turns = [
            {"role": "user", "content": f"question {i} " + "x" * (5 * i)},
            {"role": "assistant", "content": f"answer number {i}: " + "y" * (11 * i)},
        ]
        if multi_turn and i % 3 == 2:
            turns += [{"role": "user", "content": "more?"}, {"role": "assistant", "content": "z" * (20 + i)}]
        rows.append({"id": id_fmt.format(i=i), "domain": "chat" if i % 2 else "math", "turns": turns})
    return rows
