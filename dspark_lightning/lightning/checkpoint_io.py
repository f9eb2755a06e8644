"""Checkpoints that are whole or absent, and a ``--ckpt_path last`` that only picks readable ones.

Lightning's :class:`~lightning.pytorch.plugins.io.TorchCheckpointIO` writes through an fsspec transaction whose temp
file lives in the system temp folder: on another file system the final move is a copy, and a disk that fills during
it leaves a truncated ``.ckpt`` under its final name. :class:`AtomicCheckpointIO` streams ``torch.save`` into a temp
file next to the checkpoint instead, fsyncs it and renames it (:func:`~dspark_lightning.atomic.atomic_writer`);
the DSpark CLI installs it unless the recipe names a ``CheckpointIO`` plugin of its own.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ..atomic import atomic_writer


class AtomicCheckpointIO(TorchCheckpointIO):
    """``save_checkpoint``: a temp file in the checkpoint's own folder, fsync, ``os.replace``, fsync of the folder.

    Remote paths (``s3://...``) keep Lightning's own writer. A full disk raises
    :class:`~dspark_lightning.atomic.DiskFullError` and leaves the previous checkpoint of that name untouched.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or ("://" in str(path) and not str(path).startswith("file://")):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(str(path).removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_writer(path) as f:
            torch.save(checkpoint, f)


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be resumed from (None: it reads back). A torch checkpoint is a zip archive: a truncated
    one has no central directory, a damaged one fails a member's CRC; both are caught without unpickling."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, RuntimeError, ValueError) as exc:
        return f"not a complete torch zip archive ({type(exc).__name__}: {' '.join(str(exc).split())})"
    if bad is not None:
        return f"member {bad} fails its CRC check (damaged)"
    return None
