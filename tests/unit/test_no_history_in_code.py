"""Comments and docstrings explain the code as it is, not its history or one machine's measurements.

Every ``.py`` file under ``dspark_lightning/`` is read: comments with :mod:`tokenize`, docstrings (and the bare
string statements that document attributes) with :mod:`ast`. None may hold

- a date (``YYYY-MM-DD``): when something changed belongs in the changelog;
- a measured time or speed-up (``8.2 ms``, ``~30 s``, ``3.6x faster``): numbers go stale and live in
  docs/results.md, next to the machine they were measured on;
- "used to" (what the code did before), or "issue N" (why it changed): the reason is stated as it holds now.

String literals that are not docstrings (messages, help texts) are not read.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "dspark_lightning"

PATTERNS = {
    "a date": re.compile(r"\b(?:19|20)\d{2}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"),
    "a measured time": re.compile(
        r"(?<![\w.^/])[~≈]?\d+(?:\.\d+)?(?:[-–]\d+(?:\.\d+)?)?\s?(?:ms|µs|us|s|sec|secs|seconds|min|mins|minutes)"
        r"(?=[\s),.;:]|$)"
    ),
    "a measured speed-up": re.compile(r"\b\d+(?:\.\d+)?\s?[x×] (?:faster|slower|quicker|the\b|as fast|speed)"),
    "an issue number": re.compile(r"\b[Ii]ssue #?\d+"),
}
USED_TO = re.compile(r"(\S+)\s+used to\b", re.I)
# "is used to pick" describes a purpose, not a past
PURPOSE = {"is", "are", "was", "were", "be", "been", "being", "get", "gets", "got", "it's", "that's", "what's"}


def comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every ``#`` comment."""
    toks = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.start[0], t.string) for t in toks if t.type == tokenize.COMMENT]


def docstrings(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring and every other bare string statement (attribute docs)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.append((node.lineno, node.value.value))
    return out


def findings(text: str) -> list[str]:
    """What ``text`` holds that the module docstring forbids, one short quote per hit."""
    flat = " ".join(text.split())
    hits = [f"{what}: {m.group(0)!r}" for what, rx in PATTERNS.items() for m in rx.finditer(flat)]
    for m in USED_TO.finditer(flat):
        if m.group(1).lower().strip("(\"'`") not in PURPOSE:
            hits.append(f"history: {m.group(0)!r}")
    return hits


def scan(source: str) -> list[tuple[int, str]]:
    return sorted((line, hit) for line, text in comments(source) + docstrings(source) for hit in findings(text))


def violations(pkg: Path = PKG) -> list[str]:
    out = []
    for path in sorted(pkg.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(pkg.parent)
        out += [f"{rel}:{line}: {hit}" for line, hit in scan(path.read_text(encoding="utf-8"))]
    return out


def test_comments_and_docstrings_hold_no_history_or_measurements():
    bad = violations()
    assert not bad, "state the reason as it holds now (numbers live in docs/results.md):\n  " + "\n  ".join(bad)


def test_the_scanner_sees_planted_history():
    """Each kind is found in a comment, a docstring or an attribute docstring (else the test above could pass
    vacuously); messages, purposes ("is used to") and code are not read."""
    source = '''"""Measured on 2024-05-01."""
import logging

X = 1  # 8.2 ms per step on this machine
"""the value we had until 2023-03-01"""


class A:
    """Ran 3.6x the steps per second."""

    def f(self):
        """The verifier used to copy the cache (issue 14), now ~30 s."""
        logging.warning("converting (one time, ~30 s)")  # a message, not a comment: not read
        y = 2  # the mask is used to pick rows; shapes (8, width) x (width, rows); step 0 s_0
        return y
'''
    hits = scan(source)
    kinds = {hit.split(":")[0] for _, hit in hits}
    assert kinds == {*PATTERNS, "history"}, hits
    assert {line for line, _ in hits} == {1, 4, 5, 9, 12}, hits
    assert not any("is used to" in hit for _, hit in hits)
