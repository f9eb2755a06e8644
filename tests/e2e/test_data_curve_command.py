"""`dspark-lightning data-curve` on the tiny recipe: arms trained and decoded, a finished arm reused, a grid larger
than the preparation refused before any training, the report written."""

from __future__ import annotations

import json

import yaml

from .conftest import TINY, run_main


def test_data_curve_runs_resumes_and_reports(tmp_path, capsys):
    recipe = yaml.safe_load(open(TINY).read())
    recipe["data"].update(features="cached", work_dir=str(tmp_path / "data"))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "curve"
    args = ["data-curve", "--recipe", str(path), "--epochs", "1", "--prompts_per_set", "1", "--max_new_tokens", "4",
            "--out", str(out)]  # fmt: skip
    code, stdout, err = run_main([*args, "--samples", "[4,8]"], capsys)
    assert code == 0, err[-2000:]
    arms = {p.stem: json.loads(p.read_text()) for p in (out / "arms").glob("*.json")}
    assert set(arms) == {"n4_e1", "n8_e1"} and arms["n4_e1"]["steps"] == 1 and arms["n8_e1"]["steps"] == 2
    assert all(c["rounds"] >= 1 for a in arms.values() for cs in a["counts"].values() for c in cs)
    assert "samples for τ = 2" in (out / "curve.md").read_text() and (out / "curve.png").read_bytes()[:4] == b"\x89PNG"
    (out / "arms" / "n8_e1.json").unlink()  # decoded again from its finished drafter, not trained again
    code, stdout, err = run_main([*args, "--samples", "[4,8]"], capsys)
    assert code == 0 and "training" not in stdout and (out / "arms" / "n8_e1.json").is_file(), err[-2000:]
    code, _, err = run_main([*args, "--samples", "[4,500]"], capsys)
    assert code == 2 and "--samples 500" in err and not (out / "runs" / "n500_e1").exists()
