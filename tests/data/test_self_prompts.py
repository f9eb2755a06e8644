"""Chat prompts the target writes itself: the requests, the cleaning of a written reply, the file
`write-prompts` leaves (readable by the jsonl source, resumable) and the shipped `self_chat` source."""

from __future__ import annotations

import json

import pytest

from dspark_lightning.cli import main
from dspark_lightning.data.prompts import self_prompts
from dspark_lightning.data.prompts.self_prompts import clean_question, meta_records, write_prompts, written_prompts
from dspark_lightning.data.prompts.sources import build_source


def test_meta_records_are_deterministic_varied_and_grow_by_prefix():
    a, b = meta_records(40, seed=0), meta_records(80, seed=0)
    assert b[:40] == a and [r.turns for r in b[:40]] == [r.turns for r in a]
    assert len({r.meta["topic"] for r in b}) > 30 and len({r.meta["task"] for r in b}) > 8
    assert [r.turns for r in meta_records(40, seed=1)] != [r.turns for r in a]
    assert all(r.meta["topic"] in r.turns[0] and r.meta["task"] in r.turns[0] for r in b)
    with pytest.raises(ValueError, match="n"):
        meta_records(0)


@pytest.mark.parametrize(
    ("reply", "question"),
    [
        ('Here\'s an example: "How do I keep basil alive?" I hope it helps.', "How do I keep basil alive?"),
        ('A user might ask, "What is the fastest way to learn Spanish', "What is the fastest way to learn Spanish"),
        ("User: Can you write a haiku about autumn rain?", "Can you write a haiku about autumn rain?"),
        ("Plan my week of meals for four.\nAssistant: Sure! Monday ...", "Plan my week of meals for four."),
        ("Sure, here is a question about bees.", None),  # speaks as the assistant
        ("As an AI, I cannot write that.", None),
        ('"Why?"', None),  # too short
        ("word " * 200, None),  # too long
    ],
)
def test_clean_question_takes_the_message_out_of_a_written_reply(reply, question):
    assert clean_question(reply) == question


def _row(rid: str, reply: str) -> dict:
    return {"id": rid, "turns": [{"role": "user", "content": "x"}, {"role": "assistant", "content": reply}],
            "meta": {"topic": "t"}}  # fmt: skip


def test_written_prompts_drop_unusable_and_duplicate_replies_in_order():
    rows = [
        _row("a", "How do volcanoes form in the ocean?"),
        _row("b", "I'm sorry, I can't."),
        _row("c", "how do volcanoes form in the ocean?"),
        _row("d", 'Try: "Give me tips for a 10 km run."'),
    ]
    out = written_prompts(rows)
    assert [x["id"] for x in out] == ["a", "d"]
    assert out[1] == {"id": "d", "domain": "chat", "turns": ["Give me tips for a 10 km run."], "meta": {"topic": "t"}}


def test_write_prompts_leaves_a_prompt_file_the_jsonl_source_reads_and_resumes(tiny_target, tmp_path, monkeypatch):
    out = tmp_path / "written.jsonl"
    replies = iter(["Can you explain how tides work?", "no", 'Ask: "What should I pack for a week of hiking?"'] * 9)
    monkeypatch.setattr(self_prompts, "clean_question", lambda t: clean_question(next(replies)))
    st = write_prompts(tiny_target, out, n=6, max_new_tokens=4, progress=False)
    assert st["written"] == 6 and st["asked"] == 6 and st["kept"] == 2  # 2 distinct usable messages of 6 replies
    recs = list(build_source({"class_path": "jsonl", "init_args": {"path": str(out)}}))
    assert [r.turns[0] for r in recs] == ["Can you explain how tides work?", "What should I pack for a week of hiking?"]
    assert all(r.domain == "chat" and r.id.startswith("self_chat/s0/") for r in recs)
    again = write_prompts(tiny_target, out, n=6, max_new_tokens=4, progress=False)  # nothing left to write
    assert again["written"] == 0 and again["skipped"] == 6


def test_write_prompts_command_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    for argv, needle in ((["--n", "0"], "--n"), (["--top_p", "0"], "top_p"), (["--dtype", "fp8"], "--dtype")):
        with pytest.raises(SystemExit) as exc:
            main(["write-prompts", "--out", str(tmp_path / "p.jsonl"), *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("dspark-lightning write-prompts: error:") and needle in err[0]


def test_shipped_self_chat_source_is_varied_chat_and_holds_no_eval_question():
    recs = list(build_source("self_chat"))
    assert len(recs) >= 800 and all(r.domain == "chat" and len(r.turns) == 1 for r in recs)
    assert len({r.turns[0].lower() for r in recs}) == len(recs)
    assert len({r.turns[0].split()[0].lower() for r in recs}) > 50  # not one template
    mtbench = {t for r in build_source("mtbench") for t in r.turns}
    assert not mtbench & {r.turns[0] for r in recs}
    assert list(build_source({"class_path": "self_chat", "init_args": {"limit": 5}})) == recs[:5]
    line = json.loads((self_prompts.Path(self_prompts.__file__).parent / "builtin/self_chat.jsonl").open().readline())
    assert set(line) == {"id", "domain", "turns", "meta"} and {"topic", "task"} <= set(line["meta"])
