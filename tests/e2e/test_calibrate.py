"""STS calibration: the command, the file next to the weights, and its effect on decoding."""

import json

import pytest
import torch

from dspark_lightning import create, load_drafter, load_target
from dspark_lightning.calibration import STSResult, position_reports, save_calibration
from dspark_lightning.checkpoint import read_config, save_drafter
from dspark_lightning.checkpoint.calibration import calibration_file
from dspark_lightning.infer import decode

from .conftest import run_main


@pytest.fixture
def drafter_dir(tmp_path):
    target = load_target("tiny-debug")
    torch.manual_seed(0)
    d = create(
        "drafter", "dspark", target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    return save_drafter(d, tmp_path / "dspark", target)


def test_calibrate_command_writes_the_file_and_the_report(drafter_dir, tmp_path, capsys):
    report = tmp_path / "report"
    args = ["calibrate", "--drafter", str(drafter_dir), "--prompts_per_domain", "2", "--max_new_tokens", "16"]
    code, out, err = run_main(args + ["--min_rows", "10", "--min_class", "1", "--report_dir", str(report)], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((drafter_dir / calibration_file(1.0)).read_text())
    assert len(doc["temperatures"]) == 3 and all(t > 0 for t in doc["temperatures"])
    assert doc["weights_sha256"] == read_config(drafter_dir)["weights_sha256"] and doc["bins"] == 20
    ds = doc["dataset"]
    # 2 prompts per domain, half held out: prompt 1 of each domain's pair never reaches the fit
    assert ds["fit_rounds"] + ds["heldout_rounds"] == ds["rounds"] and ds["heldout_rounds"] > 0
    assert (
        doc["rows_per_position"][0] == ds["fit_rounds"] and doc["heldout"]["after"][0]["rows"] == ds["heldout_rounds"]
    )
    for before, after in zip(doc["before"], doc["after"], strict=True):
        assert after["ece"] <= before["ece"] + 1e-12  # T = 1 is in the grid, so STS never does worse on the fit set
    assert sorted(p.name for p in report.iterdir()) == [
        "calibration_report.json", "calibration_report.md", *(f"reliability_pos{k}.png" for k in (1, 2, 3)),
        "rollouts.pt",
    ]  # fmt: skip
    assert "| 1 |" in out and "held-out ECE raw → STS" in out
    # a refit from the saved rollouts decodes nothing and gives the same temperatures
    code, out2, err = run_main(
        args + ["--min_rows", "10", "--min_class", "1", "--rollouts", str(report / "rollouts.pt")], capsys
    )
    assert code == 0, err[-2000:]
    assert json.loads((drafter_dir / calibration_file(1.0)).read_text())["temperatures"] == doc["temperatures"]


def _save(drafter_dir, temps, sha=None):
    z, m, ell = torch.zeros(4, 3), torch.zeros(4), torch.full((4,), 3)
    rep = position_reports(z, m, ell, torch.ones(3))
    res = STSResult(temperatures=temps, before=rep, after=rep, grid=[1.0])
    sha = sha or read_config(drafter_dir)["weights_sha256"]
    return save_calibration(drafter_dir, res, temperature=1.0, dataset={"test": True}, weights_sha256=sha)


def test_temperatures_round_trip_and_change_the_schedule(drafter_dir):
    _save(drafter_dir, [0.01, 0.01, 0.01])
    target = load_target("tiny-debug")
    drafter = load_drafter(drafter_dir, target)
    assert drafter.calibrations == {1.0: [0.01, 0.01, 0.01]}
    prompts = ["hello there", "count to ten"]
    kw = {
        "max_new_tokens": 12,
        "temperature": 1.0,
        "seed": 1,
        "scheduler": {"class_path": "threshold", "init_args": {"threshold": 0.9}},
    }
    raw = decode(target, drafter, prompts, calibrated=False, **kw)
    cal = decode(target, drafter, prompts, **kw)
    z_raw, z_cal = torch.stack(raw.log.conf_logits), torch.stack(cal.log.conf_logits)  # raw logits, always logged
    a_raw, a_cal = torch.stack(raw.log.survival), torch.stack(cal.log.survival)
    torch.testing.assert_close(a_raw[:, 0], torch.sigmoid(z_raw[:, 0]))
    torch.testing.assert_close(a_cal[:, 0], torch.sigmoid(z_cal[:, 0] / 0.01))  # ĉ_1 = σ(z_1 / T*_1)
    # raw ĉ ≈ 0.5 never clears θ = 0.9; with T = 0.01 a positive first logit gives ĉ_1 ≈ 1, so drafts get verified
    assert raw.stats.mean_verify_len == 0 < cal.stats.mean_verify_len
    with pytest.warns(UserWarning, match="no calibration for T = 0"):
        decode(target, drafter, prompts, max_new_tokens=4, temperature=0.0)


def test_coupled_acceptance_reads_the_map_fitted_on_coupled_rounds(drafter_dir):
    """A map fitted on coupled rounds (``calibration_T1_coupled.json``) is what the scheduler sees under coupled
    acceptance, as it is; without one, coupled acceptance maps the rejection-sampling map to c / (2 - c); rejection
    sampling never reads the coupled map."""
    from dspark_lightning.checkpoint.calibration import ConfidenceMap, write_calibration

    sha = read_config(drafter_dir)["weights_sha256"]

    def write(bias, acceptance=None):
        doc = {"temperatures": None, "sampling_temperature": 1.0, "weights_sha256": sha,
               "confidence": ConfidenceMap((0.0,) * 3, (0.0,) * 3, (bias,) * 3).to_dict()}  # fmt: skip
        return write_calibration(drafter_dir, doc | ({"acceptance": acceptance} if acceptance else {}))

    def seen(acceptance):
        confs = []

        def record(conf):
            confs.append(conf.clone())
            return torch.zeros(conf.shape[0], dtype=torch.long)

        target = load_target("tiny-debug")
        decode(target, load_drafter(drafter_dir, target), ["hello there"], max_new_tokens=6, temperature=1.0, seed=1,
               scheduler=record, acceptance=acceptance)  # fmt: skip
        return torch.cat(confs)

    write(2.0)  # rejection sampling: ĉ = σ(2) ≈ 0.88
    c = torch.sigmoid(torch.tensor(2.0))
    torch.testing.assert_close(seen("coupled"), torch.full_like(seen("coupled"), float(c / (2 - c))))
    assert write(-2.0, "coupled").name == "calibration_T1_coupled.json"
    torch.testing.assert_close(seen("coupled"), torch.full_like(seen("coupled"), float(1 - c)))  # σ(-2) as it is
    torch.testing.assert_close(seen("rejection"), torch.full_like(seen("rejection"), float(c)))
    drafter = load_drafter(drafter_dir, load_target("tiny-debug"))
    assert sorted(drafter.confidence_maps) == [(1.0, "coupled"), (1.0, "rejection")]
    assert drafter.calibrations == {}  # exports carry STS temperatures of rejection sampling only


def test_calibrate_under_coupled_acceptance_writes_its_own_file(drafter_dir, capsys):
    args = ["calibrate", "--drafter", str(drafter_dir), "--prompts_per_domain", "2", "--max_new_tokens", "12",
            "--min_rows", "10", "--min_class", "1"]  # fmt: skip
    code, out, err = run_main(args + ["--acceptance", "coupled"], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((drafter_dir / "calibration_T1_coupled.json").read_text())
    assert doc["acceptance"] == "coupled" and doc["dataset"]["rounds"] > 0
    assert "coupled acceptance" in out and not (drafter_dir / calibration_file(1.0)).exists()
    code, out, err = run_main(args + ["--acceptance", "coupled", "--temperature", "0"], capsys)
    assert code == 2 and "greedy decoding accepts the same drafts" in err
    code, out, err = run_main(args + ["--acceptance", "nope"], capsys)
    assert code == 2 and "--acceptance 'nope' is not one of" in err


def test_a_calibration_for_other_weights_is_ignored(drafter_dir):
    _save(drafter_dir, [0.5, 0.5, 0.5], sha="0" * 64)
    with pytest.warns(UserWarning, match="other weights"):
        drafter = load_drafter(drafter_dir, load_target("tiny-debug"))
    assert drafter.calibrations == {}


def test_hardware_aware_warns_on_uncalibrated_confidences(drafter_dir):
    import warnings

    from dspark_lightning.infer import SPSTable

    target = load_target("tiny-debug")
    sps = SPSTable.from_points({1: 10.0, 2: 9.0, 4: 8.0, 8: 4.0})
    kw = {
        "max_new_tokens": 4,
        "temperature": 1.0,
        "scheduler": {"class_path": "hardware_aware", "init_args": {"sps": sps}},
    }
    with pytest.warns(UserWarning, match="uncalibrated confidences"):
        decode(target, load_drafter(drafter_dir, target), ["hi"], **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # T = 0: the raw head is the documented default, no warning
        decode(target, load_drafter(drafter_dir, target), ["hi"], **{**kw, "temperature": 0.0})
    _save(drafter_dir, [1.5, 1.5, 1.5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # calibrated: no warning at all
        decode(target, load_drafter(drafter_dir, target), ["hi"], **kw)
    with pytest.warns(UserWarning, match="calibrated=False"):
        decode(target, load_drafter(drafter_dir, target), ["hi"], calibrated=False, **kw)


def test_fit_calibrates_the_exported_drafter(workdir):
    """``fit --calibrate {temperatures: [0.0]}``: the export carries calibration_T0.json for its own weights."""
    from pathlib import Path

    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    from .conftest import TINY

    spec = "{temperatures: [0.0], prompts_per_domain: 2, max_new_tokens: 12}"
    args = ["fit", "--config", TINY, "--trainer.max_steps=2", f"--export.calibrate={spec}"]
    cli = DSparkCLI(DSparkModule, DSparkDataModule, args=args)
    export = Path(cli.trainer.log_dir) / "drafter"
    doc = json.loads((export / calibration_file(0.0)).read_text())
    assert doc["weights_sha256"] == read_config(export)["weights_sha256"] and len(doc["temperatures"]) == 4
    assert load_drafter(export).calibrations.keys() == {0.0}


@pytest.mark.parametrize(
    ("spec", "match"),
    [("{temperatures: []}", "non-empty list"), ("{temperatures: [-1.0]}", "temperatures"),
     ("{temperatures: [0.0], prompts: 3}", "prompts"), ("{temperatures: [0.0], domains: [law]}", "domains"),
     ("{temperatures: [0.0], prompts_per_domain: 0}", "prompts_per_domain")],
)  # fmt: skip
def test_fit_calibrate_spec_is_checked_before_training(spec, match, workdir, capsys):
    """``export.calibrate`` is typed (:class:`Calibration`): a bad one is one line, before any data work."""
    from dspark_lightning.lightning.callbacks import Calibration

    from .conftest import TINY, run_main

    code, out, err = run_main(["fit", "--config", TINY, f"--export.calibrate={spec}"], capsys)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
    assert "regenerate" not in out + err
    assert Calibration([1]).runs() == [{"temperature": 1.0}]
