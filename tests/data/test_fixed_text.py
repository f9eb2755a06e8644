"""Fixed text: sources that carry their responses, a jsonl file of whole conversations, prepare
writing them without decoding, and training on several prepared work dirs (``extra_work_dirs`` of ``data.features``)."""

from __future__ import annotations

import ast
import json
import sys
import sysconfig
from pathlib import Path

import pytest
from test_prepare import DATA, REGEN, TINY, cli, datamodule, prepare

from dspark_lightning.data.features.cache import CacheError
from dspark_lightning.data.prompts.fixed_text import _chunks, _prose
from dspark_lightning.data.prompts.sources import HumanEval, build_source


def _recs(spec: dict) -> list:
    return list(build_source(spec))


def test_python_source_pairs_a_humaneval_request_with_the_functions_real_source():
    recs = _recs("python_source")
    assert len(recs) > 2000 and len({r.id for r in recs}) == len(recs)
    by_id = {r.id: r for r in recs}
    r = by_id["python_source/heapq.heappush"]
    assert r.domain == "code" and r.turns[0].startswith(HumanEval.instruction)
    body = r.responses[0]
    assert body.startswith("```python\ndef heappush(heap, item):") and body.endswith("\n```")
    code = body.removeprefix("```python\n").removesuffix("\n```")
    tree = ast.parse(code)  # the real source, whole: it parses and is the function itself
    assert isinstance(tree.body[0], ast.FunctionDef) and tree.body[0].name == "heappush"
    assert code in (Path(sysconfig.get_paths()["stdlib"]) / "heapq.py").read_text()  # verbatim
    assert code.split('"""')[1] in r.turns[0]  # the prompt holds the header and docstring
    assert "heap.append(item)" in code and "heap.append" not in r.turns[0]  # ...but not the body
    for rec in recs[:200]:
        n = rec.responses[0].count("\n") - 1
        assert 4 <= n <= 40


def test_fixed_sources_take_a_varied_stable_prefix_without_importing_modules():
    before = set(sys.modules)
    small, big = (
        _recs({"class_path": "python_source", "init_args": {"limit": 30}}),
        _recs({"class_path": "python_source", "init_args": {"limit": 60}}),
    )
    assert big[:30] == small and [r.responses for r in big[:30]] == [r.responses for r in small]
    assert len({r.id.split("/")[1].split(".")[0] for r in small}) > 10  # many modules, not alphabetical
    assert _recs({"class_path": "python_source", "init_args": {"limit": 30, "seed": 7}}) != small
    assert not {"antigravity", "turtle", "tkinter"} & (set(sys.modules) - before)  # parsed, never imported
    with pytest.raises(ValueError, match="min_lines"):
        build_source({"class_path": "python_source", "init_args": {"min_lines": 9, "max_lines": 3}})


def test_python_docs_and_package_docs_are_chat_answers_of_bounded_length():
    docs = _recs("python_docs")
    assert len(docs) > 300 and all(r.domain == "chat" for r in docs)
    assert all(200 <= len(r.responses[0]) <= 1500 or "\n" not in r.responses[0] for r in docs)
    assert any(r.id.startswith("python_docs/topic/") for r in docs)
    assert any(r.id.startswith("python_docs/module/") for r in docs)
    assert all(r.responses[0] == r.responses[0].strip() for r in docs)
    pkgs = _recs("package_docs")
    torch_rec = next(r for r in pkgs if r.id == "package_docs/torch")
    assert "`torch`" in torch_rec.turns[0] and len(torch_rec.responses[0]) >= 300
    assert not any(line.startswith((".. image::", ":target:")) for r in pkgs for line in r.responses[0].splitlines())


def test_prose_joins_wrapped_paragraphs_and_keeps_blocks():
    text = "A wrapped\nparagraph here.\n\n   indented\n   code\n\nTitle\n=====\n\n.. image:: x.png\n"
    assert _prose(text) == "A wrapped paragraph here.\n\n   indented\n   code\n\nTitle\n====="
    pieces = _chunks("a" * 50 + "\n\n" + "b" * 50 + "\n\n" + "c" * 500, max_chars=120, min_chars=20)
    assert pieces == ["a" * 50 + "\n\n" + "b" * 50, "c" * 120]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_jsonl_fixed_keeps_the_assistant_messages(tmp_path):
    conv = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]  # fmt: skip
    f = _write_jsonl(tmp_path / "c.jsonl", [{"turns": conv}, {"turns": conv[:2] + [{"role": "user", "content": "q"}]}])
    recs = _recs({"class_path": "jsonl", "init_args": {"path": str(f), "fixed": True}})
    assert [r.turns for r in recs] == [["q1", "q2"], ["q1", "q"]] and [r.responses for r in recs] == [
        ("a1", "a2"),
        ("a1",),
    ]
    assert recs[0].id != recs[1].id
    regenerated = _recs({"class_path": "jsonl", "init_args": {"path": str(f)}})  # the default
    assert all(not r.responses for r in regenerated)
    q, a = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
    for bad in ([a], [q], ["q", "a"], [q, q, a]):
        g = _write_jsonl(tmp_path / "bad.jsonl", [{"turns": bad}])
        with pytest.raises(ValueError, match=r"bad.jsonl:1: malformed prompt line"):
            _recs({"class_path": "jsonl", "init_args": {"path": str(g), "fixed": True}})


@pytest.fixture(scope="module")
def fixed_work(tmp_path_factory) -> Path:
    """A tiny-debug work dir prepared from fixed text only (no regeneration)."""
    tmp = tmp_path_factory.mktemp("fixed")
    rows = [{"turns": [{"role": "user", "content": f"Explain item {i}."},
                       {"role": "assistant", "content": f"Item {i} is a number between {i - 1} and {i + 1}, "
                        "and this sentence is long enough to be supervised."}]} for i in range(12)]  # fmt: skip
    f = _write_jsonl(tmp / "fixed.jsonl", rows)
    work = tmp / "work"
    prepare(work, f"--data.sources=[{{class_path: jsonl, init_args: {{path: {f}, fixed: true}}}}]")
    return work


def test_prepare_writes_fixed_text_unchanged(fixed_work):
    rows = [
        json.loads(x)
        for p in ("train", "heldout")
        for x in (fixed_work / f"responses_{p}.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 12 and all(r["gen"]["fixed"] for r in rows)
    for r in rows:
        i = int(r["turns"][0]["content"].split()[-1].rstrip("."))
        assert r["turns"][1]["content"].startswith(f"Item {i} is a number between {i - 1}")
    stats = json.loads((fixed_work / "prepare_stats.json").read_text())
    assert stats["regenerate_train"]["fixed"] == stats["regenerate_train"]["written"]


def test_extra_work_dirs_train_on_both_caches(single, fixed_work, tmp_path):
    own = datamodule(single)
    own.setup()
    both = datamodule(single, features={"class_path": "cached", "init_args": {"extra_work_dirs": [str(fixed_work)]}})
    both.prepare_data()  # the own work dir is reused; the extra one is read, never prepared
    both.setup()
    fixed_train = sum(1 for _ in (fixed_work / "responses_train.jsonl").open())
    assert len(both.datasets["train"]) == len(own.datasets["train"]) + fixed_train
    assert len(both.datasets["heldout"]) > len(own.datasets["heldout"])
    assert both.token_counts().sum() > own.token_counts().sum()
    batch = next(iter(both.train_dataloader()))
    assert batch is not None
    with pytest.raises(CacheError, match="no prepared feature caches"):
        datamodule(
            single, features={"class_path": "cached", "init_args": {"extra_work_dirs": [str(tmp_path / "x")]}}
        ).setup()
    with pytest.raises(ValueError, match="features 'streamed' takes no argument 'extra_work_dirs'"):
        datamodule(single, features={"class_path": "streamed", "init_args": {"extra_work_dirs": [str(fixed_work)]}})


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("single") / "work"
    prepare(work)
    return work


def test_regen_dtype_writes_with_a_copy_of_the_target_and_is_recorded(tmp_path):
    """``data.regen.dtype``: the responses come from the target loaded in that dtype (recorded in every row as
    ``regen_dtype`` and in the fingerprint); unset, the fingerprint is what it was before the option existed."""
    from dataclasses import asdict

    from dspark_lightning.data.regen.config import RegenConfig

    work = tmp_path / "work"
    prepare(work, "--data.regen.dtype=bf16")
    rows = [json.loads(x) for x in (work / "responses_train.jsonl").read_text().splitlines()]
    assert rows and all(r["gen"]["regen_dtype"] == "bf16" for r in rows)
    plain = datamodule(work).prepare_job()
    unset = {"dtype", "capture_features", "answers_per_prompt"}  # prepare acts on these, regenerate() does not
    assert not unset & set(plain.regen.identity()) and plain.regen.settings() == {
        k: v for k, v in asdict(RegenConfig(**REGEN)).items() if k not in unset
    }
    dm = datamodule(work)
    dm.regen = RegenConfig(**REGEN, dtype="bf16")
    with_dtype = dm.prepare_job()
    assert with_dtype.fingerprint != plain.fingerprint and with_dtype.is_done()


@pytest.mark.parametrize("bf16_faster", [True, False])
def test_regen_dtype_fastest_resolves_to_what_this_machine_runs_faster(tmp_path, monkeypatch, bf16_faster):
    """``data.regen.dtype: fastest`` is bf16 where a decode step's product is faster in bf16, else the target's own
    precision, and the job (fingerprint, rows) names the concrete choice, never "fastest". (The machine's answer is
    kept once measured: tests/infer/test_devices.py; here it is given.)"""
    from dspark_lightning.data.regen.config import RegenConfig
    from dspark_lightning.lightning import datamodule as dm_module

    monkeypatch.setattr(dm_module, "decode_bf16_faster", lambda kind, cache=None: bf16_faster)
    dm = datamodule(tmp_path / "work")
    dm.regen = RegenConfig(**REGEN, dtype="fastest")
    job = dm.prepare_job()
    assert job.regen.dtype == ("bf16" if bf16_faster else None)
    dm.regen = RegenConfig(**REGEN, dtype="bf16" if bf16_faster else None)
    assert job.fingerprint == dm.prepare_job().fingerprint
    assert (job.load_regen_target is not None) == bf16_faster


def test_regen_dtype_is_checked_before_any_work(tmp_path, capsys):
    code, _, err = cli(["prepare", "--config", TINY, f"--data.work_dir={tmp_path / 'w'}", *DATA,
                        "--data.regen.dtype=fp8"], capsys)  # fmt: skip
    assert code == 2 and "data.regen.dtype must be null, fastest or one of" in err and not (tmp_path / "w").exists()
