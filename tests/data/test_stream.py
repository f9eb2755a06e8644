"""The streaming shard reader: exactly once across ranks x workers, bf16 kept, local path and file:// URL."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from data_rows import conversations
from torch.utils.data import DataLoader

from dspark_lightning.data.features.anchors import AnchorCollator
from dspark_lightning.data.features.cache import CacheError, cache_meta, write_cache
from dspark_lightning.data.features.extract import extract_features, tokenize_conversations
from dspark_lightning.data.features.stream import ShardStream


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, target):
    """9 bf16 samples in 5 shards of at most 2 (uneven on purpose)."""
    tok = tokenize_conversations(target, conversations(9), max_length=96)
    samples = extract_features(target, tok, feature_dtype="bfloat16", progress=False)
    out = tmp_path_factory.mktemp("stream") / "cache"
    return write_cache(samples, out, cache_meta(target, "bfloat16"), shard_max_samples=2, progress=False)


def ids_of(ds: ShardStream, workers: int) -> list[str]:
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    items = list(loader)
    assert all(x["context"].dtype == torch.bfloat16 and x["hidden"].dtype == torch.bfloat16 for x in items)
    assert all(x["input_ids"].dtype == torch.int64 for x in items)
    return [x["id"] for x in items]


@pytest.mark.parametrize("url", [False, True], ids=["path", "file-url"])
def test_every_sample_once_across_two_ranks_and_two_workers(cache_dir, url):
    location = cache_dir.as_uri() if url else str(cache_dir)
    per_rank = [ids_of(ShardStream(location, rank=r, world_size=2), workers=2) for r in range(2)]
    seen = Counter(per_rank[0] + per_rank[1])
    assert set(seen) == {f"row-{i}" for i in range(9)} and set(seen.values()) == {1}
    assert set(per_rank[0]).isdisjoint(per_rank[1])


def test_assignment_splits_shards_by_rank_then_worker(cache_dir):
    plan = ShardStream(str(cache_dir), world_size=2).assignment(num_workers=2)
    assert plan == [[[0, 4], [2]], [[1], [3]]]


def test_even_streams_give_every_rank_the_same_count(cache_dir):
    counts = [len(ids_of(ShardStream(str(cache_dir), rank=r, world_size=2, even=True), workers=2)) for r in range(2)]
    assert counts[0] == counts[1] > 0


def test_shuffle_is_a_permutation_that_changes_by_epoch(cache_dir):
    ds = ShardStream(str(cache_dir), shuffle=True, shuffle_buffer=3, seed=1)
    first = ids_of(ds, workers=0)
    ds.set_epoch(1)
    second = ids_of(ds, workers=0)
    plain = ids_of(ShardStream(str(cache_dir)), workers=0)
    assert sorted(first) == sorted(second) == sorted(plain)
    assert first != second


def test_collated_batches_stay_bf16(cache_dir):
    loader = DataLoader(ShardStream(str(cache_dir)), batch_size=4, collate_fn=AnchorCollator(4))
    batch = next(iter(loader))
    assert batch["context"].dtype == torch.bfloat16 and batch["hidden"].dtype == torch.bfloat16
    assert batch["input_ids"].dtype == torch.int64


def test_bad_locations_are_named(tmp_path, cache_dir, target):
    with pytest.raises(CacheError, match="has no index.json"):
        ShardStream(str(tmp_path / "nowhere"))
    with pytest.raises(CacheError, match="feature_dtype differs"):
        ShardStream(str(cache_dir), expect={"feature_dtype": "float32"})
    with pytest.raises(CacheError, match="5 shards for 8 ranks"):
        ShardStream(str(cache_dir), world_size=8, rank=0, even=True)
