"""An exported drafter (any layout we read) to a layout servers load (the ``export`` command's work).

``native`` re-saves our own layout; the registered serving layouts (layouts.py: ``dspark-hf`` writes
``Qwen3DSparkModel``, ``eagle3-hf`` ``LlamaForCausalLMEagle3``) build the files, and ``server`` (vllm, sglang,
deepspec, llamacpp, all) makes them exact for that server and adds its own files (servers.py).
A drafter a layout or server cannot represent is refused with the reason (:class:`~.common.InteropError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_dir, atomic_write
from ..checkpoint.files import EXPORT_TAG, artifact_entry, read_config
from ..checkpoint.native import load_target_and_drafters, save_drafter
from ..registry import Component
from .common import DEFAULT_NUM_ANCHORS, EXPORT_DTYPES, InteropError, kept_on_overwrite, prepare_out, write_layout
from .layouts import Layout, as_layout, vet
from .servers import ALL, ExportJob, check_server, writers


@dataclass
class ExportResult:
    path: Path
    layout: str
    dtype: str
    tensors: int
    notes: list[str] = field(default_factory=list)


@artifact_entry("drafter")
def export_drafter(
    drafter_dir: str | Path,
    layout: Any,
    out: str | Path,
    *,
    dtype: str | None = None,
    overwrite: bool = False,
    target: Any = None,
    server: str | None = None,
    target_gguf: bool = False,
) -> ExportResult:
    """Load ``drafter_dir`` (our layout or a serving one) and write it to ``out`` in ``layout``: ``native``, or a
    registered serving layout (:func:`~.layouts.serving_layouts`: ``dspark-hf``, ``eagle3-hf``, a plugin's) named
    as a component is, with its settings: ``"dspark-hf"``, ``{"class_path": "dspark-hf", "init_args":
    {"num_anchors": 256}}``.

    ``dtype``: ``bf16`` (serving default; the confidence head stays fp32) or ``fp32`` (native default: as stored).
    ``target``: a Target or a target name/directory; default the one a native export records.
    ``server``: ``vllm`` / ``sglang`` / ``deepspec`` / ``llamacpp`` / ``all`` (exactly what that server reads), or
    None (generic). ``llamacpp`` adds ``draft.gguf`` (llama.cpp's converter), and with ``target_gguf`` the target's
    own ``target.gguf`` in the same precision.
    """
    src, out = Path(drafter_dir), Path(out)
    layout = Component.unwrap(Component(layout)) if isinstance(layout, str) else layout
    native = layout == "native"
    layout = layout if native else as_layout(layout)  # its settings are checked before the drafter is loaded
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise InteropError(f"unknown dtype {dtype!r}; choose from {', '.join(EXPORT_DTYPES)}")
    check_server(server)
    if server is not None and native:
        raise InteropError("--server applies to the serving layouts (dspark-hf, eagle3-hf), not native")
    if target_gguf and server not in (ALL, "llamacpp"):
        raise InteropError("--target_gguf writes llama.cpp's GGUF of the target: use it with --server llamacpp or all")
    if out.resolve() == src.resolve():
        raise InteropError("--out must differ from --drafter")
    cfg = read_config(src)
    if target is None and "format_version" not in cfg:
        raise InteropError(f"{src} is a serving checkpoint that does not name our target: pass --target")
    target, (drafter,) = load_target_and_drafters(target, [src], dtype=torch.float32, device="cpu", drafter_dtype=None)
    if native:
        return _native(drafter, target, src, out, dtype, overwrite)
    if getattr(layout, "num_anchors", 0) is None and cfg.get("num_anchors"):  # a serving source's own value
        layout.num_anchors = cfg["num_anchors"]
    return export_serving(drafter, target, layout, out, dtype=dtype or "bf16", overwrite=overwrite, server=server,
                          target_gguf=target_gguf)  # fmt: skip


@artifact_entry("drafter")
def export_serving(
    drafter: Any,
    target: Any,
    layout: Any,
    out: str | Path,
    *,
    dtype: str = "bf16",
    overwrite: bool = False,
    server: str | None = None,
    target_gguf: bool = False,
) -> ExportResult:
    """Write an in-memory drafter in a registered serving layout (``dspark-hf``, ``eagle3-hf``, a plugin's; named
    as in :func:`export_drafter`, or a built :class:`~.layouts.Layout`), exact for ``server`` (its rules for that
    layout: refused if it has none), then each server's own files."""
    check_server(server)
    out, tdtype = Path(out), EXPORT_DTYPES[dtype]
    layout: Layout = as_layout(layout)
    notes = vet(layout.name, drafter, target, server)
    config, state, extra, built = layout.build(drafter, target, dtype=tdtype, server=server)
    servers, left_out = writers(server, layout.name, drafter, target)
    notes += built + left_out
    anchors = getattr(layout, "num_anchors", None) or DEFAULT_NUM_ANCHORS
    job = ExportJob(dtype, int(anchors), target_gguf, strict=server != ALL, out=out)
    prepare_out(out, overwrite)
    write_layout(out, config, state, extra, _server_files(servers, job, drafter, target, notes))
    return ExportResult(out, layout.name, dtype, len(state), notes)


def _server_files(servers: list[Any], job: ExportJob, drafter: Any, target: Any, notes: list[str]):
    """``finish`` for :func:`write_layout`: each server's own files (:meth:`~.servers.Server.write`), refused if one
    replaces a file of the layout."""

    def run(folder: Path) -> None:
        for s in servers:
            before = _stamps(folder)
            notes.extend(s.write(folder, drafter, target, job))
            after = _stamps(folder)
            changed = sorted(n for n, st in before.items() if after.get(n) != st)
            if changed:
                raise InteropError(f"{s.name}: its write() replaced or removed the export's {', '.join(changed)}")

    return run


def _stamps(folder: Path) -> dict[str, tuple[int, int, int]]:
    """File name -> (inode, size, mtime): what changes when a file is rewritten, replaced or removed."""
    return {p.name: (st.st_ino, st.st_size, st.st_mtime_ns) for p in folder.iterdir() for st in [p.stat()]}


def _native(drafter: Any, target: Any, src: Path, out: Path, dtype: str | None, overwrite: bool) -> ExportResult:
    """Re-save in our own layout; calibration files travel when the weights are unchanged (their hash matches)."""
    if dtype is not None:
        drafter = drafter.to(EXPORT_DTYPES[dtype])
    prepare_out(out, overwrite)
    notes, kept = [], 0
    with atomic_dir(out, tag=EXPORT_TAG, what="export", carry=kept_on_overwrite) as tmp:  # all of it or none
        save_drafter(drafter, tmp, target, overwrite=True)
        sha = read_config(tmp)["weights_sha256"]
        for f in sorted(src.glob("calibration_T*.json")):
            if json.loads(f.read_text()).get("weights_sha256") == sha:
                atomic_write(tmp / f.name, f.read_bytes())
                kept += 1
    if getattr(drafter, "calibrations", None) and not kept:
        notes.append("STS calibration not carried over: it is tied to the source weights' hash (recalibrate)")
    return ExportResult(out, "native", dtype or "as stored", len(drafter.state_dict()), notes)
