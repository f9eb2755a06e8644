"""The checks of a recipe's sections that ``fit`` / ``validate`` / ``test`` / ``prepare`` run before anything is built:
the trainer's counts, the data and model sizes, no ``null`` for a required value, the folders they write. The generic
validators they use are :mod:`dspark_lightning.checks`."""

from __future__ import annotations

import os
from typing import Any

from ..checks import (
    UsageError,
    at_least,
    block_size,
    in_range,
    output_dir,
    regular_entries,
    section_get,
)


def data_args(data: Any, datamodule: Any = None) -> None:
    """A recipe's ``data:`` section (``fit``, ``prepare``) as parsed, before it is built: no ``null`` for a
    non-optional argument of ``datamodule`` (``DSparkDataModule``), whose constructor checks the values' ranges, and
    a target folder that holds only regular files."""
    if datamodule is not None:
        not_null("data", data, datamodule)
    target = section_get(data, "target")
    name = target if isinstance(target, str) else section_get(target, "name")
    if isinstance(name, str) and os.path.isdir(name):
        regular_entries("target.name", name)


def model_args(model: Any) -> None:
    """A recipe's ``model:`` section, the parts cheap to check before the target loads: the block size (a huge one
    allocates hundreds of GB at construction) and the mask token's sign (its upper bound needs the vocabulary)."""
    block_size("model.block_size", section_get(model, "block_size"))
    mask = section_get(model, "mask_token_id")
    if mask is not None:
        at_least("model.mask_token_id", mask, 0)


def rank_args(rank: int | None, world_size: int | None) -> None:
    """``--rank`` / ``--world_size`` of a sharded command: 0 <= rank < world_size."""
    at_least("--rank", rank, 0)
    at_least("--world_size", world_size, 1)
    if rank is not None and world_size is not None and rank >= world_size:
        raise UsageError(f"--rank {rank} is not below --world_size {world_size}")


def _int_or_fraction(name: str, value: Any, low: int, fraction_low_open: bool) -> None:
    """An integer >= ``low`` (a count) or a float in [0, 1] / (0, 1] (a fraction), as Lightning reads them."""
    if value is None:
        return
    if isinstance(value, float) and not isinstance(value, bool):
        in_range(name, value, 0.0, 1.0, open_low=fraction_low_open)
    elif isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = "(0, 1]" if fraction_low_open else "[0, 1]"
        raise UsageError(f"{name} must be an integer >= {low} or a fraction in {what}, got {value!r}")


def trainer_args(trainer: Any) -> None:
    """A recipe's ``trainer:`` options that Lightning divides by or loops on, in range before anything is built
    (``val_check_interval: 0`` or ``accumulate_grad_batches: 0`` would otherwise fail deep in the loop, and
    ``max_steps: 0`` train nothing and export an untrained drafter)."""
    if trainer is None:
        return
    for key, low in (("accumulate_grad_batches", 1), ("log_every_n_steps", 1), ("check_val_every_n_epoch", 1),
                     ("num_nodes", 1), ("min_steps", 0), ("min_epochs", 0), ("num_sanity_val_steps", -1),
                     ("reload_dataloaders_every_n_epochs", 0)):  # fmt: skip
        at_least(f"trainer.{key}", section_get(trainer, key), low)
    for key in ("max_steps", "max_epochs"):
        v = section_get(trainer, key)
        if v is not None and v != -1 and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(f"trainer.{key} must be -1 (no limit) or an integer >= 1, got {v!r}")
    _int_or_fraction("trainer.val_check_interval", section_get(trainer, "val_check_interval"), 1, True)
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "overfit_batches"):
        _int_or_fraction(f"trainer.{key}", section_get(trainer, key), 0, False)
    in_range("trainer.gradient_clip_val", section_get(trainer, "gradient_clip_val"), 0.0)
    devices = section_get(trainer, "devices")
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    bad = (isinstance(devices, bool) or (isinstance(devices, int) and devices != -1 and devices < 1)
           or (isinstance(devices, list | tuple) and (not devices or any(
               isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices))))  # fmt: skip
    if bad:
        raise UsageError(f"trainer.devices must be 'auto', -1 (all), a count >= 1 or a non-empty list of device "
                         f"indices, got {devices!r}")  # fmt: skip


_MISSING = object()


def _admits_none(hint: Any) -> bool:
    import types
    import typing

    if hint is None or hint is Any or hint is type(None):
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_admits_none(a) for a in typing.get_args(hint))
    return False


def _dataclass_of(hint: Any) -> Any:
    import dataclasses
    import typing

    for h in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(h):
            return h
    return None


def not_null(prefix: str, section: Any, cls: Any) -> None:
    """Keys of ``cls`` (its ``__init__`` or dataclass fields) typed without ``None`` must not be given ``null``
    (``model.block_size: null`` would otherwise reach the drafter as None); nested dataclasses (``data.regen``) and
    ``class_path`` components (``model.backbone.init_args``) are followed."""
    import importlib
    import inspect
    import typing

    if section is None or cls is None:
        return
    try:
        hints = typing.get_type_hints(cls.__init__ if not hasattr(cls, "__dataclass_fields__") else cls)
        params = [p for p in inspect.signature(cls).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
                  or p.kind is p.KEYWORD_ONLY]  # fmt: skip
    except Exception:  # noqa: BLE001 - hints that do not resolve: jsonargparse checks the types itself
        return
    for p in params:
        value, hint = section_get(section, p.name, _MISSING), hints.get(p.name)
        if value is None and hint is not None and not _admits_none(hint):
            raise UsageError(f"{prefix}.{p.name} must not be null: it is {_type_name(hint)}")
        if value is _MISSING or value is None:
            continue
        sub = _dataclass_of(hint)
        if sub is not None:
            not_null(f"{prefix}.{p.name}", value, sub)
        elif isinstance(section_get(value, "class_path"), str):
            module, _, name = section_get(value, "class_path").rpartition(".")
            try:
                component = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError):
                continue  # jsonargparse names an unknown class itself
            not_null(f"{prefix}.{p.name}.init_args", section_get(value, "init_args"), component)


def _type_name(hint: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, f"{hint}")


def lightning_args(cfg: Any, classes: dict[str, Any]) -> None:
    """What ``fit`` / ``validate`` / ``test`` check before anything is built, beyond :func:`model_args` and
    :func:`data_args`: the trainer's counts, no ``null`` for a required value, the folders it writes."""
    trainer_args(section_get(cfg, "trainer"))
    for prefix, cls in classes.items():
        not_null(prefix, section_get(cfg, prefix), cls)
    output_dir("trainer.default_root_dir", section_get(section_get(cfg, "trainer"), "default_root_dir"))
    output_dir("data.work_dir", section_get(section_get(cfg, "data"), "work_dir"))
