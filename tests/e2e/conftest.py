import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny_debug.yaml")


def run_main(args, capsys):
    """Run the console script in-process; returns (exit code, stdout, stderr)."""
    from dspark_lightning.cli import main

    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Regenerated tiny-debug responses, made once and copied into each test's working directory."""
    import yaml

    from dspark_lightning.data.regen.config import RegenConfig
    from dspark_lightning.lightning.datamodule import DSparkDataModule

    recipe = yaml.safe_load(Path(TINY).read_text())
    cfg = {**recipe["data"], "target": recipe["target"]}
    work = tmp_path_factory.mktemp("tiny_data") / "data"
    DSparkDataModule(**{**cfg, "work_dir": str(work), "regen": RegenConfig(**cfg["regen"])}).prepare_data()
    return work


@pytest.fixture
def workdir(tmp_path, tiny_data, monkeypatch):
    """A fresh cwd whose outputs/tiny_debug/data already holds the regenerated responses."""
    shutil.copytree(tiny_data, tmp_path / "outputs" / "tiny_debug" / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    """A random exported DSpark drafter (γ = 3) for tiny-debug."""
    import torch

    from dspark_lightning import create, load_target
    from dspark_lightning.checkpoint import save_drafter

    target = load_target("tiny-debug")
    torch.manual_seed(0)
    d = create(
        "drafter", "dspark", target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    return str(save_drafter(d, tmp_path_factory.mktemp("cli") / "dspark", target))
