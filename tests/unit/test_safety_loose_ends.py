"""Loose ends of the input-safety work: a None threshold, a FIFO inside a drafter folder, the SPS table's write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dspark_lightning import load_drafter
from dspark_lightning.infer.schedule.sps import SPSTable
from dspark_lightning.registry import create

REPO = Path(__file__).resolve().parents[2]


def test_a_threshold_of_none_is_a_one_line_value_error():
    with pytest.raises(ValueError, match="threshold must be a finite number in \\[0, 1\\], got None"):
        create("scheduler", "threshold", threshold=None)


def test_a_fifo_inside_a_drafter_folder_is_refused_before_any_read(tmp_path):
    """load_drafter(path) called directly (not through the CLI) would block forever opening a FIFO."""
    (tmp_path / "config.json").write_text("{}")
    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors is a FIFO"):
        load_drafter(tmp_path)


def test_the_sps_table_is_replaced_whole_and_leaves_no_temp_file(tmp_path):
    table = SPSTable.load(REPO / "benchmarks/results/data/sps_smollm2_cpu_lean.json")
    out = tmp_path / "sps.json"
    out.write_text("old")
    table.save(out)
    assert SPSTable.load(out).to_dict() == table.to_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sps.json"]
