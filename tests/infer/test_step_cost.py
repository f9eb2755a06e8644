"""The whole-step model the ``auto`` scheduler reads (``DraftCost.step_seconds``): profiled plain and drafted steps,
interpolated in drafts per request and in batch size, and what the scheduler decides from them."""

import pytest
import torch

from dspark_lightning.infer.schedule.draft_cost import DraftCost
from dspark_lightning.infer.schedule.schedulers import AutoScheduler

COST = DraftCost(batches=[1, 4], seconds=[0.010, 0.020], plain=[0.030, 0.040], widths=[1, 2, 4],
                 drafted=[[0.045, 0.047, 0.051], [0.070, 0.080, 0.100]])  # fmt: skip


def test_step_seconds_interpolate_the_profiled_steps():
    assert COST.step_seconds(1, 2) == pytest.approx(0.045)  # one draft per request: the profiled step
    assert COST.step_seconds(1, 4) == pytest.approx(0.049)  # two drafts and four: linear between them
    assert COST.step_seconds(1, 1) == pytest.approx(0.043)  # drafted, nothing verified: one increment below
    assert COST.step_seconds(1, 9) == pytest.approx(0.051 + 0.002 * 4)  # beyond the widest: the last slope
    assert COST.step_seconds(4, 8) == pytest.approx(0.070)
    assert COST.step_seconds(4, 4) == pytest.approx(0.060)  # k = 0 at R = 4: 0.070 - 0.010
    assert COST.step_seconds(2, 4) == pytest.approx(0.045 + (0.070 - 0.045) / 3)  # between batch sizes
    assert COST.plain_seconds(4) == pytest.approx(0.040) and COST.plain_seconds(8) == pytest.approx(0.080)
    flat = DraftCost([1], [0.01], plain=[0.05], widths=[1, 2], drafted=[[0.03, 0.035]])
    assert flat.step_seconds(1, 1) == pytest.approx(0.05)  # never below a plain step
    dip = DraftCost([1], [0.01], plain=[0.04], widths=[1, 2, 4, 7], drafted=[[0.050, 0.060, 0.072, 0.068]])
    assert dip.step_seconds(1, 8) == pytest.approx(0.068)  # a wider step measured cheaper stands as measured
    assert dip.step_seconds(1, 5) == pytest.approx(0.072) and dip.step_seconds(1, 3) == pytest.approx(0.060)


def test_auto_verifies_the_wider_block_where_the_machine_runs_it_faster():
    """A CPU whose kernels run 4 verified rows faster than 3 (a profile measured on one): with survivals where three
    drafts pay only at that cheaper step, auto verifies three, not one."""
    dip = DraftCost([1], [0.005], plain=[0.020], widths=[1, 2, 3, 4, 7],
                    drafted=[[0.0257, 0.0304, 0.0284, 0.0335, 0.0370]])  # fmt: skip
    s = AutoScheduler(online=False)
    s.cost = dip
    conf = torch.tensor([[0.5, 0.3, 0.25, 0.2, 0.1, 0.1, 0.1]])
    assert int(s(conf)[0]) == 3


def test_round_trip_keeps_the_steps():
    again = DraftCost(**COST.to_dict())
    assert again.has_steps and again.step_seconds(3, 9) == COST.step_seconds(3, 9)
    assert not DraftCost([1], [0.01]).has_steps and "plain" not in DraftCost([1], [0.01]).to_dict()


def test_auto_drafts_where_the_profiled_steps_pay_and_not_where_they_do_not():
    """Same confidences, two machines: where a drafted step costs 1.5 plain steps, survivals of 0.9 pay; where it
    costs 4, the gate stops drafting (the lengths it would verify once drafted are another question)."""
    conf = torch.full((1, 4), 0.9)
    cheap = DraftCost([1], [0.01], plain=[0.040], widths=[1, 2, 4], drafted=[[0.060, 0.062, 0.066]])
    dear = DraftCost([1], [0.10], plain=[0.040], widths=[1, 2, 4], drafted=[[0.160, 0.165, 0.170]])
    for cost, drafts in ((cheap, True), (dear, False)):
        s = AutoScheduler(online=False)
        s.cost = cost
        ell = s(conf)
        s.observe_rounds(conf, ell, [int(ell[0])])
        assert int(ell[0]) > 0
        assert s.drafting_pays(1) is drafts and s.wants_draft(1) is drafts
