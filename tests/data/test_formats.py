"""The formats users have (ShareGPT, OpenAI messages, Alpaca, turns; JSON, JSONL, parquet, saved HF datasets) through
`prepare` on the tiny target, the malformed-row report, decontamination, de-duplication, filters and weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_prepare import REGEN, TINY, cli

from dspark_lightning.data.prompts.curate import Curation, Decontaminator, repeat_index
from dspark_lightning.data.prompts.formats import (
    FormatError,
    ReadReport,
    iter_json_array,
    parse_row,
    read_conversations,
)
from dspark_lightning.data.prompts.mixture import curated_mixture, mixture
from dspark_lightning.data.prompts.sources import build_source

SHAREGPT = [
    {"id": "a", "system": "You are terse.", "conversations": [
        {"from": "human", "value": "Name three rivers in Europe."},
        {"from": "gpt", "value": "Danube, Rhine, Seine."},
        {"from": "human", "value": "Which is the longest?"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "Hello!"}, {"from": "USER", "value": "Hi, who are you?"},
                                  {"from": "user", "value": "Answer briefly."}]},
    {"id": "c", "conversations": []},  # malformed: empty
    {"id": "d", "conversations": [{"from": "gpt", "value": "only the assistant"}]},  # malformed: no user turn
    {"id": "e", "conversations": [{"from": "wizard", "value": "??"}]},  # malformed: unknown role
]  # fmt: skip
OPENAI = [
    {"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is a prime number?"},
                  {"role": "assistant", "content": "..."}, {"role": "user", "content": "Give two examples."}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe the picture."},
                                               {"type": "image_url", "image_url": {"url": "x"}}]}]},  # malformed
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Write a haiku about rain."}]}]},
]  # fmt: skip
ALPACA = [
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    {"instruction": "List the planets of the solar system.", "input": "", "output": "..."},
    {"instruction": "", "input": "nothing to do", "output": ""},  # malformed: empty instruction
]


def _conv(path, **kw):
    report = ReadReport(str(path))
    return list(read_conversations(path, report, **kw)), report


def test_each_format_gives_user_turns_and_system_prompts(tmp_path):
    p = tmp_path / "share.json"
    p.write_text(json.dumps(SHAREGPT))
    convs, rep = _conv(p)
    assert [c.turns for c in convs] == [["Name three rivers in Europe.", "Which is the longest?"],
                                        ["Hi, who are you?\n\nAnswer briefly."]]  # fmt: skip
    assert convs[0].system == "You are terse." and convs[1].system is None and convs[0].id == "a"
    assert rep.rows == 5 and rep.kept == 2 and rep.dropped == 3 and len(rep.examples) == 3
    assert "unknown role 'wizard'" in rep.summary() and "no non-empty user message" in rep.summary()

    o = tmp_path / "chat.jsonl"
    o.write_text("\n".join(json.dumps(r) for r in OPENAI) + "\n{not json\n")
    convs, rep = _conv(o)
    assert [c.turns for c in convs] == [
        ["What is a prime number?", "Give two examples."],
        ["Write a haiku about rain."],
    ]
    assert convs[0].system == "Be kind." and rep.dropped == 2
    assert "'image_url' content part" in rep.summary() and "not JSON" in rep.summary()

    import pyarrow as pa
    import pyarrow.parquet as pq

    a = tmp_path / "alpaca.parquet"
    pq.write_table(pa.Table.from_pylist(ALPACA), a)
    convs, rep = _conv(a)
    assert [c.turns for c in convs] == [
        ["Translate to French.\n\nGood morning"],
        ["List the planets of the solar system."],
    ]
    assert rep.malformed == {"an empty instruction": 1}

    t = tmp_path / "turns.jsonl"
    t.write_text(json.dumps({"turns": ["q1", "q2"], "id": "x"}) + "\n" + json.dumps({"prompt": "single"}) + "\n")
    convs, _ = _conv(t)
    assert [c.turns for c in convs] == [["q1", "q2"], ["single"]]


def test_a_json_array_cut_mid_record_keeps_every_whole_record():
    text = json.dumps(SHAREGPT[:2], indent=1)
    cut = text[: text.index('"b"') + 30]  # inside the second record
    rep = ReadReport("cut")
    rows = list(iter_json_array(cut, rep))
    assert [r["id"] for r in rows] == ["a"] and rep.truncated_bytes == len(cut) - cut.rindex('{\n  "id": "b"')
    assert "ends mid-record" in ReadReport("x", truncated_bytes=5).summary()


def test_field_mapping_and_a_saved_hf_dataset(tmp_path):
    import datasets

    rows = [{"uid": f"q{i}", "question": f"How do I reverse a list number {i} in Python?"} for i in range(6)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    args = {"path": str(tmp_path / "saved"), "fields": {"prompt": "question", "id": "uid"}, "domain": "auto"}
    spec = {"class_path": "conversations", "init_args": args}
    recs = list(build_source(spec))
    assert [r.id for r in recs] == [f"saved/q{i}" for i in range(6)] and {r.domain for r in recs} == {"code"}
    streamed = list(build_source({**spec, "init_args": {**args, "streaming": True}}))
    assert [r.turns for r in streamed] == [r.turns for r in recs]
    with pytest.raises(ValueError, match="unknown field names"):
        list(build_source({**spec, "init_args": {**args, "fields": {"question": "prompt"}}}))
    with pytest.raises(FormatError, match="not a file, a saved dataset folder"):
        list(build_source({"class_path": "conversations", "init_args": {"path": "nobody/no-such-dataset"}}))
    with pytest.raises(FileNotFoundError, match="no such file"):
        list(build_source({"class_path": "conversations", "init_args": {"path": str(tmp_path / "missing.json")}}))
    with pytest.raises(FormatError, match="no conversation field"):
        parse_row({"text": "x"})


def test_prepare_reads_each_format_and_reports_malformed_and_contaminated_rows(tmp_path, capsys):
    share, chat = tmp_path / "share.json", tmp_path / "chat.jsonl"
    contaminated = {"id": "leak", "conversations": [{"from": "human", "value": _mtbench_question()}]}
    share.write_text(json.dumps([*SHAREGPT, contaminated]))
    chat.write_text("\n".join(json.dumps(r) for r in OPENAI) + "\n")
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ALPACA), tmp_path / "alpaca.parquet")
    (tmp_path / "turns.jsonl").write_text(json.dumps({"turns": ["Tell me a joke.", "Another one?"], "id": "j"}) + "\n")
    datasets.Dataset.from_list([{"q": "Why is the sky blue?"}]).save_to_disk(str(tmp_path / "hf"))
    paths = [share, chat, tmp_path / "alpaca.parquet", tmp_path / "turns.jsonl"]
    sources = [{"class_path": "conversations", "init_args": {"path": str(p)}} for p in paths]
    sources.append(
        {"class_path": "conversations", "init_args": {"path": str(tmp_path / "hf"), "fields": {"prompt": "q"}}}
    )
    work = tmp_path / "work"
    regen = {**REGEN, "max_turns": None}
    args = ["prepare", "--config", TINY, f"--data.work_dir={work}", f"--data.sources={json.dumps(sources)}",
            "--data.heldout_fraction=0.5", "--data.min_supervised=1", f"--data.regen={json.dumps(regen)}",
            '--data.curation={"decontaminate": ["eval", "benchmarks"]}']  # fmt: skip
    code, out, err = cli(args, capsys)
    assert code == 0, out + err
    assert "share: 3 of 6 rows kept; 3 malformed" in out and "chat: 2 of 3 rows kept; 1 malformed" in out
    assert "overlaps benchmark:MT-Bench" in out
    stats = json.loads((work / "prepare_stats.json").read_text())["curation"]
    assert stats["sources"]["conversations"]["overlaps benchmark:MT-Bench"] == 1
    assert stats["settings"]["curation"]["decontaminate"] == ["eval", "benchmarks"]
    lines = [
        ln for split in ("train", "heldout") for ln in (work / f"responses_{split}.jsonl").read_text().splitlines()
    ]
    rows = {r["id"]: r for r in map(json.loads, lines)}
    asked = [r.turns[0] for r in mixture(sources, "all", 0.5, curation=Curation())]  # what prepare regenerated
    firsts = {i: next(m["content"] for m in r["turns"] if m["role"] == "user") for i, r in rows.items()}
    assert set(firsts.values()) <= set(asked) and len(firsts) >= len(asked) - 2  # the tiny target may answer nothing
    assert sorted(asked) == sorted(["Name three rivers in Europe.", "Hi, who are you?\n\nAnswer briefly.",
        "What is a prime number?", "Write a haiku about rain.", "Translate to French.\n\nGood morning",
        "List the planets of the solar system.", "Tell me a joke.", "Why is the sky blue?"])  # fmt: skip
    assert {"share/a", "share/b", "turns/j"} <= set(rows) and "alpaca: 2 of 3 rows kept; 1 malformed" in out
    j = rows["turns/j"]["turns"]
    assert [m["content"] for m in j if m["role"] == "user"] == ["Tell me a joke.", "Another one?"]
    a = rows["share/a"]["turns"]
    assert a[0] == {"role": "system", "content": "You are terse."}
    assert [m["content"] for m in a if m["role"] == "user"] == ["Name three rivers in Europe.", "Which is the longest?"]
    assert [m["role"] for m in a] == ["system", "user", "assistant", "user", "assistant"]  # the target wrote both
    assert a[2]["content"] != "Danube, Rhine, Seine."


def _mtbench_question() -> str:
    return next(iter(build_source("mtbench"))).turns[0]


def test_decontamination_ignores_boilerplate_and_catches_embedded_items():
    sets = {
        "bench": [
            f"Complete the following Python function carefully. def f{i}(x): return the {i}th prime of "
            f"x with memo number {i}"
            for i in range(50)
        ]
        + ["the quick brown fox jumps over the lazy dog"]
    }
    d = Decontaminator(sets, n=5, overlap=0.5)
    assert d.match("Complete the following Python function carefully. def g(y): something else entirely") is None
    assert d.match("please: def f7(x): return the 7th prime of x with memo number 7 thanks") == "bench"
    assert d.match("I saw the quick brown fox jumps over the lazy dog today") == "bench"
    assert d.match("a fox is quick") is None


def test_curation_drops_duplicates_filters_and_samples_deterministically(tmp_path):
    p = tmp_path / "p.jsonl"
    texts = [f"Explain topic number {i} about gardening, soil and compost in simple words." for i in range(30)]
    texts += [texts[0], texts[1].upper(), texts[2] + " Please.", "Erkläre mir bitte, wie man im Garten Kompost "
              "anlegt und welche Abfälle hineingehören, ausführlich und einfach."]  # fmt: skip
    p.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))

    def src(**opts):
        return {"class_path": "conversations", "init_args": {"path": str(p), **opts}}

    cur = Curation(decontaminate=[], dedupe="near", near=0.8)
    mix = curated_mixture([src(language="en")], cur)
    c = mix.report.sources["conversations"]
    assert c["read"] == 34 and c["duplicate"] == 2 and c["near duplicate"] == 1 and c["other language"] == 1
    assert c["kept"] == 30 == len(mix.records)
    s10 = curated_mixture([src(sample=10)], cur).records
    s5 = curated_mixture([src(sample=5)], cur).records
    assert len(s10) == 10 and s5 == s10[:5] and [r.id for r in s10] != [r.id for r in mix.records[:10]]
    tok = _words_tokenizer()
    short = curated_mixture([src(max_tokens=13)], None, tokenizer=tok).records
    assert short and all(len(r.turns[0].split()) <= 13 for r in short) and len(short) < 34
    with pytest.raises(ValueError, match="need the target's tokenizer"):
        curated_mixture([src(min_tokens=3)], None)
    with pytest.raises(ValueError, match="language must be an ISO 639-1 code"):
        build_source(src(language="English"))
    with pytest.raises(ValueError, match="public benchmark may not be trained on"):
        curated_mixture([{"class_path": "humaneval", "init_args": {"limit": 2}}], Curation())


def _words_tokenizer():
    class Tok:
        name_or_path = "words"

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": text.split()}

    return Tok()


def test_weights_repeat_samples_by_source_deterministically():
    ids = [f"a/{i}" for i in range(100)] + [f"b/{i}" for i in range(100)]
    weights = {i: 2.0 for i in ids[:100]} | {i: 0.5 for i in ids[100:]}
    idx = repeat_index(ids, weights, seed=1)
    assert idx == repeat_index(ids, weights, seed=1) and sum(i < 100 for i in idx) == 200
    assert 35 <= sum(i >= 100 for i in idx) <= 65
    assert mixture([{"class_path": "mtbench", "init_args": {"weight": 3}}], "all")[0].id == "mtbench/81"
    with pytest.raises(ValueError, match="weight must be a number"):
        build_source({"class_path": "mtbench", "init_args": {"weight": 0}})


def test_offline_corpora_are_read_whole_and_counted():
    share = build_source({"class_path": "sharegpt_v3", "init_args": {"limit": 50}})
    recs = list(share)
    assert len(recs) == 50 and all(r.id.startswith("sharegpt_v3/") for r in recs)
    assert {r.domain for r in recs} <= {"chat", "code", "math"} and len({r.domain for r in recs}) >= 2
    algos = list(build_source("algorithms"))
    complete = [r for r in algos if "/complete/" in r.id]
    assert len(complete) > 400 and len(algos) == 2 * len(complete)
    assert all(r.turns[0].count('"""') == 2 and "```python\ndef " in r.turns[0] for r in complete)
    gym = list(
        build_source({"class_path": "reasoning_gym", "init_args": {"tasks": ["gcd", "leg_counting"], "limit": 6}})
    )
    assert [r.id.split("/")[1] for r in gym] == ["gcd", "leg_counting"] * 3
    with pytest.raises(ValueError, match="re-templates GSM8K"):
        build_source({"class_path": "reasoning_gym", "init_args": {"tasks": ["gsm_symbolic"]}})


def test_eval_sets_do_not_enter_the_recipes_that_decontaminate():
    """The product recipes check their mixture against the eval sets and benchmarks: nothing overlaps after it."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    for name in ("smollm2_dspark.yaml", "smollm2_dspark_long.yaml"):
        data = yaml.safe_load((root / "recipes" / name).read_text())["data"]
        assert data["curation"]["decontaminate"] == ["eval", "benchmarks"]
        names = {s if isinstance(s, str) else s["class_path"] for s in data["sources"]}
        assert not names & {"humaneval", "mtbench", "gsm_symbolic"}


def test_a_source_weight_repeats_its_cached_samples_in_training(tmp_path):
    from test_prepare import datamodule, prepare

    work = tmp_path / "work"
    prepare(work)
    plain = datamodule(work)
    plain.prepare_data()
    plain.setup()
    heavy = datamodule(work)
    heavy.sources = [
        {"class_path": "gsm_symbolic", "init_args": {"limit": 4, "weight": 3}},
        {"class_path": "humaneval", "init_args": {"limit": 4}},
    ]
    heavy.setup()  # the same prepared data: a weight changes no prompt, only how often a sample is seen
    ids = [s["id"] for s in plain.datasets["train"]]
    seen = [heavy.datasets["train"][i]["id"] for i in range(len(heavy.datasets["train"]))]
    assert sorted(seen) == sorted([i for i in ids if i.startswith("gsm")] * 3 + [i for i in ids if i.startswith("hum")])
    assert plain.datasets["train"].sample_ids() == ids


def test_held_out_responses_split_into_sets_by_source_form_and_domain(tmp_path):
    from dspark_lightning.eval.runner import responses_datasets

    rows = [("sharegpt_v3/a_0", "sharegpt_v3", "code", "fix my loop"), ("sharegpt_v3/b_0", "sharegpt_v3", "chat", "hi"),
            ("algorithms/complete/x.f", "algorithms", "code", "complete f"),
            ("algorithms/instruct/x.f", "algorithms", "code", "write f"),
            ("reasoning_gym/gcd/seed3/0", "reasoning_gym", "math", "gcd?")]  # fmt: skip
    p = tmp_path / "responses_heldout.jsonl"
    p.write_text("".join(json.dumps({"id": i, "source": s, "domain": d, "turns": [{"role": "user", "content": t},
                 {"role": "assistant", "content": "."}]}) + "\n" for i, s, d, t in rows))  # fmt: skip
    sets = {d.name: (d.domain, d.prompts) for d in responses_datasets(p, 5)}
    assert sets == {"sharegpt_v3:code": ("code", ["fix my loop"]), "sharegpt_v3:chat": ("chat", ["hi"]),
                    "algorithms/complete": ("code", ["complete f"]), "algorithms/instruct": ("code", ["write f"]),
                    "reasoning_gym": ("math", ["gcd?"])}  # fmt: skip
