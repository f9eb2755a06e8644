"""LR schedules (cosine, WSD, constant), curriculum phases and anchor subsampling (lightning/schedule.py)."""

import math

import pytest
import torch

from dspark_lightning.lightning.schedule import Phase, check_curriculum, lr_factor, phase_at, subsample_anchors


def test_cosine_matches_spec_and_wsd_is_stable_then_linear():
    assert lr_factor(0.0, 0.0) == pytest.approx(1.0)
    assert lr_factor(0.5, 0.0) == pytest.approx(0.5)
    assert lr_factor(1.0, 0.0) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(0.05, 0.1) == pytest.approx(0.5)  # warmup is linear
    wsd = [lr_factor(p, 0.0, "wsd", 0.2) for p in (0.1, 0.5, 0.79, 0.9, 1.0)]
    assert wsd[:3] == [1.0, 1.0, 1.0] and wsd[3] == pytest.approx(0.5) and wsd[4] == 0.0
    assert lr_factor(0.9, 0.0, "constant") == 1.0


def test_phases_in_order_and_last_runs_to_the_end():
    phases = [Phase(until=0.5, block_size=2, anchors=8), Phase(until=1.0)]
    check_curriculum(phases, 4)
    assert phase_at(phases, 0.0).block_size == 2 and phase_at(phases, 0.49).anchors == 8
    assert phase_at(phases, 0.5).block_size is None and phase_at(phases, 1.0) is phases[-1]
    assert phase_at(None, 0.3) is None


@pytest.mark.parametrize(
    "phases,match",
    [
        ([Phase(until=0.6), Phase(until=0.4)], "until must increase"),
        ([Phase(until=1.5)], "until must increase"),
        ([Phase(block_size=9)], r"block_size must be in \[1, 4\]"),
        ([Phase(anchors=0)], "anchors must be >= 1"),
        ([Phase(decay=math.nan)], "decay must be finite"),
    ],
)
def test_bad_phases_are_refused_naming_the_key(phases, match):
    with pytest.raises(ValueError, match=match):
        check_curriculum(phases, 4)


def test_subsample_keeps_valid_sorted_anchors():
    anchors = torch.tensor([[2, 5, 7, 9, 0, 0], [1, 3, 0, 0, 0, 0]])
    valid = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    a, v = subsample_anchors(anchors, valid, 3, torch.Generator().manual_seed(0))
    assert a.shape == (2, 3)
    assert v[0].all() and set(a[0].tolist()) <= {2, 5, 7, 9} and a[0].tolist() == sorted(a[0].tolist())
    assert v[1].tolist() == [True, True, False] and a[1, :2].tolist() == [1, 3]  # all valid ones kept first
    same = subsample_anchors(anchors, valid, 8, torch.Generator())
    assert same[0] is anchors
