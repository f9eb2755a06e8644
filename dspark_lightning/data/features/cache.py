"""The target-feature cache: webdataset tar shards of safetensors members plus ``index.json``.

docs/algorithm.md §4 (features) and §10 (pitfalls).

Layout of a cache directory::

    index.json          {"format", "version", "meta", "shards": [{"name", "num_samples", "bytes", "sha256"}], "totals"}
    shard-000000.tar    members "{00000000..}.safetensors": input_ids int32 (S,), loss_mask uint8 (S,),
    shard-000001.tar    context (S, n*d) and hidden (S, d) in the feature dtype; safetensors metadata
    ...                 {"sample": '{"domain": ..., "id": ...}'}

No pickles anywhere. Caches are written to a temp directory and renamed into place, so a cache directory either is
complete or does not exist; an existing one is never overwritten unless asked. The temp directories of a write that
was killed are removed by the next write to the same path (:func:`remove_orphans`). ``dspark-lightning prepare``
writes one cache per rank (shards named ``shard-r{rank}-{k}.tar``) and :func:`merge_caches` links them into one
directory.

Opening a cache checks sizes and member counts only (cheap); the sha256 of every shard is checked by
:func:`check_shards` (``dspark-lightning check-cache``), an explicit step rather than work on every start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import tarfile
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ...checks import UsageError
from .extract import feature_dtype_name, resolve_feature_dtype

FORMAT = "dspark-feature-cache"
VERSION = 1
INDEX = "index.json"
REQUIRED_META = ("target", "layer_ids", "hidden_size", "n_tapped", "feature_dtype")


# Per-position summaries of the target law over the whole vocabulary (features.target_law_summary), stored so a
# training step can work in the draft-vocabulary space; optional per sample.
LAW_SUMMARY = {"target_lse": torch.float32, "target_top": torch.int32}


class CacheError(UsageError, RuntimeError):
    """A feature cache is missing, corrupt, or was built for another target / feature dtype (a usage error, still a
    ``RuntimeError`` for the callers that catch one)."""


# --- size estimate -------------------------------------------------------------------------------------------------
def estimate_cache_bytes(
    num_tokens: int, hidden_size: int, n_tapped: int, bytes_per_value: int = 2, law_summary: bool = True
) -> int:
    """S·(5 + b·d·(n+1) + 8) bytes: int32 id + uint8 mask, then n tapped layers plus the final hidden per token, and
    (``law_summary``) the target's fp32 log-sum-exp and int32 argmax; without them it is
    S·(5 + b·d·(n+1)) (docs/algorithm.md §4).

    Excludes the index and the per-sample tar/safetensors headers (~1-2 KB per sample)."""
    return int(num_tokens) * (5 + bytes_per_value * hidden_size * (n_tapped + 1) + (8 if law_summary else 0))


def format_bytes(n: float) -> str:
    """Decimal units, as in a "~38 TB" estimate: ``format_bytes(38_000_000_000_000) == "38.0 TB"``."""
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    i = 0
    while abs(n) >= 1000 and i < len(units) - 1:
        n /= 1000
        i += 1
    unit = units[i]
    return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"


def describe_estimate(
    num_tokens: int, target: Any, feature_dtype: str = "bfloat16", num_samples: int | None = None
) -> str:
    """One line to print before writing a cache: tokens, bytes per token and the total."""
    g = target.geometry
    b = resolve_feature_dtype(feature_dtype).itemsize
    per_tok = estimate_cache_bytes(1, g.hidden_size, g.n_tapped, b)
    total = estimate_cache_bytes(num_tokens, g.hidden_size, g.n_tapped, b)
    samples = f" in {num_samples:,} samples" if num_samples is not None else ""
    return (
        f"feature cache estimate: {num_tokens:,} tokens{samples} x {per_tok:,} B/token = {format_bytes(total)} "
        f"({target.name}, d={g.hidden_size}, n={g.n_tapped}, {feature_dtype_name(feature_dtype)}; "
        "plus ~1-2 KB per sample of headers)"
    )


def cache_meta(target: Any, feature_dtype: str = "bfloat16", **extra: Any) -> dict[str, Any]:
    """The standard ``meta`` of a cache built from ``target`` (also a good ``expect`` for :class:`FeatureCache`)."""
    g = target.geometry
    return {
        "target": target.name,
        "layer_ids": list(g.layer_ids),
        "hidden_size": g.hidden_size,
        "n_tapped": g.n_tapped,
        "feature_dtype": feature_dtype_name(feature_dtype),
        "chat": target.chat.to_dict(),
        "geometry": g.to_dict(),
        **extra,
    }


# --- writing -------------------------------------------------------------------------------------------------------
class _HashingFile:
    """Write-only file wrapper that counts bytes and computes the sha256 of what goes to disk."""

    def __init__(self, path: Path):
        self.f = open(path, "wb")  # noqa: SIM115
        self.sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.bytes += len(data)
        return self.f.write(data)

    def close(self) -> None:
        self.f.close()


def _encode_sample(s: dict, meta: dict, dtype: torch.dtype) -> tuple[bytes, int]:
    from safetensors.torch import save

    ids = torch.as_tensor(s["input_ids"]).to(torch.int32).reshape(-1)  # (S,)
    mask = torch.as_tensor(s["loss_mask"]).to(torch.uint8).reshape(-1)  # (S,)
    ctx, hid = s["context"], s["hidden"]
    S, d, n = ids.numel(), meta["hidden_size"], meta["n_tapped"]
    if mask.numel() != S or tuple(ctx.shape) != (S, n * d) or tuple(hid.shape) != (S, d):
        raise UsageError(
            f"sample {s['id']!r}: shapes ids {S}, mask {mask.numel()}, context {tuple(ctx.shape)}, hidden "
            f"{tuple(hid.shape)} do not match (S, n*d={n * d}) / (S, d={d})"
        )
    if ctx.dtype != dtype or hid.dtype != dtype:
        raise UsageError(f"sample {s['id']!r}: features are {ctx.dtype}/{hid.dtype}, the cache holds {dtype}")
    tensors = {"input_ids": ids, "loss_mask": mask, "context": ctx.contiguous().cpu(), "hidden": hid.contiguous().cpu()}
    for k, dt in LAW_SUMMARY.items():  # optional (caches written before they existed lack them)
        if k in s:
            v = torch.as_tensor(s[k]).reshape(-1)
            if v.numel() != S:
                raise UsageError(f"sample {s['id']!r}: {k} has {v.numel()} entries, expected {S}")
            tensors[k] = v.to(dt).contiguous().cpu()
    # one metadata key: safetensors serialises its metadata map in random order, which would break reproducible shards
    sample = json.dumps({"id": str(s["id"]), "domain": str(s.get("domain", ""))}, sort_keys=True)
    return save(tensors, metadata={"sample": sample}), S


def write_cache(
    samples: Iterable[dict],
    out_dir: str | Path,
    meta: dict,
    *,
    shard_max_samples: int = 256,
    overwrite: bool = False,
    progress: bool = True,
    shard_prefix: str = "shard",
) -> Path:
    """Write feature samples (as yielded by :func:`extract_features`) to a new cache directory; returns its path.

    ``meta`` must hold at least :data:`REQUIRED_META` (see :func:`cache_meta`). Fails on duplicate ids and on an
    empty input. Refuses an existing non-empty ``out_dir`` unless ``overwrite``; the old cache is replaced only
    after the new one is complete. Shards are named ``{shard_prefix}-{k:06d}.tar`` (a rank-specific prefix keeps the
    names of different ranks' caches apart when they are merged).
    """
    from tqdm.auto import tqdm
    from webdataset import TarWriter

    out = Path(out_dir)
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise UsageError(f"cache meta lacks {missing}; build it with cache_meta(target, feature_dtype)")
    meta = json.loads(json.dumps(meta))  # JSON-normalised copy (tuples -> lists), as it will be read back
    dtype = resolve_feature_dtype(meta["feature_dtype"])
    if out.exists() and not overwrite and not (out.is_dir() and not any(out.iterdir())):
        raise FileExistsError(f"feature cache {out} already exists; delete it or pass overwrite=True")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if shard_max_samples < 1:
        raise UsageError(f"shard_max_samples must be >= 1, got {shard_max_samples}")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(out)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    shards: list[dict] = []
    seen: set[str] = set()
    tokens = 0
    writer = fh = None
    bar = tqdm(unit="sample", desc=f"writing {out.name}", disable=not progress)
    try:

        def close_shard() -> None:
            writer.close()
            fh.close()
            shards[-1].update(bytes=fh.bytes, sha256=fh.sha.hexdigest())

        for i, s in enumerate(samples):
            sid = str(s["id"])
            if sid in seen:
                raise UsageError(f"duplicate sample id {sid!r}")
            seen.add(sid)
            if writer is None or shards[-1]["num_samples"] >= shard_max_samples:
                if writer is not None:
                    close_shard()
                shards.append({"name": f"{shard_prefix}-{len(shards):06d}.tar", "num_samples": 0})
                fh = _HashingFile(tmp / shards[-1]["name"])
                writer = TarWriter(fh, encoder=False, mtime=0, user="", group="", mode=0o444)  # reproducible
            data, S = _encode_sample(s, meta, dtype)
            writer.write({"__key__": f"{i:08d}", "safetensors": data})
            shards[-1]["num_samples"] += 1
            tokens += S
            bar.update(1)
        bar.close()
        if writer is None:
            raise UsageError(f"write_cache got no samples for {out}")
        close_shard()
        totals = {"samples": len(seen), "tokens": tokens, "bytes": sum(s["bytes"] for s in shards)}
        index = {"format": FORMAT, "version": VERSION, "meta": meta, "shards": shards, "totals": totals}
        (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        _install(tmp, out, overwrite)
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()  # idempotent; else the tar stream flushes into a closed file when collected
            fh.close()
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def remove_orphans(out: Path) -> None:
    """Delete what killed writes of the cache ``out`` left next to it: ``<name>.tmp-*`` (an unfinished cache, never
    read: it has no final name) and ``<name>.old-*`` (a replaced cache whose removal was cut short). Each cache path
    has one writer (a rank writes below its own folder, the merge runs on rank 0), so none of them is in use."""
    for orphan in [*out.parent.glob(out.name + ".tmp-*"), *out.parent.glob(out.name + ".old-*")]:
        warnings.warn(f"removing {orphan}, left by an interrupted feature cache write", stacklevel=3)
        shutil.rmtree(orphan, ignore_errors=True)


def _install(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename a finished temp cache directory into place; a previous cache is removed only once the new one is in."""
    old = None
    if out.exists():
        if any(out.iterdir()):
            if not overwrite:  # appeared while we were writing
                raise FileExistsError(f"feature cache {out} already exists; delete it or pass overwrite=True")
            old = out.rename(Path(tempfile.mkdtemp(prefix=out.name + ".old-", dir=out.parent)) / "cache")
        else:
            out.rmdir()
    try:
        tmp.rename(out)
    except BaseException:
        if old is not None:  # put the previous cache back
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


def merge_caches(parts: list[str | Path], out_dir: str | Path) -> Path:
    """Merge finished per-rank caches into one cache directory (replacing an older one); returns its path.

    Shards are hard-linked (copied where links are impossible), so the merge is cheap and the rank caches stay
    valid for a resume. Every part must have the same meta; shard names must differ (see ``shard_prefix``).
    """
    out = Path(out_dir)
    if not parts:
        raise UsageError(f"merge_caches got no rank caches for {out}")
    indexes = [FeatureCache(p).index for p in parts]  # cheap checks: sizes and member counts
    meta = indexes[0]["meta"]
    for p, idx in zip(parts, indexes, strict=True):
        if idx["meta"] != meta:
            raise CacheError(f"rank cache {p} was built with a different meta than {parts[0]}; re-run prepare")
    names = [s["name"] for idx in indexes for s in idx["shards"]]
    if len(set(names)) != len(names):
        raise CacheError(f"rank caches for {out} share shard names; write each with its own shard_prefix")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(out)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        for p, idx in zip(parts, indexes, strict=True):
            for rec in idx["shards"]:
                _link_or_copy(Path(p) / rec["name"], tmp / rec["name"])
        shards = [s for idx in indexes for s in idx["shards"]]
        totals = {k: sum(idx["totals"][k] for idx in indexes) for k in ("samples", "tokens", "bytes")}
        index = {"format": FORMAT, "version": VERSION, "meta": meta, "shards": shards}
        (tmp / INDEX).write_text(json.dumps({**index, "totals": totals}, indent=2) + "\n")
        _install(tmp, out, overwrite=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not supported
        shutil.copy2(src, dst)


# --- reading -------------------------------------------------------------------------------------------------------
def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _sample_metadata(data: bytes) -> dict[str, str]:
    """``{"id", "domain"}`` from the ``sample`` entry of a safetensors header."""
    (n,) = struct.unpack("<Q", data[:8])
    md = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    return json.loads(md.get("sample", "{}"))


def decode_sample(data: bytes, keep_dtype: bool = False) -> dict[str, Any]:
    """One cached member -> ``{"id", "domain", "input_ids" int64 (S,), "loss_mask" int64 (S,), "context" (S, n*d),
    "hidden" (S, d)}``; features in float32, or in the stored dtype (bf16) with ``keep_dtype`` so that the cast
    happens on the device instead of doubling host memory and transfer size."""
    from safetensors.torch import load

    t, md = load(data), _sample_metadata(data)
    cast = (lambda x: x) if keep_dtype else (lambda x: x.float())
    return {
        "id": md.get("id", ""),
        "domain": md.get("domain", ""),
        "input_ids": t["input_ids"].long(),  # (S,)
        "loss_mask": t["loss_mask"].long(),  # (S,)
        "context": cast(t["context"]),  # (S, n*d)
        "hidden": cast(t["hidden"]),  # (S, d)
        **{k: t[k] for k in LAW_SUMMARY if k in t},  # (S,) target log-sum-exp / argmax, when cached
    }


def load_index(location: str | Path, expect: dict | None = None) -> dict[str, Any]:
    """Read and check a cache's ``index.json`` from a directory or an fsspec URL (``file://``, ``s3://``, ...).

    Checks the format / version and that every key of ``expect`` equals the cached meta; raises :class:`CacheError`
    naming the file or the key.
    """
    import fsspec

    where = str(location).rstrip("/")
    path = f"{where}/{INDEX}"
    try:
        with fsspec.open(path, "rt") as f:
            index = json.loads(f.read())
    except FileNotFoundError as e:
        raise CacheError(f"feature cache {where} has no {INDEX} (not a cache, or its write never finished)") from e
    except (OSError, ValueError) as e:
        raise CacheError(f"feature cache {path} is unreadable: {e}") from e
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise CacheError(
            f"feature cache {path}: format {index.get('format')!r} v{index.get('version')}, "
            f"expected {FORMAT!r} v{VERSION}"
        )
    _check_shard_names(index, path)
    meta = index["meta"]
    for key, want in json.loads(json.dumps(expect or {})).items():
        if key not in meta:
            raise CacheError(f"feature cache {where}: meta has no {key!r} (expected {want!r})")
        if meta[key] != want:
            raise CacheError(f"feature cache {where}: {key} differs: cache has {meta[key]!r}, expected {want!r}")
    return index


def _check_shard_names(index: dict[str, Any], path: str) -> None:
    """Every shard is a plain file name inside the cache folder: an ``index.json`` naming an absolute path or one
    with ``..`` would make us read (and ``merge_caches`` link) files outside the cache."""
    shards = index.get("shards")
    if not isinstance(shards, list):
        raise CacheError(f"feature cache {path}: 'shards' is not a list")
    for rec in shards:
        name = rec.get("name") if isinstance(rec, dict) else None
        if not isinstance(name, str) or name in ("", ".", "..") or name != Path(name).name or "\\" in name:
            raise CacheError(f"feature cache {path}: shard name {name!r} is not a file name inside the cache folder")


def check_shards(cache_dir: str | Path, progress: bool = True) -> dict[str, int]:
    """The explicit integrity check (``dspark-lightning check-cache``): the cheap checks, then every shard's sha256.

    Returns ``{"shards", "samples", "bytes"}``; raises :class:`CacheError` naming the first corrupt shard.
    """
    from tqdm.auto import tqdm

    cache = FeatureCache(cache_dir)
    recs = cache.index["shards"]
    total = sum(r["bytes"] for r in recs)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"sha256 {cache.dir.name}", disable=not progress) as bar:
        for path, rec in zip(cache._shards, recs, strict=True):
            if _sha256(path) != rec["sha256"]:
                raise CacheError(f"feature cache shard {path} is corrupt (sha256 mismatch)")
            bar.update(rec["bytes"])
    return {"shards": len(recs), "samples": len(cache), "bytes": total}


class FeatureCache(Dataset):
    """A validated, map-style dataset over a local feature cache (DistributedSampler-friendly).

    On open: ``index.json`` exists and has this format; every key of ``expect`` equals the cached meta; every shard
    exists with the recorded size and member count (and sha256 with ``check_sha256``; hashing every shard is
    :func:`check_shards`'s job, not every start's). Any failure raises :class:`CacheError` naming the key or shard
    file. Samples are read **lazily**: only (shard, offset, size) per sample is kept, and each ``__getitem__`` reads
    one member (no open handles, so DataLoader workers fork safely).

    Items: ``{"id", "domain", "input_ids" int64 (S,), "loss_mask" int64 (S,), "context" float32 (S, n*d),
    "hidden" float32 (S, d)}``.
    """

    def __init__(self, cache_dir: str | Path, expect: dict | None = None, *, check_sha256: bool = False):
        self.dir = Path(cache_dir)
        if not (self.dir / INDEX).is_file():
            raise CacheError(f"feature cache {self.dir} has no {INDEX} (not a cache, or its write never finished)")
        self.index = load_index(self.dir, expect)
        self.meta: dict[str, Any] = self.index["meta"]
        self._shards = [self.dir / s["name"] for s in self.index["shards"]]
        self._entries: list[tuple[int, int, int]] = []  # (shard, data offset, size)
        for k, s in enumerate(self.index["shards"]):
            self._entries += [(k, off, size) for off, size in self._check_shard(self._shards[k], s, check_sha256)]
        if len(self._entries) != self.index["totals"]["samples"]:
            raise CacheError(
                f"feature cache {self.dir}: {len(self._entries)} samples, index says {self.index['totals']['samples']}"
            )
        self.dtype = resolve_feature_dtype(self.meta["feature_dtype"])

    @staticmethod
    def _check_shard(path: Path, rec: dict, sha256: bool) -> list[tuple[int, int]]:
        """Validate one shard; returns (data offset, size) of each member."""
        if not path.is_file():
            raise CacheError(f"feature cache shard {path} is missing")
        size = path.stat().st_size
        if size != rec["bytes"]:
            raise CacheError(f"feature cache shard {path} has {size} bytes, index says {rec['bytes']} (truncated?)")
        if sha256 and _sha256(path) != rec["sha256"]:
            raise CacheError(f"feature cache shard {path} is corrupt (sha256 mismatch)")
        try:
            with tarfile.open(path, "r:") as tf:
                members = [m for m in tf if m.isfile()]
        except (tarfile.TarError, EOFError, OSError) as e:
            raise CacheError(f"feature cache shard {path} is not a readable tar: {e}") from e
        if len(members) != rec["num_samples"] or not all(m.name.endswith(".safetensors") for m in members):
            raise CacheError(f"feature cache shard {path}: {len(members)} members, index says {rec['num_samples']}")
        return [(m.offset_data, m.size) for m in members]

    def __len__(self) -> int:
        return len(self._entries)

    def sample_ids(self) -> list[str]:
        """Every sample's id, read from the members' headers only (no tensors)."""
        out = []
        for k, offset, _ in self._entries:
            with open(self._shards[k], "rb") as f:
                f.seek(offset)
                head = f.read(8)
                out.append(_sample_metadata(head + f.read(int.from_bytes(head, "little"))).get("id", ""))
        return out

    @property
    def num_tokens(self) -> int:
        return int(self.index["totals"]["tokens"])

    def _member(self, i: int) -> bytes:
        k, offset, size = self._entries[i]
        with open(self._shards[k], "rb") as f:
            f.seek(offset)
            return f.read(size)

    def read_raw(self, i: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Sample ``i`` as stored: tensors in their cached dtypes and ``{"id", "domain"}``."""
        from safetensors.torch import load

        data = self._member(i)
        return load(data), _sample_metadata(data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return decode_sample(self._member(i))
