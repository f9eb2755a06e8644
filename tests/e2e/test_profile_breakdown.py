"""benchmarks/profile_breakdown.py: where the time of a verification or drafting round goes, on a tiny target."""

import json
import sys
from pathlib import Path

import pytest

from dspark_lightning import load_target

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from profile_breakdown import main  # noqa: E402


def test_verify_breakdown(tmp_path, capsys):
    out = tmp_path / "verify"
    main(["verify", "--target", "tiny-debug", "--tokens", "1", "2", "8", "--rounds", "2", "--context_len", "16",
          "--out", str(out)])  # fmt: skip
    doc = json.loads((out / "verify_profile.json").read_text())
    variants = doc["info"]["variants"]
    assert variants[0] == "hf" and variants[-1] == "lean" and doc["info"]["breakdown_of"] == "lean"
    assert [r["B"] for r in doc["rows"]] == [1, 2, 8]
    for r in doc["rows"]:
        assert all(r[f"{n}_ms"] > 0 for n in variants)
    assert doc["rows"][0]["hf_vs_B1"] == 1.0
    assert set(doc["breakdown"]) == {"1", "8"} and all(o["ms_per_step"] >= 0 for o in doc["breakdown"]["1"])
    assert (out / "verify_profile.md").read_text().startswith(
        "Verification step"
    ) and "| B |" in capsys.readouterr().out


def test_draft_breakdown(drafter, tmp_path):
    out = tmp_path / "draft"
    main(["draft", "--target", "tiny-debug", "--drafter", drafter, "--layers", "1", "--rounds", "2",
          "--context_len", "16", "--out", str(out)])  # fmt: skip
    doc = json.loads((out / "draft_profile.json").read_text())
    V = load_target("tiny-debug").geometry.vocab_size
    variants = ["trained", "trained bf16", f"vocab {V}", f"vocab {V} bf16"]  # no draft vocabulary below V here
    assert sorted({r["variant"] for r in doc["rows"]}) == sorted(variants)
    assert {(r["variant"], r["T"]) for r in doc["rows"]} == {(v, T) for v in variants for T in (0.0, 1.0)}
    for r in doc["rows"]:
        assert r["total"] > 0 and r["backbone"] > 0 and r["block_size"] == (3 if "trained" in r["variant"] else 7)
        assert r["total"] >= r["backbone"]
    assert doc["info"]["drafter"] == drafter


@pytest.mark.parametrize(
    "args, word",
    [(["ops", "--out", "o"], "invalid choice"), (["verify"], "--out"), (["verify", "--out", "o", "--tokens", "0"],
     "--tokens"), (["verify", "--out", "o", "--drafter", "d"], "--drafter")],
)  # fmt: skip
def test_bad_options_are_refused_before_any_work(tmp_path, capsys, monkeypatch, args, word):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--target", "tiny-debug", *args] if args[0] != "ops" else args)
    assert e.value.code == 2 and word in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
