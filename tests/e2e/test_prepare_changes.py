"""A changed recipe prepares its data again in the same work dir: responses made with other generation settings are
not refused, they are generated again (only matching ones are reused)."""

import json
from pathlib import Path

import yaml

from .conftest import TINY


def test_a_changed_regeneration_dtype_prepares_again(workdir):
    from dspark_lightning.lightning.datamodule import DSparkDataModule

    recipe = yaml.safe_load(Path(TINY).read_text())
    cfg = {**recipe["data"], "target": recipe["target"]}
    dm = DSparkDataModule(**{**cfg, "regen": {**cfg["regen"], "dtype": "bf16"}})  # a dict, as from Python
    dm.prepare_data()
    rows = [json.loads(x) for x in dm.prepare_job(progress=False).paths.responses("train").read_text().splitlines()]
    assert rows and all(r["gen"]["regen_dtype"] == "bf16" for r in rows)
    again = DSparkDataModule(**cfg)  # back to the first settings: prepared (or reused) without a refusal
    again.prepare_data()
    rows = [json.loads(x) for x in again.prepare_job(progress=False).paths.responses("train").read_text().splitlines()]
    assert rows and all("regen_dtype" not in r["gen"] for r in rows)
