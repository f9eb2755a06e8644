"""An exported drafter (any layout we read) to a layout servers load (the ``export`` command's work).

``native`` re-saves our own layout; ``dspark-hf`` writes ``Qwen3DSparkModel``; ``eagle3-hf`` writes
``LlamaForCausalLMEagle3``; ``server`` (vllm, sglang, deepspec, all) makes it exact for that server (servers.py).
A drafter a layout or server cannot represent is refused with the reason (:class:`~.common.InteropError`).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_dir, atomic_write
from ..checkpoint.files import EXPORT_TAG, artifact_entry, read_config, weights_sha256
from ..checkpoint.native import load_drafter, save_drafter
from ..targets import ChatFormat, Target, load_target
from .common import (
    CALIBRATION_FILE,
    EXPORT_DTYPES,
    InteropError,
    cast_state,
    kept_on_overwrite,
    prepare_out,
    write_hf,
    write_layout,
)
from .dspark_hf import (
    KEEP_FP32,
    calibration_doc,
    check_dspark,
    dspark_config,
    dspark_state,
    head_type,
    is_dspark_config,
)
from .eagle3_hf import check_eagle3, eagle3_config, eagle3_state
from .llamacpp import GGUF_FILE, OUTTYPES, TARGET_GGUF_FILE, check_target, convert, target_dir
from .servers import (
    ALL,
    check_server,
    dspark_additions,
    eagle3_additions,
    gguf_wanted,
    refuse_dspark,
    refuse_eagle3,
    server_for,
    wanted,
)

LAYOUTS = ("native", "dspark-hf", "eagle3-hf")  # what ``export --layout`` writes
DEFAULT_NUM_ANCHORS = 512  # docs/algorithm.md §4; informational for serving, and our native export does not record it


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
    layout: str,
    out: str | Path,
    *,
    dtype: str | None = None,
    overwrite: bool = False,
    target: Any = None,
    num_anchors: int | None = None,
    with_target_vocab: bool = False,
    server: str | None = None,
    target_gguf: bool = False,
) -> ExportResult:
    """Load ``drafter_dir`` (our layout or a serving one) and write it to ``out`` in ``layout`` (:data:`LAYOUTS`).

    ``dtype``: ``bf16`` (serving default; the confidence head stays fp32) or ``fp32`` (native default: as stored).
    ``target``: a Target or a target name/directory; default the one a native export records.
    ``server``: ``vllm`` / ``sglang`` / ``deepspec`` / ``llamacpp`` / ``all`` (exactly what that server reads), or
    None (generic). ``llamacpp`` adds ``draft.gguf`` (llama.cpp's converter), and with ``target_gguf`` the target's
    own ``target.gguf`` in the same precision.
    """
    src, out = Path(drafter_dir), Path(out)
    if layout not in LAYOUTS:
        raise InteropError(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise InteropError(f"unknown dtype {dtype!r}; choose from {', '.join(EXPORT_DTYPES)}")
    check_server(server)
    if server is not None and layout == "native":
        raise InteropError("--server applies to the serving layouts (dspark-hf, eagle3-hf), not native")
    if target_gguf and not (server == ALL or (server is not None and server_for(server).writes_gguf)):
        raise InteropError("--target_gguf writes llama.cpp's GGUF of the target: use it with --server llamacpp or all")
    if out.resolve() == src.resolve():
        raise InteropError("--out must differ from --drafter")
    cfg = read_config(src)
    target = _target_for(src, cfg, target)
    drafter = load_drafter(src, target)
    anchors = num_anchors or cfg.get("num_anchors") or DEFAULT_NUM_ANCHORS
    if layout == "native":
        return _native(drafter, target, src, out, dtype, overwrite)
    return export_serving(drafter, target, layout, out, dtype=dtype or "bf16", overwrite=overwrite,
                          num_anchors=anchors, with_target_vocab=with_target_vocab, server=server,
                          target_gguf=target_gguf)  # fmt: skip


@artifact_entry("drafter")
def export_serving(
    drafter: Any,
    target: Any,
    layout: str,
    out: str | Path,
    *,
    dtype: str = "bf16",
    overwrite: bool = False,
    num_anchors: int = DEFAULT_NUM_ANCHORS,
    with_target_vocab: bool = False,
    server: str | None = None,
    target_gguf: bool = False,
) -> ExportResult:
    """Write an in-memory drafter in a serving layout (``dspark-hf`` or ``eagle3-hf``), exact for ``server``."""
    check_server(server)
    out, tdtype = Path(out), EXPORT_DTYPES[dtype]
    extra: dict[str, Any] = {}
    finish = None
    if layout == "dspark-hf":
        notes = check_dspark(drafter)
        notes += refuse_dspark(drafter, head_type(drafter.seq_head), server, target)
        state = dspark_state(drafter, with_target_vocab)
        config = dspark_config(drafter, target, tdtype, int(num_anchors))
        dspark_additions(config, state, drafter, server)
        state = cast_state(state, tdtype, keep_fp32=KEEP_FP32)
        side = calibration_doc(drafter, weights_sha256(state))
        if side is not None:
            extra[CALIBRATION_FILE] = side
            notes.append(
                f"per-position STS temperatures have no server config key: written to {CALIBRATION_FILE} "
                "(read back by load_drafter; SGLang's scalar sts_temperatures is not set)"
            )
        gguf, why_not = gguf_wanted(drafter, head_type(drafter.seq_head), server, target)
        notes += why_not
        if gguf:
            finish = _gguf_writer(
                drafter, target, dtype, int(num_anchors), target_gguf, strict=server != "all", notes=notes
            )
    elif layout == "eagle3-hf":
        notes = check_eagle3(drafter)
        refuse_eagle3(server)
        state = cast_state(eagle3_state(drafter), tdtype)
        config = eagle3_config(drafter, target, tdtype)
        notes += eagle3_additions(config, list(drafter.geometry.layer_ids), server)
    else:
        raise InteropError(f"{layout!r} is not a serving layout; choose dspark-hf or eagle3-hf")
    prepare_out(out, overwrite)
    write_layout(out, config, state, extra, _server_files(finish, wanted(server), drafter, target, notes))
    return ExportResult(out, layout, dtype, len(state), notes)


def _server_files(finish, servers, drafter: Any, target: Any, notes: list[str]):
    """``finish`` for :func:`write_layout`: ``finish`` (llama.cpp's GGUF, or None), then each server's own files
    (:meth:`~.servers.Server.write`), refused if one replaces a file of the layout."""

    def run(folder: Path) -> None:
        if finish is not None:
            finish(folder)
        for s in servers:
            before = _stamps(folder)
            notes.extend(s.write(folder, drafter, target))
            after = _stamps(folder)
            changed = sorted(n for n, st in before.items() if after.get(n) != st)
            if changed:
                raise InteropError(f"{s.name}: its write() replaced or removed the export's {', '.join(changed)}")

    return run


def _stamps(folder: Path) -> dict[str, tuple[int, int, int]]:
    """File name -> (inode, size, mtime): what changes when a file is rewritten, replaced or removed."""
    return {p.name: (st.st_ino, st.st_size, st.st_mtime_ns) for p in folder.iterdir() for st in [p.stat()]}


def _gguf_writer(
    drafter: Any, target: Any, dtype: str, num_anchors: int, with_target: bool, strict: bool, notes: list[str]
):
    """``finish`` for :func:`write_layout`: llama.cpp's converter on the generic layout (no server's extra tensors: a
    draft GGUF with its own embeddings would also use them as its LM head), in ``dtype``. Not ``strict`` (``all``):
    a conversion llama.cpp refuses becomes a note instead of failing the other servers' folder."""
    try:
        tdir = target_dir(target)  # before any work: a target the converter cannot read is refused first
        check_target(tdir)
    except InteropError as exc:
        if strict:
            raise
        notes.append(f"no draft.gguf in this all-servers folder: {exc}")
        return None

    def finish(folder: Path) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="hf-", dir=folder.parent) as hf:
                write_hf(Path(hf), dspark_config(drafter, target, torch.float32, num_anchors), dspark_state(drafter))
                convert(Path(hf), folder / GGUF_FILE, OUTTYPES[dtype], tdir, what="the drafter")
            if with_target:
                convert(tdir, folder / TARGET_GGUF_FILE, OUTTYPES[dtype], what=f"the target {tdir}")
        except InteropError as exc:
            if strict:
                raise
            notes.append(f"no draft.gguf in this all-servers folder: {exc}")
            for f in (GGUF_FILE, TARGET_GGUF_FILE):
                (folder / f).unlink(missing_ok=True)

    return finish


def _target_for(src: Path, cfg: dict[str, Any], target: Any) -> Any:
    """The target to load ``src`` with: given, or the one a native export records (with its layer ids)."""
    if isinstance(target, Target):
        return target
    if "format_version" in cfg:
        meta = cfg["target"]
        ids, chat = meta["geometry"]["layer_ids"], ChatFormat(**meta["chat"])
        return load_target(target or meta["name"], layer_ids=ids, chat=chat, dtype=torch.float32, device="cpu")
    if target is None:
        raise InteropError(f"{src} is a serving checkpoint that does not name our target: pass --target")
    ids = cfg.get("target_layer_ids") if is_dspark_config(cfg) else None
    return load_target(target, layer_ids=ids, dtype=torch.float32, device="cpu")


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
