"""End-to-end `fit` on tiny_debug: metrics, checkpoint, exported drafter that reloads bit-identically."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import TINY


def test_fit_exports_a_drafter_that_reloads_identically(workdir):
    from dspark_lightning import load_drafter
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    cli = DSparkCLI(DSparkModule, DSparkDataModule, args=["fit", "--config", TINY, "--trainer.max_steps=4"])
    export = Path(cli.trainer.log_dir) / "drafter"
    assert (export / "config.json").is_file() and (export / "model.safetensors").is_file()
    assert list(Path(cli.trainer.log_dir, "checkpoints").glob("*.ckpt"))

    rows = list(csv.DictReader(open(workdir / "outputs/tiny_debug/csv/version_0/metrics.csv")))
    taus = [float(r["val/tau_hat"]) for r in rows if r.get("val/tau_hat")]
    assert len(taus) >= 2 and all(1.0 <= t <= 5.0 for t in taus)  # step-0 validation + at least one more
    assert any(r.get("train/loss") for r in rows)

    trained = cli.model.drafter.eval()
    loaded = load_drafter(export)
    assert loaded.config() == trained.config()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (2, 20), generator=g)
    ctx = cli.model.target(ids).context
    anchors, valid = torch.tensor([[3, 9], [5, 11]]), torch.ones(2, 2, dtype=torch.bool)
    with torch.no_grad():
        a, b = trained(ctx, ids, anchors, valid), loaded(ctx, ids, anchors, valid)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.conf_logits, b.conf_logits)


def _plain_trainer(root: Path, **kw):
    import lightning as L

    return L.Trainer(accelerator="cpu", devices=1, max_steps=3, val_check_interval=2, check_val_every_n_epoch=None,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, default_root_dir=root, **kw)  # fmt: skip


def test_a_plain_trainer_fit_checks_trains_and_exports(workdir):
    """No CLI: ``Trainer.fit(module, datamodule)`` from Python writes fit_stats.json (after a final validation of
    the last weights: the run stops between validations) and the exported drafter, through the callbacks the module
    adds itself; a second fit into the same folder is refused before it trains (an export never overwrites)."""
    import yaml

    from dspark_lightning import load_drafter
    from dspark_lightning.data.regen.config import RegenConfig
    from dspark_lightning.lightning.callbacks import DivergenceGuard, DrafterExport, FitStats
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    recipe = yaml.safe_load(Path(TINY).read_text())
    data = recipe["data"]
    dm = DSparkDataModule(
        **{**data, "target": recipe["target"], "regen": RegenConfig(**data["regen"])}
    )  # work_dir: the workdir's copy
    torch.manual_seed(0)
    module = DSparkModule(
        backbone="dense",
        seq_head={"class_path": "vanilla", "init_args": {"rank": 16}},
        conf_head="linear",
        block_size=4,
    )
    trainer = _plain_trainer(workdir / "run")
    trainer.fit(module, dm)

    assert {FitStats, DrafterExport, DivergenceGuard} <= {type(c) for c in trainer.callbacks}
    assert trainer.optimizers[0].defaults["fused"] is True  # model.optim.fused: null = fused on plain CPU tensors
    stats = json.loads((workdir / "run" / "fit_stats.json").read_text())
    assert stats["steps"] == 3 and stats["tokens"] > 0 and stats["anchors_seen"] > 0
    assert stats["validation_step"] == 3 and 1.0 <= stats["validation"]["all"]["tau_hat"] <= 5.0  # the final weights
    loaded = load_drafter(workdir / "run" / "drafter")
    trained = module.drafter.state_dict()
    assert loaded.config() == module.drafter.config()
    assert loaded.state_dict().keys() == trained.keys()
    assert all(torch.equal(loaded.state_dict()[k], v.cpu()) for k, v in trained.items())

    with pytest.raises(FileExistsError, match="not empty"):
        _plain_trainer(workdir / "run").fit(module, dm)
    assert json.loads((workdir / "run" / "fit_stats.json").read_text()) == stats  # nothing trained or rewritten

    custom = _plain_trainer(workdir / "run", callbacks=[DrafterExport(dir=str(workdir / "elsewhere"))])
    custom.fit(module, dm)  # the Trainer's own DrafterExport replaces the module's default
    assert (workdir / "elsewhere" / "model.safetensors").is_file()
    assert sum(isinstance(c, DrafterExport) for c in custom.callbacks) == 1


def test_fit_runs_under_ddp_with_two_cpu_processes(workdir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "dspark_lightning.cli.fit",
        "fit",
        "--config",
        TINY,
        "--trainer.strategy=ddp",
        "--trainer.devices=2",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
    ]
    r = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (workdir / "outputs/tiny_debug/tb/version_0/drafter/model.safetensors").is_file()


@pytest.mark.parametrize("recipe", sorted(str(p) for p in Path(TINY).parent.rglob("*.yaml")))
def test_every_recipe_parses_and_instantiates(recipe, tmp_path, monkeypatch):
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    monkeypatch.chdir(tmp_path)
    # GPU recipes name a local target directory and GPUs this machine lacks: instantiate them with the tiny target
    # on one CPU device (everything else as written), after parsing them unchanged.
    gpu = Path(recipe).parent.name == "gpu"
    cpu = ["--target.name=tiny-debug", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto"]
    cli = DSparkCLI(DSparkModule, DSparkDataModule, run=False, args=["--config", recipe, *(cpu if gpu else [])])
    assert cli.model.drafter.block_size == cli.config.model.block_size
    assert sum(p.numel() for p in cli.model.drafter.parameters()) > 0
    if gpu:
        cli.parser.parse_args(["--config", recipe])  # the recipe as written: every key and type checks


def test_validate_and_test_from_a_checkpoint(workdir, capsys):
    from .conftest import run_main

    code, _, err = run_main(["fit", "--config", TINY, "--trainer.max_steps=4", "--validate_before_fit=false"], capsys)
    assert code == 0, err[-2000:]
    ckpt = next((workdir / "outputs/tiny_debug/tb/version_0/checkpoints").glob("*.ckpt"))
    assert torch.load(ckpt, weights_only=False)["dspark"]["drafter"]["block_size"] == 4
    for sub in ("validate", "test"):
        code, out, err = run_main([sub, "--config", TINY, f"--ckpt_path={ckpt}"], capsys)
        assert code == 0, err[-2000:]
        assert f"{'val' if sub == 'validate' else 'test'}/tau_hat" in out


def test_fit_with_a_reduced_draft_vocabulary(workdir):
    """model.draft_vocab_size: fit picks the most frequent response tokens (stop tokens forced in) and exports them."""
    from dspark_lightning import load_drafter
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.data.features.vocab import frequent_tokens
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    # vLLM serves a reduced vocabulary (its d2t); SGLang and DeepSpec do not
    args = ["fit", "--config", TINY, "--trainer.max_steps=2", "--model.draft_vocab_size=48",
            '--export={"servers": ["vllm"]}']  # fmt: skip
    cli = DSparkCLI(DSparkModule, DSparkDataModule, args=args)
    loaded = load_drafter(Path(cli.trainer.log_dir) / "drafter")
    vocab = loaded.draft_vocab
    counts = cli.datamodule.token_counts("train")
    assert vocab.numel() == 48 and torch.equal(vocab, frequent_tokens(counts, 48, cli.model.target.stop_token_ids))
    assert set(cli.model.target.stop_token_ids) <= set(vocab.tolist())
    assert loaded.seq_head.lr.w2.out_features == 48
