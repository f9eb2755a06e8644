"""The data-size curve: the saturating fit recovers known parameters, inverts them, and its bootstrap is paired."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dspark_lightning.data.prepare import first_prompts
from dspark_lightning.eval import data_curve as dc


@pytest.mark.parametrize("hi, half", [(2.4, 800.0), (1.6, 150.0), (3.0, 5000.0)])
def test_the_fit_recovers_known_parameters_and_inverts(hi, half):
    n = [300, 600, 1200, 2400]
    truth = dc.Fit(1.0, hi, half, True)
    fit = dc.fit_saturating(n, [truth(x) for x in n], lo=1.0)
    assert fit.hi == pytest.approx(hi, rel=0.01) and fit.half == pytest.approx(half, rel=0.03) and fit.saturating
    want = 1.0 + 0.5 * (hi - 1.0)  # half-way up: h samples
    assert fit.samples_for(want) == pytest.approx(half, rel=0.03)
    assert math.isinf(fit.samples_for(hi + 0.1)) and fit.samples_for(1.0) == 0.0


def test_points_without_a_bend_are_flagged_and_one_sample_count_is_refused():
    fit = dc.fit_saturating([100, 200, 400], [1.1, 1.2, 1.4], lo=1.0)  # linear in n: no ceiling in sight
    assert not fit.saturating
    with pytest.raises(ValueError, match="two sample counts"):
        dc.fit_saturating([300, 300], [1.2, 1.3], lo=1.0)


def _arm(samples, epochs, per_prompt):
    counts = {"math": [dc.Counts(rounds=r, tokens=t, first=f) for r, t, f in per_prompt]}
    return dc.ArmResult(dc.Arm(samples, epochs), dc.Arm(samples, epochs).steps(4), counts)


def test_metrics_pool_rounds_and_the_curves_predict_a_held_back_arm():
    rng = np.random.default_rng(0)
    truth = dc.Fit(1.0, 2.2, 700.0, True)
    arms = []
    for n in (300, 600, 1200, 2400):
        tau = truth(n)
        rows = []
        for _ in range(30):  # 30 prompts of 20 rounds around the true τ
            r = 20
            tokens = int(round(r * (tau + rng.normal(0, 0.05))))
            rows.append((r, tokens, int(round(r * (tau - 1) / 1.5))))
        arms.append(_arm(n, 3.0, rows))
    (curve,) = dc.fit_curves([a for a in arms if a.arm.samples <= 1200], "tau", boot=50)
    pred, lo, hi = curve.predict(2400)
    assert lo <= pred <= hi and abs(pred - truth(2400)) < 0.05
    (row,) = [r for r in dc.prediction_rows([curve], arms, 1200) if r["samples"] == 2400]
    assert abs(row["error"]) < 0.05 and row["measured"] == pytest.approx(arms[-1].metric("tau", "math"), abs=1e-4)
    assert "samples for τ = 2" in dc.needs_table([curve], 2.0, batch_size=4)
    back = dc.ArmResult.from_json(arms[0].to_json())
    assert back.metric("tau", "math") == arms[0].metric("tau", "math") and back.arm == arms[0].arm


def test_metric_is_a_ratio_of_pooled_counts():
    arm = _arm(100, 1.0, [(10, 20, 5), (30, 30, 0)])
    assert arm.metric("tau", "math") == pytest.approx(50 / 40) and arm.metric("A_1", "math") == pytest.approx(5 / 40)
    assert arm.metric("tau", "math", np.array([0, 0])) == pytest.approx(2.0)


def test_train_samples_are_nested_and_cover_every_answer_of_a_prompt():
    ids = [f"p{i}" for i in range(50)] + ["p3#1", "p7#1"]
    small, large = first_prompts(ids, 10, seed=1), first_prompts(ids, 30, seed=1)
    assert len(small) == 10 and small < large and first_prompts(ids, 10, seed=2) != small
    with pytest.raises(ValueError, match="holds 50 conversations"):
        first_prompts(ids, 51, seed=1)


def test_an_arm_trains_on_a_subset_of_the_recipes_cached_mode_keeping_its_settings():
    from dspark_lightning.checks import UsageError
    from dspark_lightning.cli.data_curve import subset
    from dspark_lightning.registry import build

    assert subset({"data": {}}, 300) == {"class_path": "cached", "init_args": {"train_samples": 300}}
    cached = {"class_path": "cached", "init_args": {"extra_work_dirs": ["x"], "train_samples": 9}}
    mixed = {"data": {"features": cached}}
    mode = build("features", subset(mixed, 600))
    assert mode.extra_work_dirs == ["x"] and mode.train_samples == 600
    with pytest.raises(UsageError, match="must be cached, got 'streamed'"):
        subset({"data": {"features": "streamed"}}, 300)
    with pytest.raises(UsageError, match="train_samples must be an integer >= 1"):
        build("features", subset({"data": {}}, 0))


def test_an_arm_trains_for_its_steps_or_within_a_wall_budget(tmp_path):
    from dspark_lightning.cli.data_curve import arm_recipe

    recipe = {"trainer": {"max_time": {"minutes": 5}}, "model": {"optim": {"time_budget_s": 300}}, "data": {},
              "export": {"servers": ["vllm"], "calibrate": {"temperatures": [0.0, 1.0]}, "dtype": "fp32"}}  # fmt: skip
    by_steps, steps = arm_recipe(recipe, dc.Arm(1150, 3), tmp_path)
    assert by_steps["export"] == {"servers": [], "calibrate": None, "dtype": "fp32"}  # an arm is decoded, not served
    assert steps == 863 and by_steps["trainer"]["max_steps"] == 863
    assert by_steps["trainer"]["max_time"] is None and by_steps["model"]["optim"]["time_budget_s"] is None
    budget, _ = arm_recipe(recipe, dc.Arm(1150, 20), tmp_path, minutes=2.5)
    assert budget["trainer"]["max_time"] == {"seconds": 150} and budget["model"]["optim"]["time_budget_s"] == 150
    assert budget["trainer"]["max_steps"] == 5750  # the epochs bound it when the budget does not
