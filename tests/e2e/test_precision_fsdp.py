"""bf16 training (mixed and true) on the tiny target, and the FSDP export's full-state gather."""

from __future__ import annotations

import csv
import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .conftest import TINY


@pytest.mark.parametrize(
    "precision, extra",
    [("bf16-mixed", []), ("bf16-true", ["--target.dtype=bf16"])],
    ids=["bf16-mixed", "bf16-true"],
)
def test_fit_trains_in_bf16_and_exports(workdir, precision, extra):
    from dspark_lightning import load_drafter
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    args = ["fit", "--config", TINY, f"--trainer.precision={precision}", "--trainer.max_steps=3"]
    args += ["--trainer.log_every_n_steps=1", "--validate_before_fit=false", "--model.loss.chunk_size=4", *extra]
    cli = DSparkCLI(DSparkModule, DSparkDataModule, args=args)
    rows = list(csv.DictReader(open(workdir / "outputs/tiny_debug/csv/version_0/metrics.csv")))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    want = torch.bfloat16 if precision == "bf16-true" else torch.float32
    assert next(cli.model.drafter.parameters()).dtype == want
    # AdamW is fused unless Lightning's AMP plugin must clip its gradients (it cannot for a fused optimizer)
    assert bool(cli.trainer.optimizers[0].defaults["fused"]) is (not precision.endswith("-mixed"))
    loaded = load_drafter(Path(cli.trainer.log_dir) / "drafter", cli.model.target)
    for name, value in loaded.state_dict().items():
        assert torch.equal(value.to(want), cli.model.drafter.state_dict()[name].cpu()), name


def test_bf16_true_with_an_fp32_target_fails_with_one_line(workdir, capsys):
    from .conftest import run_main

    code, _, err = run_main(["fit", "--config", TINY, "--trainer.precision=bf16-true", "--trainer.max_steps=1"], capsys)
    assert code == 2 and "target.dtype" in err and len(err.strip().splitlines()) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gather_worker(rank: int, world: int, port: int, out: str) -> None:
    """One rank: the same tiny DSparkModule on every rank, its drafter sharded by FSDP, then the export gather."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dspark_lightning.checkpoint import load_drafter, save_drafter
    from dspark_lightning.lightning.callbacks import full_drafter_state
    from dspark_lightning.lightning.module import DSparkModule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        module = DSparkModule(backbone="dense", seq_head="vanilla", conf_head="linear", block_size=4)
        reference = {k: v.clone() for k, v in module.drafter.state_dict().items()}
        mesh = init_device_mesh("cpu", (world,))
        fully_shard(module.drafter, mesh=mesh)
        fully_shard(module, mesh=mesh)
        local = sum(p.to_local().numel() for p in module.drafter.parameters())
        assert local < sum(v.numel() for v in reference.values())  # each rank holds a shard only
        state = full_drafter_state(module)  # what DSparkModule.drafter_state_dict runs on trainer.strategy.model
        if rank == 0:
            assert state.keys() == reference.keys()
            for k, v in reference.items():
                assert torch.equal(state[k], v), k
            save_drafter(module.drafter, out, module.target, state=state)
            loaded = load_drafter(out)
            assert all(torch.equal(loaded.state_dict()[k], v) for k, v in reference.items())
        else:
            assert state == {}
    finally:
        dist.destroy_process_group()


def test_fsdp_export_gathers_the_full_drafter_on_rank_zero(tmp_path):
    """Two gloo processes on the CPU. Lightning's FSDPStrategy (FSDP1) needs an accelerator, so the drafter is sharded
    with FSDP2 (``fully_shard``, which runs on the CPU); the gather is the same ``get_model_state_dict`` call for both.
    Rank 0 gets a drafter equal to the unsharded one and writes it, and it loads; rank 1 gets nothing."""
    mp.start_processes(
        _gather_worker, args=(2, _free_port(), str(tmp_path / "drafter")), nprocs=2, join=True, start_method="spawn"
    )
    assert (tmp_path / "drafter" / "model.safetensors").is_file()
