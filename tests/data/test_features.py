"""Tokenisation, batched extraction and the online feature path (tiny-debug target, CPU)."""

from __future__ import annotations

import pytest
import torch
from data_rows import conversations

from dspark_lightning.data.features.extract import (
    FEATURE_DTYPES,
    extract_features,
    features_for_batch,
    length_sorted_batches,
    tokenize_conversations,
)


@pytest.fixture(scope="module")
def tokenized(target):
    return tokenize_conversations(target, conversations(), max_length=96)


def test_tokenize_drops_short_rows_and_truncates(target):
    rows = conversations(3)
    rows.append(
        {
            "id": "short",
            "domain": "chat",
            "turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
        }
    )
    full = {r["id"]: target.encode_conversation(r["turns"]) for r in rows}
    assert sum(full["short"][1]) == 3  # "ok" + <|im_end|>: below 14
    out = tokenize_conversations(target, rows, max_length=60)
    assert [r["id"] for r in out] == ["row-0", "row-1", "row-2"]  # input order, short row dropped
    for r in out:
        ids, mask = full[r["id"]]
        assert r["input_ids"] == ids[:60] and r["loss_mask"] == mask[:60]
        assert sum(r["loss_mask"]) >= 14
    assert r["domain"] == "math" and out[1]["domain"] == "chat"
    assert len(full["row-2"][0]) == 129 and len(out[2]["input_ids"]) == 60
    # supervised tokens are counted after truncation: row-0 has 18, row-1 24 (of 29), row-2 20 (of 63)
    assert [r["id"] for r in tokenize_conversations(target, rows, max_length=60, min_supervised=22)] == ["row-1"]
    assert [r["id"] for r in tokenize_conversations(target, rows, max_length=128, min_supervised=22)] == [
        "row-1",
        "row-2",
    ]


def test_tokenize_fails_on_empty_duplicates_and_all_dropped(target):
    with pytest.raises(ValueError, match="no conversations"):
        tokenize_conversations(target, [], max_length=64)
    rows = conversations(2)
    with pytest.raises(ValueError, match="duplicate"):
        tokenize_conversations(target, rows + rows[:1], max_length=64)
    with pytest.raises(ValueError, match="fewer than"):
        tokenize_conversations(target, rows, max_length=64, min_supervised=10_000)


def test_length_sorted_batches():
    assert length_sorted_batches([3, 10, 5, 10, 1], batch_tokens=20) == [[1, 3], [2, 0, 4]]
    assert length_sorted_batches([30, 5], batch_tokens=8) == [[0], [1]]  # a long sample is alone


def _by_id(samples):
    return {s["id"]: s for s in samples}


def test_batched_equals_one_by_one_fp32(target, tokenized):
    batched = extract_features(target, tokenized, feature_dtype="float32", batch_tokens=400, progress=False)
    batched_samples = list(batched)
    assert batched.stats.batches < len(tokenized)  # padding really happened
    single = _by_id(extract_features(target, tokenized, feature_dtype="float32", batch_tokens=1, progress=False))
    assert len(batched_samples) == len(single) == len(tokenized)
    d, n = target.geometry.hidden_size, target.geometry.n_tapped
    for s in batched_samples:
        o = single[s["id"]]
        S = len(s["input_ids"])
        assert s["context"].shape == (S, n * d) and s["hidden"].shape == (S, d)
        torch.testing.assert_close(s["context"], o["context"], atol=1e-4, rtol=0)
        torch.testing.assert_close(s["hidden"], o["hidden"], atol=1e-4, rtol=0)


def test_sorting_keeps_each_samples_features(target, tokenized):
    """Every yielded sample carries its own ids, mask and features (checked against an unbatched forward)."""
    rows = {r["id"]: r for r in tokenized}
    stream = extract_features(target, tokenized, feature_dtype="float32", batch_tokens=300, progress=False)
    out = list(stream)
    assert sorted(s["id"] for s in out) == sorted(rows)
    for s in out:
        r = rows[s["id"]]
        assert s["domain"] == r["domain"]
        assert s["input_ids"].dtype == torch.int32 and s["input_ids"].tolist() == r["input_ids"]
        assert s["loss_mask"].dtype == torch.uint8 and s["loss_mask"].tolist() == r["loss_mask"]
        ref = target(torch.tensor([r["input_ids"]]))
        torch.testing.assert_close(s["context"], ref.context[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(s["hidden"], ref.hidden[0], atol=1e-4, rtol=0)
    st = stream.stats
    assert st.samples == len(tokenized) and st.tokens == sum(len(r["input_ids"]) for r in tokenized)
    assert st.padded_tokens >= st.tokens and st.seconds > 0 and st.tokens_per_second > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_online_path_equals_extracted_bit_for_bit(target, tokenized, dtype):
    samples = list(extract_features(target, tokenized[:4], feature_dtype=dtype, batch_tokens=1, progress=False))
    for s in samples:
        assert s["context"].dtype == FEATURE_DTYPES[dtype] and s["hidden"].dtype == FEATURE_DTYPES[dtype]
        ids = s["input_ids"].long()[None]  # (1, S)
        for mask in (None, torch.ones_like(ids)):
            ctx, hid = features_for_batch(target, ids, mask, dtype)
            assert ctx.dtype == torch.float32
            assert torch.equal(ctx[0], s["context"].float()) and torch.equal(hid[0], s["hidden"].float())


def test_features_for_batch_rounds_like_the_cache(target, tokenized):
    """Padded online batches: real positions equal the rounded fp32 forward of the same batch."""
    rows = tokenized[:3]
    S = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), S, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        attn[b, : len(r["input_ids"])] = 1
    ctx, hid = features_for_batch(target, ids, attn, "bfloat16")
    raw = target(ids, attention_mask=attn)
    assert torch.equal(ctx, raw.context.to(torch.bfloat16).float())
    assert torch.equal(hid, raw.hidden.to(torch.bfloat16).float())


def test_extract_rejects_bad_input(target):
    with pytest.raises(ValueError, match="no samples"):
        extract_features(target, [], progress=False)
    with pytest.raises(ValueError, match="feature dtype"):
        extract_features(target, [{"id": "a", "input_ids": [1], "loss_mask": [0]}], feature_dtype="int8")
