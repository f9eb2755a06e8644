"""Features captured during regeneration (``data.regen.capture_features``): the same numbers as the feature pass,
on the same tokens, with no second forward (tiny-debug and tiny random targets, CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from test_prepare import DATA, TINY, cli

from dspark_lightning import load_target
from dspark_lightning.data.features.cache import FeatureCache
from dspark_lightning.data.features.extract import (
    captured_sample,
    extract_features,
    target_law_summary,
    tokenize_conversations,
)
from dspark_lightning.data.prepare import DataPaths
from dspark_lightning.data.prompts.sources import PromptRecord
from dspark_lightning.data.regen.config import RegenConfig
from dspark_lightning.data.regen.regenerate import load_captured, load_conversations, regenerate
from dspark_lightning.testing import random_target

PROMPTS = [PromptRecord(id=f"p{i}", domain="chat", source="t", turns=[f"say {w} twice please"])
           for i, w in enumerate(["one", "two", "three", "four", "five"])]  # fmt: skip


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_captured_features_equal_the_feature_pass(tmp_path, family):
    """Every captured conversation's context and hidden state equal a separate forward's over the same tokens at each
    position (fp32 target: only summation order differs); the sample is the prompt as rendered and the response as
    sampled, its loss mask 1 exactly on the response."""
    target = random_target(layers=4, family=family, layer_ids=[0, 2])
    rows_path, cap = tmp_path / "rows.jsonl", tmp_path / "cap"
    st = regenerate(target, PROMPTS, rows_path, max_new_tokens=10, temperature=0.0, concurrency=3, batch_size=2,
                    progress=False, capture_dir=cap)  # fmt: skip
    assert st["captured"] == len(load_conversations(rows_path)) == len(PROMPTS)
    rows = {r["id"]: r for r in tokenize_conversations(target, load_conversations(rows_path), 256, min_supervised=1)}
    parts = list(load_captured(cap))
    assert len(parts) == 1  # one file per batch of rows written: max(batch_size, 4 * concurrency) = 12 rows
    samples = {sid: captured_sample(rows[sid], c, max_length=256) for sid, c in parts[0].items()}
    assert set(samples) == set(rows) and all(s is not None for s in samples.values())
    runs = [{"id": sid, "input_ids": s["input_ids"].tolist(), "loss_mask": s["loss_mask"].tolist()}
            for sid, s in samples.items()]  # fmt: skip
    full = {s["id"]: s for s in extract_features(target, runs, feature_dtype="float32", progress=False)}
    for sid, s in samples.items():
        c, P = parts[0][sid], parts[0][sid]["prompt_len"]
        n = c["context"].shape[0]
        assert len(s["input_ids"]) == n + 1 == P + rows_output(rows_path, sid)
        assert s["input_ids"][:P].tolist() == rows[sid]["input_ids"][:P]
        assert s["loss_mask"].tolist() == [0] * P + [1] * (n + 1 - P)
        torch.testing.assert_close(s["context"][:n].float(), full[sid]["context"][:n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(s["hidden"][:n].float(), full[sid]["hidden"][:n], rtol=1e-4, atol=1e-4)
        assert not s["context"][n].any() and not s["hidden"][n].any()  # never run: zeros, never read by training


def rows_output(path, sid: str) -> int:
    """Tokens the row's only response took (its stop token included)."""
    return next(r for r in load_conversations(path) if r["id"] == sid)["gen"]["new_tokens"][0]


def test_captured_sample_refuses_what_it_does_not_cover():
    cap = {"tokens": [5, 6, 7, 8, 9], "prompt_len": 2, "context": torch.ones(4, 4), "hidden": torch.ones(4, 2)}
    row = {"id": "a", "input_ids": [5, 6, 7, 3, 9, 10, 11], "loss_mask": [0, 0, 1, 1, 1, 1, 0]}
    s = captured_sample(row, cap, max_length=64)
    assert s["input_ids"].tolist() == [5, 6, 7, 8, 9] and s["loss_mask"].tolist() == [0, 0, 1, 1, 1]
    assert s["context"].shape == (5, 4) and not s["context"][4].any() and s["context"][:4].all()
    assert captured_sample({**row, "input_ids": [5, 4, 7, 8, 9]}, cap, 64) is None  # another prompt
    assert captured_sample(row, cap, 64, min_supervised=4) is None  # too little supervision
    short = captured_sample(row, cap, max_length=3)  # cut to max_length: every position was run
    assert short["input_ids"].tolist() == [5, 6, 7] and short["context"].all()


def test_capture_needs_our_engine(tmp_path):
    with pytest.raises(ValueError, match="^data.regen.capture_features: backend 'hf' cannot capture"):
        RegenConfig(backend="hf", capture_features=True)
    with pytest.raises(ValueError, match="^regenerate: backend 'hf' cannot capture features"):
        regenerate(random_target(), PROMPTS, tmp_path / "r.jsonl", backend="hf", capture_dir=tmp_path / "c")


def test_prepare_caches_the_captured_features(tmp_path, capsys):
    """`prepare` with capture_features: the cache holds the same tokens as the feature pass would, features equal
    within fp32 noise (tiny-debug runs in fp32), and the statistics say how many rows the capture covered."""
    regen = {"batch_size": 12, "max_new_tokens": 12, "max_turns": 1, "backend": "dspark", "concurrency": 4}
    base = [a for a in DATA if not a.startswith("--data.regen=")]
    works = {}
    for capture in (False, True):
        works[capture] = tmp_path / f"data_{capture}"
        args = [*base, f"--data.regen={json.dumps({**regen, 'capture_features': capture})}"]
        code, out, _ = cli(["prepare", "--config", TINY, f"--data.work_dir={works[capture]}", *args], capsys)
        assert code == 0
    assert "cached from regeneration's features" in out
    stats = json.loads(DataPaths(works[True]).stats.read_text())
    assert stats["features_train"]["captured_samples"] > 0
    target = load_target("tiny-debug")
    for split in ("train", "heldout"):
        plain, cap = (
            FeatureCache(DataPaths(works[False]).cache(split)),
            FeatureCache(DataPaths(works[True]).cache(split)),
        )
        assert cap.meta["feature_source"].startswith("regeneration")
        ref = {plain[i]["id"]: plain[i] for i in range(len(plain))}
        assert len(cap) == len(plain)
        for i in range(len(cap)):
            s = cap[i]
            r = ref[s["id"]]
            a, b = s["input_ids"].tolist(), r["input_ids"].tolist()
            same = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            assert same > 0 and s["loss_mask"].sum() > 0
            k = min(same, len(a) - 1)  # positions run on the same tokens (the last one of a is never run)
            torch.testing.assert_close(s["context"][:k].float(), r["context"][:k].float(), rtol=2e-2, atol=2e-2)
            sup = s["loss_mask"].bool()  # the law is summarised where a loss term reads it, from the sample's hidden
            assert (s["target_top"][~sup] == -1).all() and (s["target_lse"][~sup] == 0).all()
            lse, top = target_law_summary(target, s["hidden"][sup].float())
            assert torch.equal(s["target_top"][sup], top) and torch.equal(s["target_lse"][sup], lse)
