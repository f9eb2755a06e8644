"""``export --server sglang`` writes the STS table SGLang's ``--speculative-dspark-confidence-sts-path`` loads.

:func:`sglang_sts_load` reads a file as SGLang 0.5.23 does, written from its source (PyPI wheel ``sglang==0.5.23``;
``sgl-project/sglang`` has the same code):

- ``srt/speculative/dspark_components/dspark_sts.py``: ``load_sts_calibration_from_path`` decodes the file into the
  msgspec Struct ``DSparkStsCalibration``: ``temperatures: list[float]`` required, non-empty, every entry > 0;
  ``dataset`` (str), ``num_samples`` (int), ``ece_before`` / ``ece_after`` (list[float]) optional; unknown keys are
  ignored (msgspec's default, ``forbid_unknown_fields=False``).
- ``srt/speculative/dspark_components/dspark_planner.py``: ``DSparkVerifyPlanner.__init__`` raises unless there are
  exactly γ temperatures, then sets them as the confidence head's ``sts_temperatures``.
- ``srt/models/dspark.py``: ``DSparkConfidenceHead.apply_sts`` returns σ(z / T) per position (T broadcast over the
  (batch, γ) logits); the planner ranks the running product (``compute_sort_survival``).

SGLang itself needs torch 2.14, so it is not installed in this venv; its loader was run once on these files by hand
(SGLang 0.5.23 in a venv of its own) and read them as :func:`sglang_sts_load` does.
"""

import json
import math

import pytest
import torch

from dspark_lightning import create
from dspark_lightning.checkpoint import save_drafter
from dspark_lightning.checkpoint.files import read_config
from dspark_lightning.cli import main
from dspark_lightning.export import export_serving
from dspark_lightning.export.plan import export_for_servers

GAMMA = 3
FLAG = "--speculative-dspark-confidence-sts-path"


def sglang_sts_load(path, gamma):
    """The per-position temperatures SGLang would apply, or ``ValueError`` where it raises (see the module doc)."""
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or "temperatures" not in doc:
        raise ValueError("Object missing required field `temperatures`")
    temps = doc["temperatures"]
    if not isinstance(temps, list) or not all(isinstance(t, int | float) and not isinstance(t, bool) for t in temps):
        raise ValueError("Expected `array` of `float` at `$.temperatures`")
    if not temps:
        raise ValueError("DSparkStsCalibration requires at least one temperature.")
    if any(t <= 0 for t in temps):
        raise ValueError("DSparkStsCalibration temperatures must all be > 0")
    if len(temps) != gamma:
        raise ValueError(f"DSpark STS calibration was fit for gamma={len(temps)} but the runtime gamma is {gamma}")
    return [float(t) for t in temps]


def sglang_confidence(logits, temps):
    """``DSparkConfidenceHead.apply_sts``: σ(z / T), T per position."""
    return torch.sigmoid(logits.float() / torch.tensor(temps, dtype=torch.float32))


def drafter(target):
    torch.manual_seed(0)
    return create(
        "drafter",
        "dspark",
        target,
        block_size=GAMMA,
        mask_token_id=1,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head={"class_path": "vanilla", "init_args": {"rank": 8}},
        conf_head="linear",
    ).eval()


def calibrated(target, tmp_path, cals):
    """A native drafter folder with one ``calibration_T<T>.json`` per entry of ``cals`` ({T: temperatures})."""
    native = save_drafter(drafter(target), tmp_path / "native", target)
    sha = read_config(native)["weights_sha256"]
    for T, temps in cals.items():
        doc = {"temperatures": temps, "sampling_temperature": T, "weights_sha256": sha, "bins": 20}
        (native / f"calibration_T{T:g}.json").write_text(json.dumps(doc))
    return native


def test_sglang_export_writes_one_table_per_calibrated_temperature_with_its_flag(tiny_target, tmp_path, capsys):
    cals = {0.0: [20.0, 1.5, 0.75, 9.0], 1.0: [2.0, 1.25, 0.5]}  # the T = 0 fit holds one position past γ
    native = calibrated(tiny_target, tmp_path, cals)
    out = tmp_path / "sglang"
    main(["export", "--drafter", str(native), "--out", str(out), "--server", "sglang"])
    printed = capsys.readouterr().out
    for T, temps in cals.items():
        path = out / f"sglang_sts_T{T:g}.json"
        assert sglang_sts_load(path, GAMMA) == temps[:GAMMA]
        assert json.loads(path.read_text())["sampling_temperature"] == T
        assert f"{path} (T = {T:g})" in printed
    assert f"note: sglang: STS tables for {FLAG}" in printed
    assert sorted(p.name for p in out.glob("sglang_sts_*")) == ["sglang_sts_T0.json", "sglang_sts_T1.json"]
    z = torch.tensor([[0.0, 2.0, -1.0], [3.0, -0.5, 1.0]])  # confidence logits (batch, γ)
    want = [[1 / (1 + math.exp(-zk / t)) for zk, t in zip(row, cals[1.0], strict=True)] for row in z.tolist()]
    got = sglang_confidence(z, sglang_sts_load(out / "sglang_sts_T1.json", GAMMA))
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)  # our c_k = σ(z_k / T_k), position by position


def test_sglang_export_without_calibration_says_which_command_calibrates(varied_target, tmp_path):
    out = tmp_path / "sglang"
    res = export_serving(drafter(varied_target), varied_target, "dspark-hf", out, server="sglang")
    notes = [n for n in res.notes if n.startswith("sglang:")]
    assert len(notes) == 1 and "no STS calibration" in notes[0] and "dspark-lightning calibrate --drafter" in notes[0]
    assert not list(out.glob("sglang_sts_*"))


def test_a_calibration_shorter_than_the_block_is_a_note_not_a_table(varied_target, tmp_path):
    d = drafter(varied_target)
    d.calibrations = {1.0: [2.0, 1.0]}
    res = export_serving(d, varied_target, "dspark-hf", tmp_path / "o", server="all")
    assert any("has 2 temperatures for block size 3, a length SGLang refuses" in n for n in res.notes)
    assert not list((tmp_path / "o").glob("sglang_sts_*"))
    (tmp_path / "short.json").write_text(json.dumps({"temperatures": [2.0, 1.0]}))
    with pytest.raises(ValueError, match="gamma=2 but the runtime gamma is 3"):  # what SGLang would have said
        sglang_sts_load(tmp_path / "short.json", GAMMA)


def test_export_after_fit_writes_the_tables_and_an_overwrite_drops_stale_ones(tiny_target, tmp_path):
    native = calibrated(tiny_target, tmp_path, {0.0: [1.5, 1.0, 0.5], 1.0: [2.0, 1.25, 0.5]})
    lines = []
    done = export_for_servers(native, "dspark-hf", ["sglang"], log=lines.append)
    assert sorted(p.name for p in done["sglang"].glob("sglang_sts_*")) == ["sglang_sts_T0.json", "sglang_sts_T1.json"]
    assert any(f"{FLAG} (one per server launch" in line and str(done["sglang"]) in line for line in lines)
    (native / "calibration_T1.json").unlink()  # recalibrated at T = 0 only
    export_for_servers(native, "dspark-hf", ["sglang"], log=lines.append)
    assert [p.name for p in done["sglang"].glob("sglang_sts_*")] == ["sglang_sts_T0.json"]
