"""Every file of the package sits on one floor and imports only from its own floor or the floors below.

    base -> targets -> layers -> drafters -> checkpoint -> export -> infer -> data -> calibration -> eval
         -> testing -> lightning -> cli

``base`` holds the leaf utilities (atomic I/O, locks, devices, the validators of ``checks``, the registry, the
losses, the plot style, markdown tables). ``checkpoint`` is the on-disk form of a drafter in our own format
(calibration files included), which ``infer.decode`` loads; ``export`` writes the serving layouts on top of it and
the runtime never imports it. ``calibration`` fits the confidence temperatures from real decoding (the runtime) on
prompts of ``data``. ``data``, ``calibration`` and ``eval`` are the application floors (eval reads data's prompt
sources, never the other way). The package root (``dspark_lightning/__init__.py``: ``load_drafter``,
``load_target``, ``create``) is a facade on the top floor: nothing inside the package imports it.

The edges that are allowed anyway, and the narrow seams between two floors, are listed in :data:`ALLOWED` and
:data:`SEAMS` below, and nowhere else. Imports are read from the source (module level and inside functions), plus
``importlib.import_module("dspark_lightning...")`` calls, a module's ``BUILTINS`` tuple of module names, and for the
registry the modules its first lookup imports (every module that registers a component,
``registry.builtin_modules``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "dspark_lightning"

FLOORS = (
    "base", "targets", "layers", "drafters", "checkpoint", "export", "infer", "data", "calibration", "eval",
    "testing", "lightning", "cli",
)  # fmt: skip

# path inside dspark_lightning/ (a file, or a folder for everything under it) -> floor; the longest match wins
PLACES = {
    "atomic.py": "base",
    "locks.py": "base",
    "devices.py": "base",
    "checks.py": "base",
    "registry.py": "base",
    "markdown.py": "base",
    "losses.py": "base",
    "plots.py": "base",
    "errors.py": "base",
    "targets": "targets",
    "layers": "layers",
    "drafters": "drafters",
    "checkpoint": "checkpoint",
    "export": "export",
    "infer": "infer",
    "data": "data",
    "calibration": "calibration",
    "eval": "eval",
    "testing.py": "testing",  # plugin conformance checks: build, export, reload and decode a drafter
    "lightning": "lightning",
    "cli": "cli",
    "__init__.py": "cli",  # the package root: the public facade
}


# The edges allowed to point upwards: importer -> imported modules, and why. Keep this the only such list.
def _registering(pkg: Path) -> set[str]:
    """The files whose source registers a component: what the registry imports on its first lookup."""
    from dspark_lightning.registry import builtin_modules

    out = set()
    for m in builtin_modules(pkg):
        parts = m.split(".")[1:]
        out.add("/".join(parts) if pkg.joinpath(*parts).is_dir() else "/".join(parts) + ".py")
    return out


ALLOWED = {
    "registry.py": (
        _registering(PKG),
        "the registry loads the built-in components on first use (every module that registers one, found by walking "
        "the package), as timm and vLLM do: the one back-edge, so that create('drafter', 'dspark') works without "
        "importing drafters/ first",
    ),
}

# (upper floor, lower floor) -> the only files of the lower floor the upper one may import, and why
SEAMS = {
    ("infer", "export"): (set(), "the runtime loads drafters through checkpoint/, never through the exporters"),
    ("data", "infer"): (
        {"infer/generation.py"},
        "regeneration decodes with the runtime's engine through generation_engine() only",
    ),
}


# --- the import graph --------------------------------------------------------------------------------------------
def modules_of(pkg: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``pkg`` (a package ``x`` is its ``x/__init__.py``)."""
    out = {}
    for p in sorted(pkg.rglob("*.py")):
        parts = list(p.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _nearest(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of the package that ``module`` imports anywhere in its source. ``from pkg import name`` is an import
    of the submodule ``pkg.name`` when there is one, else of ``pkg`` itself (the package root included)."""
    root = module.split(".")[0]
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    if module == f"{root}.registry" and "builtin_modules" in path.read_text():
        from dspark_lightning.registry import builtin_modules

        found |= {m for m in builtin_modules(path.parent) if m in mods}

    def add(name: str) -> None:
        hit = _nearest(name, mods) if name.split(".")[0] == root else None
        if hit is not None and hit != module:
            found.add(hit)

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level else (
                node.module or "")  # fmt: skip
            for a in node.names:
                add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
        elif isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == (
                "import_module") and node.args and isinstance(node.args[0], ast.Constant):  # fmt: skip
            add(str(node.args[0].value))
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILTINS" for t in node.targets):
            for elt in getattr(node.value, "elts", []):
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    add(elt.value)
    return found


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    mods = modules_of(pkg)
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def rel(module: str, pkg: Path = PKG) -> str:
    """``dspark_lightning.infer.verify.hf`` -> ``infer/verify/hf.py``; a package -> its folder name (``drafters``)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    p = pkg.joinpath(*parts)
    return "/".join(parts) if p.is_dir() else "/".join(parts) + ".py"


def floor_of(path: str) -> str:
    keys = [k for k in PLACES if path == k or path.startswith(k.rstrip("/") + "/")]
    if not keys:
        raise AssertionError(f"{path} is on no floor: add it to PLACES in tests/unit/test_layering.py")
    return PLACES[max(keys, key=len)]


def _allowed(src: str, dst: str, table: dict) -> bool:
    entry = table.get(src)
    return entry is not None and any(dst == a or dst.startswith(a + "/") for a in entry[0])


def violations(pkg: Path = PKG) -> list[str]:
    """Every import that points to a higher floor (not in ALLOWED) or crosses a seam elsewhere than SEAMS says."""
    out = []
    for module, targets in sorted(import_graph(pkg).items()):
        src = rel(module, pkg)
        lo = FLOORS.index(floor_of(src))
        for t in sorted(targets):
            dst = rel(t, pkg)
            hi = FLOORS.index(floor_of(dst))
            if hi > lo and not _allowed(src, dst, ALLOWED):
                what = "the package root" if dst == "__init__.py" else f"{dst} ({FLOORS[hi]})"
                out.append(f"{src} ({FLOORS[lo]}) imports {what}")
            seam = SEAMS.get((FLOORS[lo], FLOORS[hi]))
            if seam is not None and dst not in seam[0]:
                out.append(f"{src} reaches {FLOORS[hi]}/ through {dst}, not its seam {sorted(seam[0])}")
    return out


def largest_cycle(graph: dict[str, set[str]], skip: dict | None = None) -> list[str]:
    """The largest strongly connected component (files that import each other, directly or not), optionally
    without the ALLOWED edges."""
    edges = {m: {t for t in ts if not (skip and _allowed(rel(m), rel(t), skip))} for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    best: list[str] = []

    def visit(v: str) -> None:  # Tarjan, recursive: the graph is a hundred files
        nonlocal best
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            best = max(best, comp, key=len)

    for v in edges:
        if v not in index:
            visit(v)
    return sorted(best) if len(best) > 1 else []


# --- the tests -----------------------------------------------------------------------------------------------------
def test_every_file_is_on_a_floor():
    for module in modules_of(PKG):
        assert floor_of(rel(module)) in FLOORS


def test_imports_point_down_the_floors():
    bad = violations()
    assert not bad, "imports against the floors (see the module docstring):\n  " + "\n  ".join(bad)


# The most files one import cycle may hold (files that import each other, directly or not), the registry's allowed
# back-edge excluded: a bigger cycle means two parts that cannot be read, tested or replaced one without the other.
MAX_CYCLE = 3


def test_import_cycles_stay_small():
    cycle = largest_cycle(import_graph(), ALLOWED)
    assert len(cycle) <= MAX_CYCLE, (
        f"an import cycle of {len(cycle)} files (at most {MAX_CYCLE}): {[rel(m) for m in cycle]}"
    )


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "dspark_lightning"
    stubs = ("__init__.py", "registry.py", "drafters/__init__.py", "infer/__init__.py", "infer/engine.py",
             "infer/generation.py", "data/__init__.py", "lightning/__init__.py", "lightning/module.py")  # fmt: skip
    for name in stubs:
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text("")
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_the_checker_sees_planted_violations(tmp_path):
    """Back-edges at module level, inside a function, through import_module and through the package root, and a
    seam crossed elsewhere, are all reported (else the tests above could pass vacuously)."""
    pkg = _plant(tmp_path, {
        "drafters/a.py": "from ..lightning.module import X\n",
        "drafters/b.py": "def f():\n    from ..lightning import module\n",
        "drafters/c.py": "import importlib\nimportlib.import_module('dspark_lightning.infer.engine')\n",
        "infer/d.py": "def f():\n    from .. import load_drafter\n",
        "data/e.py": "from ..infer.engine import Engine\n",
        "data/ok.py": "from ..infer.generation import generation_engine\nfrom ..registry import get\n",
    })  # fmt: skip
    bad = "\n".join(violations(pkg))
    assert "drafters/a.py (drafters) imports lightning/module.py (lightning)" in bad
    assert "drafters/b.py (drafters) imports lightning/module.py (lightning)" in bad
    assert "drafters/c.py (drafters) imports infer/engine.py (infer)" in bad
    assert "infer/d.py (infer) imports the package root" in bad
    assert "data/e.py reaches infer/ through infer/engine.py" in bad
    assert "data/ok.py" not in bad and len(violations(pkg)) == 5


def test_the_cycle_measure_sees_a_planted_cycle(tmp_path):
    pkg = _plant(tmp_path, {"infer/a.py": "from .b import x\n", "infer/b.py": "def f():\n    from .a import y\n"})
    assert largest_cycle(import_graph(pkg)) == ["dspark_lightning.infer.a", "dspark_lightning.infer.b"]


def test_a_planted_cycle_over_the_limit_is_caught_and_the_registry_is_not_counted(tmp_path):
    """Four files in a ring (one edge inside a function) make a cycle over MAX_CYCLE; the registry's BUILTINS
    back-edge closing a bigger ring through it is excluded, as the test above excludes it."""
    ring = {f"infer/r{i}.py": f"from .r{(i + 1) % 4} import x\n" for i in range(4)}
    ring["infer/r3.py"] = "def f():\n    from .r0 import x\n"
    through = {f"drafters/s{i}.py": f"from .s{i + 1} import x\n" for i in range(3)}
    through["drafters/s3.py"] = "from ..registry import get\n"
    pkg = _plant(tmp_path, {**ring, **through, "registry.py": "BUILTINS = ('dspark_lightning.drafters.s0',)\n"})
    graph = import_graph(pkg)
    assert len(largest_cycle(graph)) == 5  # s0..s3 and the registry, counting its back-edge
    assert largest_cycle(graph, ALLOWED) == [f"dspark_lightning.infer.r{i}" for i in range(4)]
    assert len(largest_cycle(graph, ALLOWED)) > MAX_CYCLE


def test_the_registry_back_edge_is_the_documented_one():
    """The registry's upward imports are exactly the modules that register components, found by walking the
    package: the built-in drafters, schedulers, verifiers, proposers, prompt sources, layouts and servers."""
    mods = modules_of(PKG)
    seen = {rel(t) for t in imports_of("dspark_lightning.registry", PKG / "registry.py", mods)}
    upward = {t for t in seen if FLOORS.index(floor_of(t)) > 0}
    assert upward and all(_allowed("registry.py", t, ALLOWED) for t in upward)
    must = {
        "drafters/heads/sequential.py",
        "infer/schedule/schedulers.py",
        "data/prompts/sources.py",
        "export/servers.py",
    }
    assert must <= upward


def test_a_new_file_that_registers_is_found_without_a_list(tmp_path):
    """Built-ins are discovered: a module with an ``@register`` line is imported on the first lookup; one without is
    not."""
    from dspark_lightning.registry import builtin_modules

    pkg = _plant(tmp_path, {
        "drafters/heads/new_head.py": "from ...registry import register\n\n@register('seq_head', 'x')\nclass X: ...\n",
        "drafters/plain.py": "x = 'register(' \n",
    })  # fmt: skip
    found = builtin_modules(pkg)
    assert "dspark_lightning.drafters.heads.new_head" in found and "dspark_lightning.drafters.plain" not in found


if __name__ == "__main__":  # python tests/unit/test_layering.py: the measure the issue quotes
    g = import_graph()
    print("largest import cycle:", len(largest_cycle(g)), "files; without the allowed back-edge:",
          len(largest_cycle(g, ALLOWED)))  # fmt: skip
    for line in violations():
        print("violation:", line)


def test_the_house_drawing_has_no_arrow_up_a_floor(tmp_path):
    """``make house`` draws the floors from the same graph and exits 0 only with no upward import."""
    import subprocess
    import sys

    out = tmp_path / "house.png"
    script = PKG.parent / "scripts" / "house.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "upward imports: 0" in done.stdout and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for floor in FLOORS:
        assert f"{floor:>12}:" in done.stdout


def test_only_the_training_files_import_lightning():
    """The Lightning package is imported by ``lightning/`` and the training commands (``cli/fit.py``,
    ``cli/prepare.py``) only: the runtime, the data stages and the inference commands run without it."""
    allowed = ("lightning/", "cli/fit.py", "cli/prepare.py")
    found = re.compile(r"^\s*(import lightning\b|from lightning\b)", re.M)
    users = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if found.search(p.read_text(encoding="utf-8")))
    assert users and all(u.startswith(allowed) for u in users), [u for u in users if not u.startswith(allowed)]
