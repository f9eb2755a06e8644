"""The servers a recipe trains its drafter for (``export: {servers: [llamacpp, vllm]}``), checked and served.

``fit`` checks the built (untrained) drafter against every named server before any data work, with the very rules
``export --server`` applies (:func:`check_servable`), and after training writes one export per server next to the
native one (:func:`export_for_servers`): ``<log_dir>/serving/<server>/``. An empty list opts out (research cells,
drafters no server serves); the recipe says why in a comment.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..drafters import Drafter
from .common import InteropError
from .dspark_hf import LAYOUT as DSPARK_HF
from .eagle3_hf import LAYOUT as EAGLE3_HF
from .layouts import as_layout, vet
from .llamacpp import LlamaCppUnavailable
from .servers import server_names

SERVING_DIR = "serving"


def check_servers(servers: list[str]) -> list[str]:
    """``export.servers``: registered servers, each named once (the dtype is a ``Literal`` where it is received)."""
    known = server_names()
    for e in servers:
        if e not in known:
            raise InteropError(f"export.servers: unknown server {e!r}; choose from {', '.join(known)}")
    if len(set(servers)) != len(servers):
        raise InteropError(f"export.servers names a server twice: {list(servers)}")
    return list(servers)


def serving_layout(drafter: Any) -> str:
    """The layout ``fit`` exports a drafter of this family in."""
    return DSPARK_HF if isinstance(drafter, Drafter) else EAGLE3_HF


def check_servable(drafter: Any, servers: list[str], target: Any = None, layout: Any = None) -> None:
    """Raise :class:`InteropError` in one line naming the servers and the option when ``drafter`` (trained or not)
    could not be exported in ``layout`` (default its family's serving layout) for one of ``servers`` (the layout's
    check, then each server's rules for that layout, as ``export`` applies them)."""
    if not servers:
        return
    layout = serving_layout(drafter) if layout is None else as_layout(layout).name
    try:
        for server in servers:
            vet(layout, drafter, target, server, trained=False)
    except InteropError as exc:
        raise InteropError(
            f"export.servers [{', '.join(servers)}]: {exc}; or train for no server: export: {{servers: []}}"
        ) from None


def export_for_servers(
    native: Path, layout: Any, servers: list[str], dtype: str = "bf16", log: Callable[[str], None] = print
) -> dict[str, Path]:
    """After ``fit``: one ``layout`` export (a name or ``{class_path, init_args}``) per server in
    ``<native>/../serving/<server>``; returns those written.

    Never raises (training is done): an export that cannot be written is reported in one line, with the exact
    command for llama.cpp's GGUF when its converter is not on this machine."""
    from .convert import export_drafter

    done: dict[str, Path] = {}
    for server in servers:
        out = native.parent / SERVING_DIR / server
        try:
            res = export_drafter(native, layout, out, dtype=dtype, server=server, overwrite=True)
        except LlamaCppUnavailable as exc:
            cmd = f"dspark-lightning export --drafter {native} --server llamacpp --out {out}"
            log(f"[dspark-lightning] {exc}; then: {cmd}")
            continue
        except (InteropError, OSError) as exc:
            log(f"[dspark-lightning] no {server} export: {' '.join(str(exc).split())}")
            continue
        done[server] = res.path
        files = ", ".join(sorted(p.name for p in res.path.iterdir() if p.is_file()))
        log(f"[dspark-lightning] {server} export -> {res.path} ({files})")
        for note in res.notes:
            log(f"[dspark-lightning] note: {note}")
    if "llamacpp" in done:
        gguf = done["llamacpp"] / "draft.gguf"
        log(
            "[dspark-lightning] serve it: llama-server -m <target.gguf> -md "
            f"{gguf} --spec-type draft-dspark --spec-draft-n-max <block size> (docs/serving.md)"
        )
    return done


__all__ = ["check_servable", "export_for_servers", "check_servers", "serving_layout"]
