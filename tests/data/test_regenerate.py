"""Response regeneration: rows, multi-turn, id-keyed resume (incl. a truncated last line), seeding, loader errors."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dspark_lightning.data.prompts.sources import PromptRecord
from dspark_lightning.data.regen import backend as backend_mod
from dspark_lightning.data.regen import regen_engine, regen_hf
from dspark_lightning.data.regen.regen_hf import _PerRowSampler
from dspark_lightning.data.regen.regenerate import load_conversations, regenerate

os.environ.setdefault("HF_HUB_OFFLINE", "1")
FAST = {"max_new_tokens": 6, "progress": False}


def _prompts(n: int = 5) -> list[PromptRecord]:
    return [
        PromptRecord(f"t/{i}", "chat", "test", [f"question {i}", "a follow-up", "and a third"][: 1 + i % 3])
        for i in range(n)
    ]


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_writes_multi_turn_rows(target, tmp_path):
    out = tmp_path / "gen.jsonl"
    prompts = _prompts()
    stats = regenerate(target, prompts, out, batch_size=2, **FAST)
    assert stats["written"] == 5 and stats["skipped"] == 0 and stats["tokens"] > 0 and stats["tokens_per_s"] > 0
    rows = _rows(out)
    assert [r["id"] for r in rows] == [p.id for p in prompts]
    for r, p in zip(rows, prompts, strict=True):
        assert r["domain"] == "chat" and r["source"] == "test"
        assert [m["role"] for m in r["turns"]] == ["user", "assistant"] * len(p.turns)
        assert [m["content"] for m in r["turns"][::2]] == p.turns
        assert all(m["content"] and m["content"] == m["content"].strip() for m in r["turns"][1::2])
        gen = r["gen"]
        assert gen["seed"] == 42 and gen["temperature"] == 0.2 and gen["target"] == "tiny-debug"
        assert gen["chat"] == target.chat.to_dict() and len(gen["new_tokens"]) == len(p.turns)
        assert all(1 <= n <= 6 for n in gen["new_tokens"])
    assert load_conversations(out) == rows


@pytest.mark.parametrize("backend", ["dspark", "hf"])
def test_same_seed_same_output_independent_of_batching(varied_target, tmp_path, backend):
    """A conversation's response is fixed by (seed, id, turn), whatever it is batched with."""
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    kw = {**FAST, "backend": backend, "temperature": 1.0, "max_new_tokens": 12}
    regenerate(varied_target, _prompts(5), a, batch_size=5, concurrency=5, **kw)
    regenerate(varied_target, _prompts(5), b, batch_size=1, concurrency=1, **kw)
    regenerate(varied_target, _prompts(5), c, batch_size=5, concurrency=5, seed=7, **kw)
    assert a.read_text() == b.read_text()
    assert [r["turns"] for r in _rows(a)] != [r["turns"] for r in _rows(c)]


def test_resume_skips_existing_ids_without_duplicates(target, tmp_path):
    out, ref = tmp_path / "gen.jsonl", tmp_path / "ref.jsonl"
    fast = {**FAST, "temperature": 0.0}  # greedy: no response is empty by chance (it would be dropped)
    regenerate(target, _prompts(6), ref, batch_size=3, **fast)
    regenerate(target, _prompts(6)[:2], out, batch_size=3, **fast)
    stats = regenerate(target, _prompts(6), out, batch_size=3, **fast)
    assert stats["skipped"] == 2 and stats["written"] == 4
    again = regenerate(target, _prompts(6), out, batch_size=3, **fast)
    assert again["written"] == 0 and again["skipped"] == 6 and again["tokens"] == 0
    rows = _rows(out)
    assert len({r["id"] for r in rows}) == len(rows) == 6
    assert {r["id"]: r for r in rows} == {r["id"]: r for r in _rows(ref)}  # a resume reproduces


def test_truncated_last_line_is_repaired_on_resume(target, tmp_path):
    out = tmp_path / "gen.jsonl"
    regenerate(target, _prompts(4), out, batch_size=2, **FAST)
    full = out.read_bytes()
    last_start = full.rstrip(b"\n").rfind(b"\n") + 1
    out.write_bytes(full[: last_start + (len(full) - last_start) // 2])  # crash in the middle of the last row
    with pytest.warns(UserWarning, match="truncated last line"):
        assert [r["id"] for r in load_conversations(out)] == ["t/0", "t/1", "t/2"]
    stats = regenerate(target, _prompts(4), out, batch_size=2, **FAST)
    assert stats["skipped"] == 3 and stats["written"] == 1
    assert out.read_bytes() == full

    out.write_bytes(full.rstrip(b"\n"))  # a complete last row that lost only its newline
    assert regenerate(target, _prompts(4), out, **FAST)["written"] == 0
    assert out.read_bytes() == full


def test_max_turns_and_greedy(target, tmp_path):
    out = tmp_path / "gen.jsonl"
    regenerate(target, _prompts(3), out, max_turns=1, temperature=0.0, **FAST)
    assert all(len(r["turns"]) == 2 for r in _rows(out))
    p = target.encode_prompt(_rows(out)[0]["turns"][:1])
    ids = target.model.generate(
        torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=target.stop_token_ids
    )
    body = [t for t in ids[0, len(p) :].tolist() if t not in target.stop_token_ids]
    assert _rows(out)[0]["turns"][1]["content"] == target.tokenizer.decode(body, skip_special_tokens=True).strip()


@pytest.mark.parametrize("backend", ["dspark", "hf"])
def test_empty_responses_are_dropped(target, tmp_path, monkeypatch, backend):
    real, calls = backend_mod.split_output, []

    def fake(target, out):  # the second generated turn comes back empty
        calls.append(out)
        text, n, s = real(target, out)
        return ("", n, s) if len(calls) == 2 else (text, n, s)

    monkeypatch.setattr({"dspark": regen_engine, "hf": regen_hf}[backend], "split_output", fake)
    out = tmp_path / "gen.jsonl"
    stats = regenerate(target, _prompts(3), out, backend=backend, concurrency=1, batch_size=1, max_turns=1, **FAST)
    assert stats["written"] == 2 and stats["dropped_empty"] == 1
    assert [r["id"] for r in _rows(out)] == ["t/0", "t/2"]


def test_input_and_file_errors(target, tmp_path):
    out = tmp_path / "gen.jsonl"
    with pytest.raises(ValueError, match="no prompts"):
        regenerate(target, [], out, **FAST)
    with pytest.raises(ValueError, match="duplicate prompt ids"):
        regenerate(target, _prompts(2) + _prompts(1), out, **FAST)
    regenerate(target, _prompts(2), out, **FAST)
    with pytest.raises(ValueError, match="different settings"):
        regenerate(target, _prompts(3), out, **{**FAST, "max_new_tokens": 7})
    lines = out.read_text().splitlines()
    out.write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"gen\.jsonl:2: malformed"):
        load_conversations(out)
    with pytest.raises(ValueError, match=r"gen\.jsonl:2: malformed"):
        regenerate(target, _prompts(3), out, **FAST)
    out.write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(ValueError, match="already on line 1"):
        load_conversations(out)
    out.write_text(json.dumps({"id": "x", "turns": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ValueError, match=":1: .*assistant"):
        load_conversations(out)
    out.write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_conversations(out)
    with pytest.raises(FileNotFoundError):
        load_conversations(tmp_path / "missing.jsonl")


def test_per_row_sampler_matches_filtered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n = 4000

    def freqs(**kw):
        proc = _PerRowSampler(list(range(n)), **kw)
        picks = proc(None, logits.expand(n, -1).clone()).argmax(-1)
        return torch.bincount(picks, minlength=5).float() / n

    want = torch.softmax(logits / 0.7, -1)
    assert torch.allclose(freqs(temperature=0.7, top_p=1.0, top_k=None), want, atol=0.03)
    top2 = freqs(temperature=1.0, top_p=1.0, top_k=2)
    assert top2[2:].sum() == 0 and torch.allclose(top2[:2], torch.softmax(logits[:2], -1), atol=0.03)
    p = torch.softmax(logits, -1)  # top-p 0.6 keeps the two most likely tokens (0.56 < 0.6 <= 0.77)
    nucleus = freqs(temperature=1.0, top_p=0.6, top_k=None)
    assert nucleus[2:].sum() == 0 and torch.allclose(nucleus[:2], p[:2] / p[:2].sum(), atol=0.03)
    assert torch.equal(freqs(temperature=1.0, top_p=1.0, top_k=None), freqs(temperature=1.0, top_p=1.0, top_k=None))


def test_fixed_responses_are_written_not_generated(target, tmp_path, monkeypatch):
    """Records with fixed responses (fixed text) skip decoding: their own text is the answer, token counts are the
    target tokenizer's, ``gen.fixed`` marks them; mixed with normal records, only those are generated."""
    fixed = [PromptRecord(f"f/{i}", "code", "fixed", [f"write f{i}", "again"], responses=(f"def f{i}(): pass",))
             for i in range(3)]  # fmt: skip
    normal = _prompts(2)
    calls: list[int] = []
    real = regen_engine.EngineRegenerator.answer
    monkeypatch.setattr(
        regen_engine.EngineRegenerator, "answer", lambda self, recs: calls.append(len(recs)) or real(self, recs)
    )
    out = tmp_path / "gen.jsonl"
    stats = regenerate(target, fixed + normal, out, **FAST)
    assert calls == [2], "only the two records without responses are decoded"
    assert stats["written"] == 5 and stats["fixed"] == 3
    rows = {r["id"]: r for r in _rows(out)}
    for i in range(3):
        r = rows[f"f/{i}"]
        assert r["gen"]["fixed"] is True and r["source"] == "fixed"
        assert r["turns"] == [
            {"role": "user", "content": f"write f{i}"},
            {"role": "assistant", "content": f"def f{i}(): pass"},
        ]
        n = len(target.tokenizer(f"def f{i}(): pass", add_special_tokens=False)["input_ids"])
        assert r["gen"]["new_tokens"] == [n] and stats["fixed_tokens"] >= n
    assert all("fixed" not in rows[p.id]["gen"] for p in normal)
    again = regenerate(target, fixed + normal, out, **FAST)  # resume: nothing left, nothing rewritten
    assert again["written"] == 0 and again["skipped"] == 5 and len(_rows(out)) == 5


def test_prompt_record_checks_fixed_responses():
    with pytest.raises(ValueError, match="2 fixed responses for 1 turns"):
        PromptRecord("x/1", "chat", "t", ["q"], responses=("a", "b"))
    with pytest.raises(ValueError, match="tuple of non-empty strings"):
        PromptRecord("x/1", "chat", "t", ["q"], responses=("",))
    with pytest.raises(ValueError, match="tuple of non-empty strings"):
        PromptRecord("x/1", "chat", "t", ["q"], responses=["a"])


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"top_p": 0.0}, r"data\.regen\.top_p must be a finite number in \(0, 1\]"),
        ({"temperature": -1.0}, r"data\.regen\.temperature must be a finite number in \[0, inf\]"),
        ({"batch_size": 0}, r"data\.regen\.batch_size must be an integer >= 1"),
        ({"temperature": None}, r"data\.regen\.temperature must be given"),
    ],
)
def test_regeneration_settings_have_one_check(setting, message, target, tmp_path):
    """A recipe's data.regen and regenerate()'s arguments are checked by the same constructor, before any answer."""
    from dspark_lightning.checks import UsageError
    from dspark_lightning.data.regen.config import RegenConfig

    with pytest.raises(UsageError, match=message):
        RegenConfig(**setting)
    with pytest.raises(UsageError, match=message):
        regenerate(target, _prompts(1), tmp_path / "gen.jsonl", **{**FAST, **setting})
    assert not (tmp_path / "gen.jsonl").exists()
