"""The package layers import downwards only: models never reach into the runtime, the runtime never into Lightning."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "dspark_lightning"

# layer -> packages of dspark_lightning it must not import (at module level or inside functions)
FORBIDDEN = {
    "drafters": {"infer", "lightning", "eval", "data"},
    "modules": {"infer", "lightning", "eval", "data", "drafters"},
    "infer": {"lightning"},
}


def imported_subpackages(path: Path) -> set[str]:
    """dspark_lightning sub-packages ``path`` imports, relative or absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    depth = len(path.relative_to(PKG).parts) - 1  # 1 for dspark_lightning/infer/x.py
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("dspark_lightning."):
                found.add(node.module.split(".")[1])
            elif node.level > depth and node.module:  # from ..x import y -> sub-package x
                found.add(node.module.split(".")[0])
            elif node.level > depth:  # from .. import x
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dspark_lightning."):
                    found.add(a.name.split(".")[1])
                if a.name.split(".")[0] in ("lightning", "pytorch_lightning"):
                    found.add("lightning")
    if any(isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == "lightning"
           for n in ast.walk(tree)):  # fmt: skip
        found.add("lightning")
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_downwards(layer):
    bad = {}
    for path in sorted((PKG / layer).rglob("*.py")):
        hits = imported_subpackages(path) & FORBIDDEN[layer]
        if hits:
            bad[str(path.relative_to(PKG))] = sorted(hits)
    assert not bad, f"{layer}/ imports layers above it: {bad}"


def test_the_checker_sees_a_violation(tmp_path):
    """The AST walk recognises relative imports that reach up (else the test above could pass vacuously)."""
    probe = PKG / "drafters" / "chain.py"
    assert "targets" in imported_subpackages(probe)  # drafters/chain.py imports ..targets
