"""``serve-bench`` and ``threshold-sweep`` end to end on the tiny target: every documented file, with its schema."""

import json

import pytest
import torch

from dspark_lightning import create, load_target
from dspark_lightning.checkpoint import save_drafter
from dspark_lightning.eval.runner import scheduler_label
from dspark_lightning.eval.serve_bench import DEFAULT_METHODS
from dspark_lightning.eval.serve_bench import OUTPUT_FILES as SERVE_FILES
from dspark_lightning.eval.sweep import OUTPUT_FILES as SWEEP_FILES
from dspark_lightning.infer import SPSTable

from .conftest import run_main


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    target = load_target("tiny-debug")
    torch.manual_seed(0)
    d = create(
        "drafter", "dspark", target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    return save_drafter(d, root / "dspark", target)


@pytest.fixture(scope="module")
def sps_file(tmp_path_factory):
    """A made-up SPS curve (flat up to 8 tokens, then falling) so the test never profiles."""
    pts = {1: 100.0, 2: 99.0, 4: 98.0, 8: 95.0, 16: 60.0, 32: 30.0}
    return SPSTable.from_points(pts, device="test").save(tmp_path_factory.mktemp("sps") / "sps.json")


def test_serve_bench_writes_every_file(drafter_dir, sps_file, tmp_path, capsys):
    out = tmp_path / "serve"
    args = ["serve-bench", "--drafter", str(drafter_dir), "--sps", str(sps_file), "--domains", "[math,chat]"]
    args += ["--prompts_per_domain", "1", "--concurrency", "[1,4]", "--window_s", "0.3", "--max_new_tokens", "8"]
    args += ["--repeats", "2"]
    code, stdout, err = run_main(args + ["--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(SERVE_FILES)
    doc = json.loads((out / "serve_bench.json").read_text())
    assert (
        doc["methods"] == [scheduler_label(m) for m in DEFAULT_METHODS]
        and doc["concurrency"] == [1, 4]
        and doc["info"]["prompts"] == 2
    )
    rows = {(r["concurrency"], r["method"]): r for r in doc["rows"]}
    assert len(rows) == len(doc["rows"]) == 2 * len(DEFAULT_METHODS)
    for (n, method), r in rows.items():
        assert r["steps"] >= 3 and r["tokens"] > 0 and r["aggregate_tok_s"] > 0, (n, method)
        assert len(r["runs_aggregate_tok_s"]) == 2 and r["aggregate_tok_s"] == pytest.approx(
            sum(r["runs_aggregate_tok_s"]) / 2
        )
        assert r["per_user_tok_s"] is not None and r["per_user_tok_s"] > 0
        assert r["request_rounds"] == r["steps"] * n  # closed loop: every step serves all N requests (mean of 2 runs)
        # B counts every verified draft; ℓ_eff is shorter for a round that ended on an accepted stop token
        assert n * (1 + r["mean_verify_len"]) - 1e-9 <= r["mean_step_tokens"] <= n * 4
        assert set(r["time_split_s"]) == {"prefill", "draft", "schedule", "verify", "accept"}
        assert r["verify_ms_per_step"] == pytest.approx(1000 * r["time_split_s"]["verify"] / r["steps"])
        # the cost model Algorithm 1 sees: the made-up table at the cell's mean B (100 steps/s up to B = 2)
        assert r["sps_table_ms"] >= 10.0 - 1e-9 and (r["mean_step_tokens"] > 2 or r["sps_table_ms"] < 10.11)
        assert r["requests_started"] >= r["requests_finished"] - n
    for n in (1, 4):
        assert rows[(n, "plain")]["mean_verify_len"] == 0 and rows[(n, "plain")]["time_split_s"]["draft"] == 0
        assert 0 < rows[(n, "static:1")]["mean_verify_len"] <= 1  # ≤: an accepted stop token shortens a round
        assert rows[(n, "static:1")]["mean_verify_len"] <= rows[(n, "static:3")]["mean_verify_len"] <= 3
        assert rows[(n, "static:5")]["mean_verify_len"] <= 3  # γ capped at the block size
        assert 0 <= rows[(n, "hardware_aware")]["mean_verify_len"] <= 3
    # 8 tokens per request at ~0.3 s per cell: requests finish and are replaced inside the window
    assert any(r["requests_started"] > 0 for r in doc["rows"])
    md = (out / "serve_bench.md").read_text()
    assert "| 4 | hardware_aware |" in md and "best static" in md and "vs static:7" in md and "best static" in stdout
    for png in ("frontier.png", "budget.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_serve_bench_rejects_an_unknown_method(drafter_dir, tmp_path, capsys):
    args = ["serve-bench", "--drafter", str(drafter_dir), "--methods", "[plain,speculative:9]"]
    code, _, err = run_main(args + ["--out", str(tmp_path / "o"), "--prompts_per_domain", "1"], capsys)
    head = "dspark-lightning serve-bench: error: --methods unknown scheduler 'speculative'"
    assert code == 2 and err.startswith(head)
    assert "static" in err and len(err.strip().splitlines()) == 1  # the registered schedulers are listed


def test_a_registered_scheduler_is_a_method(monkeypatch):
    from dspark_lightning import registry
    from dspark_lightning.eval.serve_bench import method_scheduler

    class One:  # a third-party scheduler: verify one draft per request
        def __call__(self, conf):
            return torch.ones(conf.shape[0], dtype=torch.long)

    registry._ensure_loaded()
    monkeypatch.setitem(registry._REGISTRY["scheduler"], "serve_bench_test_one", One)  # undone after the test
    assert method_scheduler("serve_bench_test_one") == (True, "serve_bench_test_one")
    with pytest.raises(ValueError, match="serve_bench_test_one"):  # listed among the choices
        method_scheduler("{class_path: serve_bench_tests_one}")
    assert method_scheduler("plain") == (False, "static")
    spec = {"class_path": "static", "init_args": {"gamma": 3}}
    assert method_scheduler("{class_path: static, init_args: {gamma: 3}}") == method_scheduler(spec) == (True, spec)


def test_threshold_sweep_writes_every_file(drafter_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["threshold-sweep", "--drafter", str(drafter_dir), "--domains", "[math,code]", "--prompts_per_domain", "2"]
    code, stdout, err = run_main(
        args + ["--thresholds", "[0,0.5,1]", "--max_new_tokens", "8", "--out", str(out)], capsys
    )
    assert code == 0, err[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(SWEEP_FILES)
    doc = json.loads((out / "threshold_sweep.json").read_text())
    assert [(r["domain"], r["threshold"]) for r in doc["rows"]] == [
        (d, t) for d in ("math", "code") for t in (0, 0.5, 1)
    ]
    for r in doc["rows"]:
        assert r["verified_per_round"] == pytest.approx(r["accepted_per_round"] + r["rejected_per_round"])
        if r["acceptance_rate"] is not None:
            assert r["acceptance_rate"] == pytest.approx(r["accepted_per_round"] / r["verified_per_round"])
    by = {(r["domain"], r["threshold"]): r for r in doc["rows"]}
    for d in ("math", "code"):
        assert 2.5 < by[(d, 0)]["verified_per_round"] <= 3 and by[(d, 0)]["skipped_rounds"] == 0  # θ = 0: whole block
        assert (
            by[(d, 1)]["verified_per_round"] <= by[(d, 0.5)]["verified_per_round"] <= by[(d, 0)]["verified_per_round"]
        )
    assert "| math | 0 |" in stdout and (out / "threshold_sweep.png").read_bytes()[:4] == b"\x89PNG"
