"""The cleanup measures of the package (issue 50): lines of ``dspark_lightning/**/*.py`` and how they split (docstring
lines, comment-only lines, blank lines outside docstrings, code lines), functions over 80 lines, ``check_choice(``
calls, and modules with a hand-written ``argparse.ArgumentParser``.

    python scripts/package_measures.py [ROOT]      # ROOT: a checkout (default: this one), e.g. a `git worktree`

Prints one JSON line. ``duplicates --repo dspark_lightning`` gives the repeated-code pairs beside it.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path


def measures(root: Path) -> dict:
    lines = long_functions = choice_calls = 0
    kinds = {"docstring": 0, "comment": 0, "blank": 0, "code": 0}
    parsers = []
    for path in sorted((root / "dspark_lightning").rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        lines += src.count("\n")
        choice_calls += len(re.findall(r"check_choice\(", src)) - len(re.findall(r"def check_choice\(", src))
        if re.search(r"ArgumentParser\(", src) and "jsonargparse" not in src:
            parsers.append(str(path.relative_to(root)))
        docs = set()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80:
                long_functions += 1
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
                first = node.body[0]
                if (
                    isinstance(first, ast.Expr)
                    and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)
                ):
                    docs.update(range(first.lineno, first.end_lineno + 1))
        for i, line in enumerate(src.splitlines(), 1):
            if i in docs:
                kinds["docstring"] += 1
            elif line.lstrip().startswith("#"):
                kinds["comment"] += 1
            else:
                kinds["code" if line.strip() else "blank"] += 1
    return {"package_lines": lines, "lines_by_kind": kinds, "functions_over_80": long_functions,
            "check_choice_calls": choice_calls, "argparse_parsers": parsers}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(measures(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])))
