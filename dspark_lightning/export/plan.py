"""The engines a recipe trains its drafter for (``export: {engines: [llamacpp, vllm]}``), checked and served.

``fit`` checks the built (untrained) drafter against every named engine before any data work, with the very rules
``export --engine`` applies (:func:`check_servable`), and after training writes one export per engine next to the
native one (:func:`export_for_engines`): ``<log_dir>/serving/<engine>/``. An empty list opts out (research cells,
drafters no engine serves); the recipe says why in a comment.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..drafters import Drafter
from .common import EXPORT_DTYPES, InteropError
from .dspark_hf import HEADS, check_dspark
from .eagle3_hf import check_eagle3
from .engines import ENGINES, refuse_dspark, refuse_eagle3
from .llamacpp import LlamaCppUnavailable

PLAN_KEYS = {"engines", "dtype"}
SERVING_DIR = "serving"


def plan_args(spec: dict | None) -> tuple[list[str], str]:
    """``export: {engines: [...], dtype: bf16|fp32}`` -> (engines, dtype); refuses unknown keys, engines, dtypes."""
    if spec is None:
        return [], "bf16"
    if not isinstance(spec, dict):
        raise InteropError(f"export must be a mapping such as {{engines: [llamacpp, vllm]}}, got {spec!r}")
    unknown = set(spec) - PLAN_KEYS
    if unknown:
        raise InteropError(f"export: unknown keys {sorted(unknown)}; allowed: {sorted(PLAN_KEYS)}")
    engines = spec.get("engines") or []
    if isinstance(engines, str) or not isinstance(engines, list | tuple):
        raise InteropError(f"export.engines must be a list such as [llamacpp, vllm], got {engines!r}")
    known = ENGINES[:-1]
    for e in engines:
        if e not in known:
            raise InteropError(f"export.engines: unknown engine {e!r}; choose from {', '.join(known)}")
    if len(set(engines)) != len(engines):
        raise InteropError(f"export.engines names an engine twice: {list(engines)}")
    dtype = spec.get("dtype") or "bf16"
    if dtype not in EXPORT_DTYPES:
        raise InteropError(f"export.dtype {dtype!r}: choose from {', '.join(EXPORT_DTYPES)}")
    return list(engines), dtype


def serving_format(drafter: Any) -> str:
    return "dspark-hf" if isinstance(drafter, Drafter) else "eagle3-hf"


def check_servable(drafter: Any, engines: list[str]) -> None:
    """Raise :class:`InteropError` in one line naming the engines and the option when ``drafter`` (trained or not)
    could not be exported for one of ``engines``."""
    if not engines:
        return
    try:
        if serving_format(drafter) == "dspark-hf":
            check_dspark(drafter, trained=False)
            for engine in engines:
                refuse_dspark(drafter, HEADS.get(type(drafter.seq_head)), engine)
        else:
            check_eagle3(drafter, trained=False)
            for engine in engines:
                refuse_eagle3(engine)
    except InteropError as exc:
        raise InteropError(
            f"export.engines [{', '.join(engines)}]: {exc}; or train for no engine: export: {{engines: []}}"
        ) from None


def export_for_engines(
    native: Path, fmt: str, engines: list[str], dtype: str = "bf16", log: Callable[[str], None] = print
) -> dict[str, Path]:
    """After ``fit``: one ``fmt`` export per engine in ``<native>/../serving/<engine>``; returns those written.

    Never raises (training is done): an export that cannot be written is reported in one line, with the exact
    command for llama.cpp's GGUF when its converter is not on this machine."""
    from .convert import export_drafter

    done: dict[str, Path] = {}
    for engine in engines:
        out = native.parent / SERVING_DIR / engine
        try:
            res = export_drafter(native, fmt, out, dtype=dtype, engine=engine, overwrite=True)
        except LlamaCppUnavailable as exc:
            cmd = f"dspark-lightning export --drafter {native} --engine llamacpp --out {out}"
            log(f"[dspark-lightning] {exc}; then: {cmd}")
            continue
        except (InteropError, OSError) as exc:
            log(f"[dspark-lightning] no {engine} export: {' '.join(str(exc).split())}")
            continue
        done[engine] = res.path
        files = ", ".join(sorted(p.name for p in res.path.iterdir() if p.is_file()))
        log(f"[dspark-lightning] {engine} export -> {res.path} ({files})")
        for note in res.notes:
            log(f"[dspark-lightning] note: {note}")
    if "llamacpp" in done:
        gguf = done["llamacpp"] / "draft.gguf"
        log(
            "[dspark-lightning] serve it: llama-server -m <target.gguf> -md "
            f"{gguf} --spec-type draft-dspark --spec-draft-n-max <block size> (docs/serving.md)"
        )
    return done


__all__ = ["check_servable", "export_for_engines", "plan_args", "serving_format"]
