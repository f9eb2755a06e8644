"""The feature cache: size estimate, write/read round trip, online parity and corruption checks (tiny-debug, CPU)."""

from __future__ import annotations

import json
import tarfile

import pytest
import torch
from data_rows import conversations as _rows
from torch.utils.data import DistributedSampler

from dspark_lightning.data.features.cache import (
    CacheError,
    FeatureCache,
    cache_meta,
    check_shards,
    describe_estimate,
    estimate_cache_bytes,
    format_bytes,
    write_cache,
)
from dspark_lightning.data.features.extract import extract_features, features_for_batch, tokenize_conversations


def conversations(n: int = 7) -> list[dict]:
    return _rows(n, multi_turn=False, id_fmt="row/{i}.v1")  # ids with / and . (tar keys must not use them)


@pytest.fixture(scope="module")
def samples(target):
    """bf16 features extracted one sample per batch, the same composition as a batch-size-1 online step."""
    tok = tokenize_conversations(target, conversations(), max_length=128)
    return list(extract_features(target, tok, feature_dtype="bfloat16", batch_tokens=1, progress=False))


@pytest.fixture
def cache_dir(tmp_path, target, samples):
    return write_cache(
        samples, tmp_path / "cache", cache_meta(target, "bfloat16", dataset="unit"), shard_max_samples=3, progress=False
    )


def test_estimate_formula():
    # Qwen3-4B: d = 2560, n = 5 -> 5 + 2*2560*6 = 30,725 B/token (int32 id + uint8 mask + bf16 features).
    # docs/algorithm.md §4 quotes 30,726 because the reference also stores an unused uint8 attention mask (+1 B/token).
    assert estimate_cache_bytes(1, 2560, 5, law_summary=False) == 30_725
    assert estimate_cache_bytes(1, 2560, 5, law_summary=False) + 1 == 30_726
    # "~38 TB" is about 1.24 B tokens
    assert format_bytes(estimate_cache_bytes(1_240_000_000, 2560, 5, law_summary=False)) == "38.1 TB"
    assert estimate_cache_bytes(1000, 64, 5, law_summary=False) == 1000 * (5 + 2 * 64 * 6)
    assert estimate_cache_bytes(10, 64, 5, bytes_per_value=4) == 10 * (5 + 4 * 64 * 6 + 8)  # + fp32 lse, int32 argmax
    assert format_bytes(999) == "999 B" and format_bytes(1500) == "1.5 KB" and format_bytes(2.5e6) == "2.5 MB"


def test_describe_estimate(target):
    line = describe_estimate(1000, target, "bfloat16", num_samples=10)
    # 5 + 2*64*6 + 8 (the target's fp32 log-sum-exp and int32 argmax per token)
    assert "1,000 tokens" in line and "781 B/token" in line and "781.0 KB" in line and "tiny-debug" in line
    assert "1,549 B/token" in describe_estimate(1000, target, "float32")  # 5 + 4*64*6 + 8


def test_law_summary_is_the_targets_and_survives_the_cache(cache_dir, target, samples):
    """target_lse / target_top equal logsumexp / argmax of the target logits from the rounded hidden states, and
    the cache and the collator hand them on unchanged (the draft-vocabulary loss reads them)."""
    from dspark_lightning.data.features.anchors import AnchorCollator

    s = samples[0]
    z = target.logits(s["hidden"].float()).float()
    torch.testing.assert_close(s["target_lse"], torch.logsumexp(z, -1))
    assert torch.equal(s["target_top"].long(), z.argmax(-1))
    ds = FeatureCache(cache_dir, expect=cache_meta(target, "bfloat16"))
    got = {ds[i]["id"]: ds[i] for i in range(len(ds))}
    for s in samples:
        assert torch.equal(got[s["id"]]["target_lse"], s["target_lse"])
        assert torch.equal(got[s["id"]]["target_top"], s["target_top"])
    batch = AnchorCollator(4)([ds[0], ds[1]])
    n = len(ds[1]["input_ids"])
    assert batch["target_lse"].shape == batch["input_ids"].shape and torch.equal(
        batch["target_top"][1, :n], ds[1]["target_top"]
    )


def test_round_trip_is_exact(cache_dir, target, samples):
    index = json.loads((cache_dir / "index.json").read_text())
    assert [s["num_samples"] for s in index["shards"]] == [3, 3, 1]
    assert [s["name"] for s in index["shards"]] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert index["totals"]["samples"] == len(samples)
    assert index["totals"]["tokens"] == sum(len(s["input_ids"]) for s in samples)
    assert index["totals"]["bytes"] == sum((cache_dir / s["name"]).stat().st_size for s in index["shards"])
    meta = index["meta"]
    assert meta["target"] == "tiny-debug" and meta["layer_ids"] == [1, 2, 3, 4, 5] and meta["dataset"] == "unit"
    assert meta["hidden_size"] == 64 and meta["n_tapped"] == 5 and meta["feature_dtype"] == "bfloat16"
    assert meta["chat"] == target.chat.to_dict()
    assert not list(cache_dir.parent.glob("*.tmp-*"))  # the temp dir was renamed, nothing left behind

    ds = FeatureCache(cache_dir, expect=cache_meta(target, "bfloat16"))
    assert len(ds) == len(samples) and ds.num_tokens == index["totals"]["tokens"]
    for i, s in enumerate(samples):
        item = ds[i]
        assert item["id"] == s["id"] and item["domain"] == s["domain"]
        assert item["input_ids"].dtype == torch.int64 and torch.equal(item["input_ids"], s["input_ids"].long())
        assert torch.equal(item["loss_mask"], s["loss_mask"].long())
        assert item["context"].dtype == torch.float32 and torch.equal(item["context"], s["context"].float())
        assert torch.equal(item["hidden"], s["hidden"].float())
        raw, md = ds.read_raw(i)
        assert raw["context"].dtype == torch.bfloat16 and raw["input_ids"].dtype == torch.int32
        assert md == {"id": s["id"], "domain": s["domain"]}


def test_shards_hold_only_safetensors(cache_dir):
    with tarfile.open(cache_dir / "shard-000000.tar") as tf:
        names = tf.getnames()
    assert names == ["00000000.safetensors", "00000001.safetensors", "00000002.safetensors"]


def test_online_path_equals_cached_sample(cache_dir, target):
    ds = FeatureCache(cache_dir, expect=cache_meta(target, "bfloat16"))
    for i in range(len(ds)):
        item = ds[i]
        ctx, hid = features_for_batch(target, item["input_ids"][None], None, "bfloat16")
        assert torch.equal(ctx[0], item["context"]) and torch.equal(hid[0], item["hidden"])


def test_distributed_sampler(cache_dir):
    ds = FeatureCache(cache_dir)
    parts = [list(DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=1)) for r in range(2)]
    assert set(parts[0]) | set(parts[1]) == set(range(len(ds)))


def test_truncated_shard(cache_dir):
    shard = cache_dir / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:-700])
    with pytest.raises(CacheError, match="shard-000001.tar"):
        FeatureCache(cache_dir)


def test_flipped_byte(cache_dir):
    shard = cache_dir / "shard-000002.tar"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0x01
    shard.write_bytes(bytes(data))
    assert len(FeatureCache(cache_dir)) == 7  # opening checks sizes and counts, not hashes (cheap on every start)
    with pytest.raises(CacheError, match=r"shard-000002.tar.*sha256"):
        check_shards(cache_dir, progress=False)
    with pytest.raises(CacheError, match=r"shard-000002.tar.*sha256"):
        FeatureCache(cache_dir, check_sha256=True)


def test_missing_shard_and_index(cache_dir):
    (cache_dir / "shard-000000.tar").unlink()
    with pytest.raises(CacheError, match=r"shard-000000.tar is missing"):
        FeatureCache(cache_dir)
    (cache_dir / "index.json").unlink()
    with pytest.raises(CacheError, match="index.json"):
        FeatureCache(cache_dir)


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.tar", "sub/../../x.tar", "", ".."])
def test_shard_paths_are_confined_to_the_cache_folder(cache_dir, name):
    index = json.loads((cache_dir / "index.json").read_text())
    index["shards"][0]["name"] = name
    (cache_dir / "index.json").write_text(json.dumps(index))
    with pytest.raises(CacheError, match="is not a file name inside the cache folder") as e:
        FeatureCache(cache_dir)
    assert "index.json" in str(e.value) and "\n" not in str(e.value)


def test_meta_mismatch(cache_dir, target):
    expect = cache_meta(target, "bfloat16")
    with pytest.raises(CacheError, match=r"layer_ids differs: cache has \[1, 2, 3, 4, 5\], expected \[1, 3, 5\]"):
        FeatureCache(cache_dir, expect={**expect, "layer_ids": (1, 3, 5)})
    with pytest.raises(CacheError, match="feature_dtype differs"):
        FeatureCache(cache_dir, expect={"feature_dtype": "float32"})
    with pytest.raises(CacheError, match="target differs"):
        FeatureCache(cache_dir, expect={"target": "Qwen/Qwen3-4B"})
    with pytest.raises(CacheError, match="no 'max_length'"):
        FeatureCache(cache_dir, expect={"max_length": 4096})


def test_existing_cache_is_not_overwritten(cache_dir, target, samples):
    index = cache_dir / "index.json"
    before = index.read_bytes()
    stat = index.stat()
    meta = cache_meta(target, "bfloat16", dataset="other")
    with pytest.raises(FileExistsError, match=str(cache_dir)):
        write_cache(samples[:2], cache_dir, meta, progress=False)
    assert index.read_bytes() == before and index.stat().st_mtime_ns == stat.st_mtime_ns
    assert sorted(p.name for p in cache_dir.parent.iterdir()) == ["cache"]  # no temp dirs left
    write_cache(samples[:2], cache_dir, meta, overwrite=True, progress=False)
    ds = FeatureCache(cache_dir, expect={"dataset": "other"})
    assert len(ds) == 2
    assert sorted(p.name for p in cache_dir.parent.iterdir()) == ["cache"]


def test_write_rejects_bad_input(tmp_path, target, samples):
    meta = cache_meta(target, "bfloat16")
    with pytest.raises(ValueError, match="no samples"):
        write_cache([], tmp_path / "empty", meta, progress=False)
    with pytest.raises(ValueError, match="duplicate sample id"):
        write_cache(samples[:2] + samples[:1], tmp_path / "dup", meta, progress=False)
    with pytest.raises(ValueError, match="the cache holds torch.float32"):
        write_cache(samples[:1], tmp_path / "dtype", cache_meta(target, "float32"), progress=False)
    with pytest.raises(ValueError, match="cache meta lacks"):
        write_cache(samples[:1], tmp_path / "meta", {"target": "x"}, progress=False)
    assert list(tmp_path.iterdir()) == []  # failed writes leave nothing behind


def test_writes_are_reproducible(tmp_path, target, samples):
    meta = cache_meta(target, "bfloat16")
    a = json.loads((write_cache(samples, tmp_path / "a", meta, progress=False) / "index.json").read_text())
    b = json.loads((write_cache(samples, tmp_path / "b", meta, progress=False) / "index.json").read_text())
    assert a == b
