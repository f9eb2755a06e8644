"""Save / load a drafter as a directory: config.json + model.safetensors (+ calibration_T<T>.json files).

The directory records the block convention, the target name, its layer ids and chat format, the
registered names and hyperparameters of every part, a SHA-256 of the weights and one of the rest of
config.json (``config_sha256``: block size, mask token, geometry, parts, convention, target...). Loading
rebuilds the parts through the registry (no pickles) and refuses a mismatched target, an edited
config.json, altered or non-finite weights. An export is written to a temp directory and swapped into
place, so a killed or failed export leaves no directory that looks like one and the previous export intact (its
temp is removed next time).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_safetensors

from ..atomic import atomic_dir, atomic_write, recover_dir
from ..checks import UsageError, drafter_config, short
from ..drafters import CONVENTION, Drafter, build_drafter
from ..drafters.drafter import check_draft_vocab
from ..locks import LOCK_FILE
from ..targets import ChatFormat, load_target
from .calibration import load_calibrations, load_confidence_maps
from .files import (
    EXPORT_TAG,
    FORMAT_VERSION,
    OWN_FILES,
    DrafterLoadError,
    artifact_entry,
    check_finite,
    check_native_config,
    check_serving_config,
    config_field,
    config_sha256,
    file_errors,
    is_serving_config,
    one_line,
    place_drafter,
    read_config,
    read_safetensors,
    weights_sha256,
)


def save_drafter(
    drafter: Drafter,
    path: str | Path,
    target: Any,
    extra: dict[str, Any] | None = None,
    overwrite: bool = False,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``path/config.json`` and ``path/model.safetensors``. Refuses a non-empty directory unless ``overwrite``,
    and non-finite weights.

    ``state``: the weights to write (default ``drafter.state_dict()``), e.g. the full state gathered from FSDP shards.
    Both files are written to a temp directory next to ``path``, which then replaces ``path`` in one swap
    (:func:`~dspark_lightning.atomic.atomic_dir`): a failure (a full disk) or a kill leaves the previous export as
    it was, and the temp folder of a killed export is removed by the next one.
    """
    path = Path(path)
    recover_dir(path, EXPORT_TAG, "export")  # an export killed mid-swap: the previous folder comes back first
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"export path {path} exists and is not a directory")
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"export directory {path} is not empty; refusing to overwrite it")
    state = {k: v.detach().cpu().contiguous() for k, v in (drafter.state_dict() if state is None else state).items()}
    check_finite(state, f"refusing to export {path}", ValueError)
    cfg = {
        "format_version": FORMAT_VERSION,
        "target": target.describe(),
        **drafter.config(),
        "weights_sha256": weights_sha256(state),
        **(extra or {}),
    }
    cfg["config_sha256"] = config_sha256(cfg)
    with atomic_dir(path, tag=EXPORT_TAG, what="export", carry=_carried) as tmp:
        atomic_write(tmp / "model.safetensors", save_safetensors(state, metadata=weights_record(cfg)))
        atomic_write(tmp / "config.json", json.dumps(cfg, indent=2) + "\n")
    return path


def _carried(name: str) -> bool:
    """What an overwrite keeps of the previous export: files it does not write itself (calibration files stay and
    are checked against the new weights' hash on load), not the folder lock of a command that works on it."""
    return name not in OWN_FILES and name != LOCK_FILE


# config.json fields the weights file records in its safetensors header: what decides how the weights are used and
# that their shapes cannot tell (the block size, the mask token, the tapped layers), plus the config's hash.
RECORDED = {
    "block_size": lambda cfg: cfg.get("block_size"),
    "mask_token_id": lambda cfg: cfg.get("mask_token_id"),
    "layer_ids": lambda cfg: (cfg.get("geometry") or {}).get("layer_ids"),
}
RECORD_PREFIX = "dspark."


def weights_record(cfg: dict[str, Any]) -> dict[str, str]:
    """The safetensors metadata of an export's weights: :data:`RECORDED` fields of ``cfg`` and its hash."""
    rec = {RECORD_PREFIX + k: json.dumps(get(cfg)) for k, get in RECORDED.items()}
    return rec | {RECORD_PREFIX + "config_sha256": cfg["config_sha256"]}


def check_config_hash(cfg: dict[str, Any], path: Path) -> None:
    """An edited config.json (``block_size``, ``mask_token_id``, ...) would be used as is: refuse it. Without its
    ``config_sha256`` the config is checked against what the weights file records (:func:`weights_record`):
    it loads with a note, and a field that contradicts the weights' record is refused."""
    stored = cfg.get("config_sha256")
    if stored is not None:
        if stored != config_sha256(cfg):
            raise DrafterLoadError(
                f"{path}/config.json does not match its config_sha256: it was edited after export; re-export the "
                "drafter"
            )
        return
    record = _weights_metadata(path / "model.safetensors")
    if record.get(RECORD_PREFIX + "config_sha256") == config_sha256(cfg):  # only the hash key was dropped
        warnings.warn(f"{path}/config.json has no config_sha256: it is the config its weights were exported with",
                      stacklevel=3)  # fmt: skip
        return
    checked = []
    for key, get in RECORDED.items():
        raw = record.get(RECORD_PREFIX + key)
        if raw is None:
            continue
        if json.loads(raw) != get(cfg):
            raise DrafterLoadError(
                f"{path}/config.json has no config_sha256 and says {key} = {get(cfg)}, but its weights were exported "
                f"with {key} = {json.loads(raw)} (model.safetensors records it); restore config.json or re-export"
            )
        checked.append(key)
    said = f"{', '.join(checked)} checked against the weights" if checked else "its fields are not integrity-checked"
    warnings.warn(f"{path}/config.json has no config_sha256: {said}", stacklevel=3)


def _weights_metadata(wfile: Path) -> dict[str, str]:
    try:
        return read_safetensors(wfile)[1]
    except Exception:  # noqa: BLE001 - an unreadable file is reported by the weights load that follows
        return {}


def check_compatible(cfg: dict[str, Any], target: Any, where: str) -> None:
    """One-line errors for a drafter whose geometry, block convention or chat format does not match the target."""
    check_geometry(cfg["geometry"], target, where)
    if "convention" not in cfg:
        raise DrafterLoadError(
            f"{where}: config.json has no 'convention' key (the block convention the drafter was trained in)"
        )
    if cfg["convention"] != CONVENTION:
        raise DrafterLoadError(f"{where}: block convention {cfg['convention']!r}, this runtime uses {CONVENTION!r}")
    check_chat_format(cfg, target, where)


def check_geometry(g: dict[str, Any], target: Any, where: str) -> None:
    """The drafter's ``hidden_size`` and ``vocab_size`` against the target's; a target that taps other layers than
    the drafter's ``layer_ids`` is re-tapped to them (:meth:`~dspark_lightning.targets.Target.tap`: taps are which
    hidden states the target returns, not weights). Layers the target cannot tap, or a target object without
    ``tap``, are refused in one line."""
    tg = target.geometry
    for key in ("hidden_size", "vocab_size"):
        if g[key] != getattr(tg, key):
            raise DrafterLoadError(
                f"{where}: drafter {key}={g[key]} does not match target {target.name!r} {key}={getattr(tg, key)}"
            )
    ids = list(g["layer_ids"])
    if ids == list(tg.layer_ids):
        return
    tap = getattr(target, "tap", None)
    try:
        if tap is None:
            raise UsageError(f"it taps {list(tg.layer_ids)} and cannot be re-tapped")
        tap(ids)
    except ValueError as exc:
        raise DrafterLoadError(
            f"{where}: drafter was trained on target layers {ids}, which target {target.name!r} cannot tap ({exc})"
        ) from exc


def recorded_target_args(path: str | Path) -> dict[str, Any]:
    """``load_target`` keyword arguments that match what the drafter at ``path`` was trained with (tapped layers,
    chat format), so ``--target NAME --drafter DIR`` loads the target the drafter expects."""
    where = str(Path(path) / "config.json")
    cfg = read_config(Path(path))
    if "target" in cfg:  # our export
        ids = config_field(cfg, "target.geometry.layer_ids", "ints", where)
        chat = config_field(cfg, "target.chat", "dict", where, optional=True) or {}
        try:
            return {"layer_ids": list(ids), "chat": ChatFormat(**chat)}
        except TypeError as exc:  # a key ChatFormat does not take
            raise DrafterLoadError(f"{where}: target.chat {short(chat, 80)} is not a chat format ({exc})") from exc
    if "target_layer_ids" in cfg:  # a serving layout
        return {"layer_ids": list(config_field(cfg, "target_layer_ids", "ints", where))}
    return {}


def check_chat_format(cfg: dict[str, Any], target: Any, where: str) -> None:
    """The drafter learnt the target's features of conversations rendered one way (template on/off, system prompt):
    a target that renders them another way feeds it features it never saw. Lossless either way, but τ collapses
    silently, so refuse; load the target with the recorded ``ChatFormat`` instead."""
    recorded = (cfg.get("target") or {}).get("chat")
    if recorded is None:
        return  # exports that predate the record
    have = target.chat.to_dict()
    if any(recorded.get(k) != v for k, v in have.items()):
        raise DrafterLoadError(
            f"{where}: drafter was trained with chat format {recorded}, the target renders {have}; load the target "
            "with chat=ChatFormat(**that) (the recipe's target.system_prompt)"
        )


@artifact_entry("drafter")
def load_drafter(
    path: str | Path,
    target: Any = None,
    map_location: str | torch.device | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> Drafter:
    """Rebuild an exported drafter. ``target`` defaults to the one recorded in config.json, loaded with the tapped
    layers and chat format the drafter was trained with; a ``target`` given that taps other layers is re-tapped to the
    drafter's (:func:`check_geometry`), so ``load_drafter(path)`` and ``load_target(name)`` compose in ``decode()``.

    ``device`` (``map_location`` is its older name): where the drafter runs, default the target's device (the
    drafter shares the target's embedding and LM head, so both must be on one device). ``dtype``: the drafter's
    weights, default the target's dtype, ``"auto"`` the fastest on this device (measured on a CPU; what
    ``decode()`` and the CLI use); its precision never affects losslessness (the laws are fp32).
    A serving ``Qwen3DSparkModel`` directory (DeepSpec, ``dspark-lightning export --layout dspark-hf``) is read
    too; it records no target of ours, so pass ``target``.
    """
    path = Path(path)
    cfg = read_config(path)
    if is_serving_config(cfg):  # a serving layout (DeepSpec / vLLM / SGLang): read by a registered layout reader
        drafter = read_layout(path, cfg, target, device if device is not None else map_location, dtype)
        check_finite(drafter.state_dict(), str(path))
        return drafter
    if cfg.get("format_version") != FORMAT_VERSION:
        raise DrafterLoadError(
            f"{path}: format_version {cfg.get('format_version')!r}; this version reads "
            f"{FORMAT_VERSION} (export the drafter again with it)"
        )
    check_native_config(cfg, str(path / "config.json"))
    check_config_hash(cfg, path)
    if target is None:
        target = load_target(cfg["target"]["name"], **recorded_target_args(path))
    check_compatible(cfg, target, str(path))
    try:  # the parts' constructors check their arguments (the registry their types)
        drafter = build_drafter(target, cfg["block_size"], **_recorded_parts(cfg))
    except (UsageError, ValueError, RuntimeError) as exc:
        where = path / "config.json"
        raise DrafterLoadError(f"{where}: the drafter it describes cannot be built: {one_line(exc)}") from exc
    wfile = path / "model.safetensors"
    try:
        state = read_safetensors(wfile)[0]
    except (OSError, *file_errors()) as exc:  # missing, truncated or not safetensors (safetensors' own error type)
        raise DrafterLoadError(f"{wfile} is not a readable safetensors file ({one_line(exc)})") from exc
    if weights_sha256(state) != cfg["weights_sha256"]:
        raise DrafterLoadError(f"{wfile} does not match the weights hash in config.json")
    check_finite(state, str(wfile))
    try:
        drafter.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # torch names every missing, unexpected or mis-shaped tensor
        raise DrafterLoadError(f"{wfile}: the weights do not fit the drafter config.json describes: {one_line(exc)}"
                               ) from exc  # fmt: skip
    vocab = getattr(drafter, "draft_vocab", None)
    if vocab is not None:
        try:
            check_draft_vocab(vocab, vocab.numel(), target.geometry.vocab_size)
        except ValueError as exc:
            raise DrafterLoadError(f"{path}: invalid draft vocabulary: {exc}") from exc
    drafter = place_drafter(drafter, target, device if device is not None else map_location, dtype)
    drafter.source_dir = str(path)
    drafter.calibrations = load_calibrations(path, cfg["weights_sha256"])  # {sampling T: STS temperatures}
    drafter.confidence_maps = load_confidence_maps(path, cfg["weights_sha256"])  # {sampling T: chosen map}
    return drafter.eval()


def read_layout(path: Path, cfg: dict[str, Any], target: Any, device=None, dtype=None) -> Drafter:
    """A working drafter from a serving directory (config.json names an HF architecture instead of our
    ``format_version``), read by the first registered ``layout`` whose ``claims(cfg)`` is true and placed like
    :func:`load_drafter` places ours. A layout reader is ``claims(cfg) -> bool`` and ``read(path, cfg, target) ->
    Drafter`` (the built-in one: ``export/layouts.py``, DeepSpec's ``Qwen3DSparkModel``)."""
    from ..registry import get, names

    check_serving_config(cfg, str(path / "config.json"))
    readers = [n for n in names("layout") if getattr(get("layout", n), "reads", True)]  # not the write-only ones
    for name in readers:
        reader = get("layout", name)
        if reader.claims(cfg):
            drafter = reader.read(path, cfg, target)
            drafter.source_dir = str(path)
            return place_drafter(drafter, target, device, dtype).eval()
    raise DrafterLoadError(
        f"{path / 'config.json'}: architectures {cfg.get('architectures')} is not a layout load_drafter reads "
        f"(ours, or a registered layout: {', '.join(readers)})"
    )


def load_drafter_checked(path: str | os.PathLike, target: Any, dtype: Any = None) -> Any:
    """:func:`load_drafter` after :func:`~dspark_lightning.checks.drafter_config`: a failure that comes from the files
    (a truncated weights file, a component argument out of range) is one :class:`DrafterLoadError` naming the folder
    (:func:`~.files.artifact_entry`); a bug in our code keeps its traceback."""
    drafter_config(path)
    return load_drafter(Path(path), target, dtype=dtype)


def _recorded_parts(cfg: dict[str, Any]) -> dict[str, Any]:
    """The :func:`~dspark_lightning.drafters.build_drafter` arguments config.json records: one registered drafter
    (eagle3, mtp1) with its arguments, or the parts of a composed one."""
    if "drafter" in cfg:
        return {"drafter": cfg["drafter"]}
    return {
        "backbone": cfg["backbone"],
        "seq_head": cfg["seq_head"],
        "conf_head": cfg["conf_head"] or None,
        "mask_token_id": cfg["mask_token_id"],
        "draft_vocab_size": cfg["geometry"].get("draft_vocab_size"),
    }


def load_target_and_drafters(
    target: str | None, drafters: Sequence[str | os.PathLike] = (), *, dtype: Any = "auto", device: Any = "auto",
    drafter_dtype: Any = "auto",
) -> tuple[Any, list[Drafter]]:  # fmt: skip
    """The one way to load a target and its drafters: ``target`` (a loaded target is used as it is; a name or
    directory; None: the one the first drafter records) with the tapped layers and chat format the first drafter was
    trained with, then every drafter beside it (:func:`load_drafter_checked`; a loaded target is re-tapped to the
    drafters' layers, which must be one set: :func:`check_same_taps`). Every failure is one line naming the file or
    the target."""
    from ..targets import load_target_checked

    first = drafters[0] if drafters else None
    if target is None:
        if first is None:
            raise UsageError("give --target or a --drafter")
        target = read_config(Path(first)).get("target", {}).get("name")
        if not target:
            raise UsageError(f"drafter {first} records no target of ours; give --target")
    check_same_taps(drafters)
    if isinstance(target, str | os.PathLike):
        recorded = recorded_target_args(first) if first is not None else {}
        target = load_target_checked(str(target), dtype=dtype, device=device, **recorded)
    return target, [load_drafter_checked(d, target, drafter_dtype) for d in drafters]


def check_same_taps(drafters: Sequence[str | os.PathLike]) -> None:
    """Drafters loaded beside one target must read the same target layers: the target taps one set at a time
    (:meth:`~dspark_lightning.targets.Target.tap`). Checked on their config.json before anything is loaded; a
    folder whose config cannot be read is reported by its load."""
    seen: dict[tuple[int, ...], str | os.PathLike] = {}
    for d in drafters:
        try:
            ids = recorded_target_args(d).get("layer_ids")
        except (OSError, ValueError):  # a folder that cannot be read (a UsageError) fails its own load, in one line
            continue
        if ids is None:
            continue
        seen.setdefault(tuple(ids), d)
    if len(seen) > 1:
        (a, da), (b, db) = list(seen.items())[:2]
        raise UsageError(
            f"drafters {da} and {db} read different target layers ({list(a)} and {list(b)}); one target taps one "
            "set at a time: load them in separate runs"
        )
