"""`prepare` and `fit` link the recipe's target the same way (``lightning.config.target_for_trainer``, then
``TargetConfig.torch_dtype``), so the data `prepare` makes is the data `fit` looks for: a CPU recipe prepared on a
machine with a GPU fingerprints the fp32 target `fit` trains against, not the bf16 that ``dtype: null`` means on
CUDA."""

from __future__ import annotations

import json

import pytest
import torch
from test_prepare import DATA, TINY, cli

from dspark_lightning.data.prepare import DataPaths
from dspark_lightning.lightning.config import TargetConfig
from dspark_lightning.lightning.datamodule import DSparkDataModule


@pytest.fixture
def fake_gpu(monkeypatch):
    """This machine, as far as the code that picks devices and dtypes asks, has one CUDA device. The target still
    runs on the CPU (there is no GPU to run it on), in the dtype it was asked for; the roofline report, which times
    the device, is skipped."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    load = TargetConfig.load
    monkeypatch.setattr(TargetConfig, "load", lambda self, device=None, dtype=None: load(self, None, dtype))
    monkeypatch.setattr(DSparkDataModule, "report_roofline", lambda self: [])


def _prepared(work, *extra: str) -> DSparkDataModule:
    """The data module `prepare` builds from the tiny recipe (accelerator cpu, target dtype null) and ``extra``."""
    from dspark_lightning.cli.prepare import parse_recipe, prepare

    return parse_recipe("prepare", ["--config", TINY, f"--data.work_dir={work}", *DATA, *extra], prepare)[0]


def test_a_cpu_recipe_prepared_where_a_gpu_exists_is_found_by_fit(fake_gpu, tmp_path, capsys, monkeypatch):
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.lightning.module import DSparkModule

    work = tmp_path / "data"
    code, _, err = cli(["prepare", "--config", TINY, f"--data.work_dir={work}", *DATA], capsys)
    assert code == 0, err[-3000:]
    prepared = json.loads(DataPaths(work).prepared.read_text())["fingerprint"]

    monkeypatch.chdir(tmp_path)
    args = ["--config", TINY, f"--data.work_dir={work}", *DATA]
    fit = DSparkCLI(DSparkModule, DSparkDataModule, run=False, args=args)
    job = fit.datamodule.prepare_job(progress=False)
    assert job.fingerprint == prepared and job.target_id["dtype"] == "fp32"
    assert fit.model.target.lm_head.weight.dtype == torch.float32  # the target fit trains against: the data's
    fit.datamodule.prepare_data()  # on a machine with a GPU, fit refuses to make data it does not find
    assert "reusing prepared data" in capsys.readouterr().out

    unlinked = _prepared(work)  # the recipe's target without the trainer's say: bf16 on this machine, other data
    unlinked.target_config = TargetConfig(name="tiny-debug")
    assert unlinked.prepare_job(progress=False).fingerprint != prepared


def test_the_trainer_decides_a_null_dtype_in_prepare_as_in_fit(fake_gpu, tmp_path):
    """Under the same recipe both commands name the same target dtype; ``--device`` moves where `prepare` runs, never
    which data it makes."""
    cpu = _prepared(tmp_path).prepare_job(progress=False)
    gpu_args = ("--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed")
    gpu = _prepared(tmp_path, *gpu_args).prepare_job(progress=False)
    assert cpu.target_id["dtype"] == "fp32" and gpu.target_id["dtype"] == "bf16"
    assert cpu.fingerprint != gpu.fingerprint
    dm = _prepared(tmp_path, *gpu_args)
    dm.prepare_device = "cpu"
    assert dm.prepare_job(progress=False).fingerprint == gpu.fingerprint
    full = _prepared(tmp_path, "--trainer.accelerator=gpu", "--trainer.precision=32-true").prepare_job(progress=False)
    assert full.fingerprint == cpu.fingerprint  # a 32-bit precision keeps the target in fp32 on any accelerator
