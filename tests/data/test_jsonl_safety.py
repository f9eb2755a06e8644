"""Resumable regeneration JSONL on a full disk, after a torn write and after two writers raced on it."""

from __future__ import annotations

import json
import os

import pytest

from dspark_lightning.atomic import DiskFullError
from dspark_lightning.data.prompts.sources import PromptRecord
from dspark_lightning.data.regen.regenerate import load_conversations, regenerate

os.environ.setdefault("HF_HUB_OFFLINE", "1")
FAST = {"max_new_tokens": 6, "progress": False, "temperature": 0.0, "batch_size": 2, "concurrency": 2}


def _prompts(n: int) -> list[PromptRecord]:
    return [PromptRecord(f"t/{i}", "chat", "test", [f"question {i}"]) for i in range(n)]


def _ids(path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_append_on_a_full_disk_keeps_the_file_and_resumes(target, tmp_path, disk_full):
    out = tmp_path / "gen.jsonl"
    regenerate(target, _prompts(2), out, **FAST)
    before = out.read_bytes()
    disk = disk_full(tmp_path, room=40)  # the next batch's rows do not fit
    with pytest.raises(DiskFullError) as info:
        regenerate(target, _prompts(6), out, **FAST)
    assert disk.hits == 1 and out.read_bytes() == before  # cut back to the complete rows, not a half row
    assert str(out) in str(info.value) and "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.jsonl"]
    disk.free()
    stats = regenerate(target, _prompts(6), out, **FAST)  # space freed: the resume goes on from the 2 rows
    assert stats["skipped"] == 2 and stats["written"] == 4 and _ids(out) == [f"t/{i}" for i in range(6)]


@pytest.mark.parametrize("tail", [b'{"id": "t/9", "turns": [{"ro', b"\x00" * 64, b'{"oops\n'])
def test_torn_last_line_is_dropped_on_resume_with_a_warning(target, tmp_path, tail):
    """Cut mid-row, the zeros a power loss leaves, a half line that did get a newline: all are the torn tail."""
    out = tmp_path / "gen.jsonl"
    regenerate(target, _prompts(3), out, **FAST)
    full = out.read_bytes()
    out.write_bytes(full + tail)
    with pytest.warns(UserWarning, match="dropping a truncated last line") as record:
        stats = regenerate(target, _prompts(3), out, **FAST)
    assert len(str(record[0].message).splitlines()) == 1
    assert stats["skipped"] == 3 and stats["written"] == 0 and out.read_bytes() == full


def test_duplicate_ids_from_a_race_are_deduplicated_on_resume(target, tmp_path):
    """Two writers appended the same ids: the first complete line of each id is kept, with one warning, and the
    folder works again (a reader that refused duplicates would fail forever with "id ... already on line 1")."""
    out = tmp_path / "gen.jsonl"
    regenerate(target, _prompts(3), out, **FAST)
    lines = out.read_text().splitlines(keepends=True)
    second = json.loads(lines[0])
    second["turns"][1]["content"] = "a different answer the other writer made"
    out.write_text(lines[0] + lines[1] + json.dumps(second) + "\n" + lines[2] + lines[1])
    with pytest.raises(ValueError, match="already on line 1"):
        load_conversations(out)
    with pytest.warns(UserWarning, match="repeat an id of an earlier line") as record:
        stats = regenerate(target, _prompts(4), out, **FAST)
    assert len(str(record[0].message).splitlines()) == 1 and "keeping the first" in str(record[0].message)
    assert stats["skipped"] == 3 and stats["written"] == 1
    rows = load_conversations(out)
    assert [r["id"] for r in rows] == ["t/0", "t/1", "t/2", "t/3"]
    assert out.read_text().startswith("".join(lines))  # the first line of each id, in its place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.jsonl"]
