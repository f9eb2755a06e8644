"""FastestPrecision: bf16 autocast where it is faster on this machine, else fp32; both fit from a recipe."""

from __future__ import annotations

import pytest
import torch

from dspark_lightning.lightning import precision as prec_mod
from dspark_lightning.lightning.precision import FastestPrecision

from .conftest import TINY

PLUGIN = "--trainer.plugins=[{class_path: dspark_lightning.lightning.precision.FastestPrecision}]"


@pytest.mark.parametrize("faster", [True, False])
def test_picks_bf16_autocast_only_where_it_is_faster(monkeypatch, faster):
    monkeypatch.setattr(prec_mod, "cpu_bf16_faster", lambda *a, **k: faster)
    p = FastestPrecision(device="cpu")
    assert p.precision == ("bf16-mixed" if faster else "32-true") and p.scaler is None
    w = torch.randn(4, 4)
    with p.forward_context():
        y = torch.randn(2, 4) @ w
    assert y.dtype == (torch.bfloat16 if faster else torch.float32)
    assert FastestPrecision(device="cuda").precision == "bf16-mixed"  # no probe off the CPU


@pytest.mark.parametrize("faster", [True, False])
def test_fit_with_the_plugin_trains_in_what_it_chose(workdir, monkeypatch, faster):
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    monkeypatch.setattr(prec_mod, "cpu_bf16_faster", lambda *a, **k: faster)
    args = ["fit", "--config", TINY, "--trainer.max_steps=2", "--trainer.precision=null", PLUGIN]
    cli = DSparkCLI(DSparkModule, DSparkDataModule, args=args)
    assert cli.trainer.precision == ("bf16-mixed" if faster else "32-true")
    assert cli.trainer.global_step == 2
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in cli.model.drafter.parameters())
