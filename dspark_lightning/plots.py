"""PNG plots (matplotlib, headless Agg backend). Imported lazily by the commands that draw."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .atomic import atomic_writer  # noqa: E402


def save_figure(fig, path: str | Path, dpi: int) -> Path:
    """``fig.savefig`` through a temp file next to ``path`` (all or nothing)."""
    path = Path(path)
    with atomic_writer(path) as f:
        fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=dpi)
    return path


def plot_sps(table, path: str | Path) -> Path:
    """SPS(B) measured and smoothed, plus the time per verification forward."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(table.tokens, table.raw_sps, "o", ms=3, label="measured")
    ax1.plot(table.tokens, table.sps, "-", label="smoothed (non-increasing)")
    ax1.set_xlabel("verification tokens per forward, B")
    ax1.set_ylabel("target steps / s")
    ax1.set_xscale("log", base=2)
    ax1.legend()
    ax2.plot(table.tokens, [1000 / s for s in table.raw_sps], "o-", ms=3)
    ax2.set_xlabel("B")
    ax2.set_ylabel("ms per forward")
    ax2.set_xscale("log", base=2)
    m = table.meta
    where = f"{m.get('device', '?')} ({m.get('dtype', '?')}, context {m.get('context_len')})"
    fig.suptitle(f"SPS of {m.get('target', '?')} on {where}")
    fig.tight_layout()
    with atomic_writer(path) as f:  # all or nothing
        fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
    return path


MAX_COLUMNS = 4  # panels per row: a figure stays readable at a glance (no 8-panel strip)


def panel_grid(n: int, panel: tuple[float, float] = (4.2, 3.6), max_columns: int = MAX_COLUMNS, **kwargs):
    """A figure of ``n`` panels in rows of at most ``max_columns`` -> ``(fig, axes)``, ``axes`` the ``n`` panels in
    reading order (the unused cells of the last row are removed)."""
    n = max(1, n)
    cols = min(n, max_columns)
    rows = -(-n // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows), squeeze=False, **kwargs)
    cells = [ax for row in grid for ax in row]
    for ax in cells[n:]:
        fig.delaxes(ax)
    return fig, cells[:n]


def integer_ticks(ax, last: int, first: int = 1, max_ticks: int = 16) -> None:
    """x ticks on whole numbers only: every position ``first..last`` when they fit, else integer steps."""
    from matplotlib.ticker import MaxNLocator

    if last - first + 1 <= max_ticks:
        ax.set_xticks(range(first, last + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=max_ticks, integer=True))
    ax.set_xlim(first - 0.5, last + 0.5)
