"""`dspark-lightning prepare` / `check-cache`: sharded over ranks, race-free, resumable, reused by fit (tiny-debug,
CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dspark_lightning.data.features.cache import CacheError, FeatureCache
from dspark_lightning.data.features.stream import ShardStream
from dspark_lightning.data.prepare import DataPaths
from dspark_lightning.lightning.datamodule import DSparkDataModule

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny_debug.yaml")
SOURCES = "[{class_path: gsm_symbolic, init_args: {limit: 4}}, {class_path: humaneval, init_args: {limit: 4}}]"
REGEN = {"batch_size": 12, "max_new_tokens": 12, "max_turns": 1, "backend": "hf"}
DATA = [f"--data.sources={SOURCES}", "--data.heldout_fraction=0.3", "--data.features=cached", "--data.min_supervised=4"]
DATA += ["--data.max_length=1024", "--data.feature_dtype=bfloat16", f"--data.regen={json.dumps(REGEN)}"]


def cli(args: list[str], capsys=None) -> tuple[int, str, str]:
    """Run the console script in-process; returns (exit code, stdout, stderr) (outputs only with ``capsys``)."""
    from dspark_lightning.cli import main

    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr() if capsys is not None else None
    return code, out.out if out else "", out.err if out else ""


def prepare(work: Path, *extra: str) -> None:
    code, _, _ = cli(["prepare", "--config", TINY, f"--data.work_dir={work}", *DATA, *extra])
    assert code == 0


def datamodule(work: Path, dtype: str | None = None, features: object = "cached", **kw) -> DSparkDataModule:
    from dspark_lightning.data.regen.config import RegenConfig

    return DSparkDataModule(
        target={"name": "tiny-debug", "dtype": dtype},
        sources=[
            {"class_path": "gsm_symbolic", "init_args": {"limit": 4}},
            {"class_path": "humaneval", "init_args": {"limit": 4}},
        ],
        heldout_fraction=0.3,
        work_dir=str(work),
        regen=RegenConfig(**REGEN),
        max_length=1024,
        min_supervised=4,
        features=features,
        feature_dtype="bfloat16",
        **kw,
    )


def examples(work: Path) -> dict[str, dict]:
    """Per split: {id: (turns, input_ids of the cached sample)}."""
    out = {}
    for split in ("train", "heldout"):
        rows = [json.loads(ln) for ln in DataPaths(work).responses(split).read_text().splitlines()]
        cache = FeatureCache(DataPaths(work).cache(split))
        ids = {cache[i]["id"]: cache[i]["input_ids"].tolist() for i in range(len(cache))}
        out[split] = {r["id"]: (r["turns"], ids.get(r["id"])) for r in rows}
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    work = tmp_path_factory.mktemp("single") / "data"
    prepare(work)
    return work


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    work = tmp_path_factory.mktemp("sharded") / "data"
    for rank in (0, 1):
        prepare(work, f"--rank={rank}", "--world_size=2")
    assert not DataPaths(work).prepared.exists()  # no rank merges on its own
    prepare(work, "--merge", "true", "--world_size=2")
    return work


def rank_dirs(work: Path) -> list[Path]:
    return sorted((work / "parts").glob("*-w2/rank-*"))


def test_two_ranks_then_merge_equal_one_rank(single, sharded):
    a, b = examples(single), examples(sharded)
    for split in ("train", "heldout"):
        assert a[split] and a[split] == b[split]  # same rows, same texts, same cached token ids
        assert all(ids is not None for _, ids in a[split].values())
    idx = json.loads(DataPaths(sharded).prepared.read_text())
    assert idx["world_size"] == 2 and idx["splits"]["train"]["rows"] == len(a["train"])


def test_ranks_write_disjoint_files(sharded):
    dirs = rank_dirs(sharded)
    assert [d.name for d in dirs] == ["rank-00000", "rank-00001"]
    files = [{p.relative_to(d) for p in d.rglob("*") if p.is_file()} for d in dirs]
    assert files[0] and files[1]
    shards = [{p.name for p in d.rglob("*.tar")} for d in dirs]
    assert shards[0].isdisjoint(shards[1])  # globally unique names: rank-prefixed
    for r, names in enumerate(shards):
        assert all(n.startswith(f"shard-r{r:05d}-") for n in names)
    merged = {s["name"] for s in json.loads((sharded / "features_train" / "index.json").read_text())["shards"]}
    assert merged <= shards[0] | shards[1] and {n[:13] for n in merged} == {"shard-r00000-", "shard-r00001-"}
    assert not list(sharded.rglob("*.tmp-*"))  # every write was renamed into place


def test_killed_rank_is_redone_and_finished_ranks_reused(sharded, tmp_path):
    work = tmp_path / "data"
    shutil.copytree(sharded, work)
    before = examples(work)
    r0, r1 = rank_dirs(work)
    kept = {p: p.stat().st_mtime_ns for p in r0.rglob("*") if p.is_file()}
    # rank 1 was killed: no done.json, a truncated JSONL line, its train cache never renamed into place
    (r1 / "done.json").unlink()
    shutil.rmtree(r1 / "features_train")
    part = r1 / "responses_train.jsonl"
    lines = part.read_bytes().splitlines(keepends=True)
    part.write_bytes(b"".join(lines[:-1]) + lines[-1][:10])

    job = datamodule(work).prepare_job(progress=False)
    job.load_target = lambda: pytest.fail("a finished rank must not even load the target")
    job.run_rank(0, 2)
    assert {p: p.stat().st_mtime_ns for p in r0.rglob("*") if p.is_file()} == kept

    job = datamodule(work).prepare_job(progress=False)
    with pytest.raises(ValueError, match=r"ranks \[1\] of 2 have not finished"):
        job.merge(2)
    job.run_rank(1, 2)
    assert (r1 / "done.json").is_file() and (r1 / "features_train" / "index.json").is_file()
    job.merge(2)
    assert examples(work) == before


def test_fit_reuses_prepared_data_and_streams_it(sharded, tmp_path, monkeypatch, capsys):
    work = tmp_path / "data"
    shutil.copytree(sharded, work)
    monkeypatch.chdir(tmp_path)
    outputs = [p for p in work.rglob("*") if p.is_file() and "parts" not in p.parts and p.name != ".dspark.lock"]
    stamps = {p: p.stat().st_mtime_ns for p in outputs}  # the folder lock's holder record is rewritten, nothing else
    args = ["fit", "--config", TINY, f"--data.work_dir={work}", *DATA, "--data.features=streamed"]
    args += ["--trainer.max_steps=2", "--validate_before_fit=false", "--trainer.logger=false"]
    args += ["--trainer.callbacks=[]", f"--export.dir={tmp_path / 'drafter'}"]
    code, out, err = cli(args, capsys)
    assert code == 0, err[-3000:]
    assert "reusing prepared data" in out and "regenerated" not in out
    assert {p: p.stat().st_mtime_ns for p in outputs} == stamps
    assert (tmp_path / "drafter" / "model.safetensors").is_file()


def test_fit_refuses_the_work_on_an_accelerator(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(CacheError, match="dspark-lightning prepare --config"):
        datamodule(tmp_path / "data").prepare_data()
    assert not (tmp_path / "data" / "responses_train.jsonl").exists()


def test_streaming_datamodule_keeps_bf16(sharded):
    dm = datamodule(sharded, features="streamed")
    dm.setup("fit")
    assert isinstance(dm.datasets["train"], ShardStream)
    batches = list(dm.val_dataloader())
    assert batches and all(b["context"].dtype == torch.bfloat16 for b in batches)
    assert sum(len(b["ids"]) for b in batches) == len(FeatureCache(sharded / "features_heldout"))


def test_check_cache_detects_a_corrupted_shard(sharded, tmp_path, capsys):
    work = tmp_path / "data"
    shutil.copytree(sharded, work)
    base = ["--config", TINY, f"--data.work_dir={work}", *DATA]
    code, out, err = cli(["check-cache", *base], capsys)
    assert code == 0 and out.count("ok") == 2, err
    shard = sorted((work / "features_train").glob("shard-*.tar"))[-1]
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0x01
    shard.write_bytes(bytes(data))
    FeatureCache(work / "features_train")  # opening does not hash (start-up stays cheap) ...
    code, _, err = cli(["check-cache", *base], capsys)
    assert code == 2 and shard.name in err and "sha256" in err  # ... check-cache does


def test_target_dtype(tmp_path):
    assert datamodule(tmp_path).target.model.dtype == torch.float32  # null on a CPU-only machine
    assert datamodule(tmp_path, dtype="bf16").target.model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="int8"):
        datamodule(tmp_path, dtype="int8")


def test_prepare_prints_and_stores_each_stage_against_the_roof(tmp_path, capsys):
    """The end of `prepare` says how close regeneration and feature extraction came to this machine's roof, and
    prepare_stats.json keeps the table (a stage without work, here none, has no row)."""
    work = tmp_path / "data"
    code, out, _ = cli(["prepare", "--config", TINY, f"--data.work_dir={work}", *DATA], capsys)
    assert code == 0
    assert "data stages against this machine's roof" in out
    doc = json.loads(DataPaths(work).stats.read_text())["roofline"]
    stages = {r["stage"] for r in doc["rows"]}
    assert {"regenerate_train", "features_train", "features_heldout"} <= stages
    assert all(0 < r["of_roof"] and r["roof_tok_s"] > 0 and r["tok_s"] > 0 for r in doc["rows"])
    assert doc["read_gb_s"] > 0 and doc["matmul_gflop_s"]["float32"] > 0
    for r in doc["rows"]:
        assert f"{r['stage']:<20}" in out


@pytest.mark.parametrize(
    "value, message",
    [
        ({"batch_size": 0}, r"data\.batch_size must be an integer >= 1, got 0"),
        ({"max_length": 1}, r"data\.max_length must be an integer >= 2"),
        ({"heldout_fraction": 1.5}, r"data\.heldout_fraction must be a finite number in \[0, 1\]"),
        ({"regen": {"top_k": 0}}, r"data\.regen\.top_k must be an integer >= 1"),
    ],
)
def test_the_data_module_checks_its_values_when_built(value, message, tmp_path):
    """The data section's ranges are the constructor's to check (a recipe, the command line and Python alike)."""
    from dspark_lightning.checks import UsageError

    with pytest.raises(UsageError, match=message):
        DSparkDataModule(target="tiny-debug", work_dir=str(tmp_path / "w"), **value)
    assert not (tmp_path / "w").exists()
