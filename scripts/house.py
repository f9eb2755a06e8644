"""Draw the house: the package's floors, the folders on each, and the imports between them.

    python scripts/house.py --out docs/house.png        (make house)

Read from the source by the same code as ``tests/unit/test_layering.py`` (imports at module level and inside
functions, ``import_module`` strings, the registry's discovered built-ins): one box per folder (a subpackage is its
own box), one arrow per pair of boxes that import each other, its width by the number of imports. Arrows run down or
along a floor; an arrow up a floor is drawn red and listed, except the registry's documented back-edge (dotted).
Prints each floor's folders and every upward import; exits 1 when one is not allowed.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from test_layering import ALLOWED, FLOORS, _allowed, floor_of, import_graph, rel  # noqa: E402


def box_of(path: str) -> str:
    """``infer/profiling/measure_sps.py`` -> ``infer/profiling``; ``infer/engine.py`` -> ``infer``; ``atomic.py`` ->
    base."""
    parts = path.split("/")
    if len(parts) == 1:
        return "cli" if floor_of(path) == "cli" else floor_of(path)
    return "/".join(parts[:-1]) if parts[-1].endswith(".py") else "/".join(parts)


def edges() -> tuple[dict[str, int], Counter, set[tuple[str, str]], set[tuple[str, str]], list[str]]:
    """Every box's floor; (box, box) -> imports; the pairs that are the registry's allowed back-edge; the pairs with
    an upward import that is not allowed, and every such import, named."""
    floors: dict[str, int] = {}
    count: Counter = Counter()
    allowed: set[tuple[str, str]] = set()
    bad: set[tuple[str, str]] = set()
    up: list[str] = []
    for module, targets in import_graph().items():
        src = rel(module)
        floors[box_of(src)] = FLOORS.index(floor_of(src))
        for t in targets:
            dst = rel(t)
            a, b = box_of(src), box_of(dst)
            fa, fb = FLOORS.index(floor_of(src)), FLOORS.index(floor_of(dst))
            if fb > fa:
                if _allowed(src, dst, ALLOWED):
                    allowed.add((a, b))
                else:
                    bad.add((a, b))
                    up.append(f"{src} ({FLOORS[fa]}) -> {dst} ({FLOORS[fb]})")
            if a != b:
                count[(a, b)] += 1
    return floors, count, allowed, bad, sorted(up)


def draw(out: Path) -> list[str]:
    from dspark_lightning.plots import plt, save_figure

    floor, count, allowed, bad, up = edges()
    boxes = sorted(floor)
    rows: dict[int, list[str]] = {}
    for b in boxes:
        rows.setdefault(floor[b], []).append(b)
    width = max(len(r) for r in rows.values())
    pos = {}
    for f, row in rows.items():
        for i, b in enumerate(sorted(row)):
            pos[b] = ((i + 0.5) * width / len(row), f)
    fig, ax = plt.subplots(figsize=(max(10, 2.2 * width), 0.9 * len(FLOORS) + 1))
    for f, name in enumerate(FLOORS):
        ax.axhspan(f - 0.45, f + 0.45, color="0.95" if f % 2 else "0.9", zorder=0)
        ax.text(-0.3, f, name, ha="right", va="center", fontsize=9, weight="bold")
    for (a, b), n in count.items():
        (x0, y0), (x1, y1) = pos[a], pos[b]
        style = {"color": "0.6", "lw": 0.4 + 0.25 * min(n, 12), "alpha": 0.6}
        if (a, b) in bad:
            style = {"color": "red", "lw": 1.5 + 0.25 * min(n, 12), "alpha": 0.9}
        elif (a, b) in allowed:
            style = {"color": "0.5", "lw": 0.8, "ls": ":", "alpha": 0.8}
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=1,
                    arrowprops={"arrowstyle": "-|>", "shrinkA": 14, "shrinkB": 14, **style})  # fmt: skip
    for b, (x, y) in pos.items():
        ax.text(x, y, b, ha="center", va="center", fontsize=8, zorder=2,
                bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.3"})  # fmt: skip
    ax.set_xlim(-1.4, width + 0.2)
    ax.set_ylim(-0.6, len(FLOORS) - 0.4)
    ax.axis("off")
    ax.set_title(f"dspark_lightning: {len(boxes)} folders on {len(FLOORS)} floors; arrows are imports "
                 f"(red: up a floor, {len(up)}; dotted: the registry's documented back-edge)", fontsize=10)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    save_figure(fig, out, dpi=110)  # replaced whole or not at all
    plt.close(fig)
    for f in range(len(FLOORS) - 1, -1, -1):
        print(f"{FLOORS[f]:>12}: {', '.join(sorted(rows.get(f, [])))}")
    return up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/house.png", help="the drawing (PNG)")
    a = ap.parse_args()
    up = draw(Path(a.out))
    print(f"wrote {a.out}; upward imports: {len(up)}")
    for line in up:
        print("  " + line)
    sys.exit(1 if up else 0)


if __name__ == "__main__":
    main()
