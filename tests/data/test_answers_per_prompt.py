"""Several answers per training prompt (``data.regen.answers_per_prompt``), each from its own sampling stream."""

from __future__ import annotations

import pytest

from dspark_lightning.data.prepare import several_answers
from dspark_lightning.data.prompts.sources import PromptRecord
from dspark_lightning.data.regen.config import RegenConfig
from dspark_lightning.data.regen.regenerate import load_conversations, regenerate
from dspark_lightning.testing import random_target


def _records() -> list[PromptRecord]:
    return [PromptRecord(id="s/a", domain="chat", source="s", turns=["tell me a story"]),
            PromptRecord(id="s/b", domain="chat", source="s", turns=["hi"], responses=("hello",))]  # fmt: skip


def test_copies_get_their_own_ids_and_fixed_text_stays_single():
    out = several_answers(_records(), 3)
    assert [p.id for p in out] == ["s/a", "s/a#1", "s/a#2", "s/b"]
    assert all(p.turns == ["tell me a story"] for p in out[:3])
    assert several_answers(_records(), 1) == _records()


def test_settings_checked_and_fingerprint_unchanged_for_one_answer():
    with pytest.raises(ValueError, match="needs temperature > 0"):
        RegenConfig(answers_per_prompt=2, temperature=0.0)
    with pytest.raises(ValueError, match="answers_per_prompt"):
        RegenConfig(answers_per_prompt=0)
    assert "answers_per_prompt" not in RegenConfig().identity()
    assert RegenConfig(answers_per_prompt=2, temperature=0.7).identity()["answers_per_prompt"] == 2
    assert "answers_per_prompt" not in RegenConfig(answers_per_prompt=2, temperature=0.7).settings()


def test_each_copy_is_answered_from_its_own_stream(tmp_path):
    target = random_target(layers=2)
    prompts = several_answers(_records()[:1], 4)
    regenerate(target, prompts, tmp_path / "r.jsonl", max_new_tokens=12, temperature=0.9, top_p=1.0, concurrency=4,
               progress=False)  # fmt: skip
    answers = [r["turns"][-1]["content"] for r in load_conversations(tmp_path / "r.jsonl")]
    assert len(answers) == 4 and len(set(answers)) > 1


def test_online_features_refuse_several_answers(tmp_path):
    from dspark_lightning.lightning.datamodule import DSparkDataModule

    with pytest.raises(ValueError, match="answers_per_prompt > 1 .* data.features: cached or streamed"):
        DSparkDataModule(target="tiny-debug", work_dir=str(tmp_path), features="online",
                         regen={"answers_per_prompt": 2, "temperature": 0.7})  # fmt: skip
