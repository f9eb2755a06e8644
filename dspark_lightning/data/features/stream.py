"""A streaming reader for the feature cache's webdataset shards (local directory or fsspec URL).

The map-style :class:`~dspark_lightning.data.features.cache.FeatureCache` needs the shards on a local disk and opens
them at random offsets. :class:`ShardStream` reads shards front to back instead, so a cache can live on object storage
(``s3://``, ``gs://``, ``hf://``, ``file://`` with the matching fsspec backend) and each process reads only its share:

- shards are split by **node** (``rank`` of ``world_size``, round-robin) and then by **DataLoader worker**, so every
  sample is read exactly once per epoch across all ranks and workers;
- features stay in the stored dtype (bf16) until the batch is on the device (see
  :meth:`DSparkDataModule.on_after_batch_transfer`), halving host memory and transfer size;
- ``even=True`` caps every (rank, worker) stream at the smallest count among the ranks for that worker, so DDP ranks
  see the same number of batches (a rank that ran out first would hang the others); it drops at most a few shards'
  worth of samples per epoch, like ``DistributedSampler(drop_last=True)``.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ...checks import UsageError
from .cache import CacheError, decode_sample, load_index


class ShardStream(IterableDataset):
    """Iterate the samples of a feature cache, shard by shard, as this rank's and worker's share.

    Args:
        location: cache directory or fsspec URL (the directory holding ``index.json``).
        expect: meta keys the cache must have (as for :class:`FeatureCache`).
        rank, world_size: this process's place among the data-parallel ranks.
        shuffle: shuffle the shard order each epoch (seeded by ``seed`` and :meth:`set_epoch`).
        shuffle_buffer: samples held for in-stream shuffling (0 = shard order only); memory is
            ``shuffle_buffer x S x (n+1) x d x 2`` bytes per worker for bf16 features.
        seed: seed of both shuffles.
        even: equal sample counts per rank for each worker index (DDP training); see the module docstring.

    Items are those of :func:`decode_sample` with ``keep_dtype=True``.
    """

    def __init__(
        self,
        location: str,
        expect: dict | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        even: bool = False,
    ) -> None:
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is outside world_size {world_size}")
        self.location = str(location).rstrip("/")
        self.index = load_index(self.location, expect)
        self.meta: dict[str, Any] = self.index["meta"]
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.shuffle_buffer, self.seed, self.even = shuffle, shuffle_buffer, seed, even
        self.epoch = 0
        if even and len(self.index["shards"]) < world_size:
            raise CacheError(
                f"feature cache {self.location} has {len(self.index['shards'])} shards for {world_size} ranks; "
                "write more, smaller shards or use the map-style reader (data.features: cached)"
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def num_samples(self) -> int:
        """Samples in the whole cache (all ranks)."""
        return int(self.index["totals"]["samples"])

    def _shard_order(self) -> list[int]:
        n = len(self.index["shards"])
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def assignment(self, num_workers: int) -> list[list[list[int]]]:
        """Shard indices of every (rank, worker): ``[rank][worker] -> [shard, ...]`` for this epoch."""
        order = self._shard_order()
        per_rank = [order[r :: self.world_size] for r in range(self.world_size)]
        return [[shards[w::num_workers] for w in range(num_workers)] for shards in per_rank]

    def _quota(self, plan: list[list[list[int]]], worker: int) -> int | None:
        """With ``even``: the smallest sample count of this worker index over the ranks (else no cap)."""
        if not self.even:
            return None
        counts = [sum(self.index["shards"][k]["num_samples"] for k in rank[worker]) for rank in plan]
        return min(counts)

    def _read_shard(self, k: int) -> Iterator[dict[str, Any]]:
        import fsspec

        name = self.index["shards"][k]["name"]
        url = f"{self.location}/{name}"
        try:
            with fsspec.open(url, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tf:
                for m in tf:
                    if m.isfile() and m.name.endswith(".safetensors"):
                        yield decode_sample(tf.extractfile(m).read(), keep_dtype=True)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise CacheError(f"feature cache shard {url} is not a readable tar: {e}") from e

    def _samples(self, shards: list[int], quota: int | None) -> Iterator[dict[str, Any]]:
        n = 0
        for k in shards:
            for item in self._read_shard(k):
                if quota is not None and n >= quota:
                    return
                n += 1
                yield item

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = self.assignment(num_workers)
        stream = self._samples(plan[self.rank][worker], self._quota(plan, worker))
        if self.shuffle_buffer > 0:
            stream = _buffer_shuffle(stream, self.shuffle_buffer, hash((self.seed, self.epoch, self.rank, worker)))
        yield from stream


def _buffer_shuffle(items: Iterator[Any], size: int, seed: int) -> Iterator[Any]:
    """Shuffle a stream through a buffer of ``size`` items (each item is yielded exactly once)."""
    g = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    buf: list[Any] = []
    for item in items:
        buf.append(item)
        if len(buf) >= size:
            j = int(torch.randint(len(buf), (1,), generator=g))
            buf[j], buf[-1] = buf[-1], buf[j]
            yield buf.pop()
    while buf:
        j = int(torch.randint(len(buf), (1,), generator=g))
        buf[j], buf[-1] = buf[-1], buf[j]
        yield buf.pop()
