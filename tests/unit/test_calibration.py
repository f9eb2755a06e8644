"""STS (docs/algorithm.md §5) and the calibration metrics (docs/algorithm.md §2) on synthetic rounds."""

import pytest
import torch

from dspark_lightning.calibration import auroc, brier, ece, fit_sts, position_reports


def test_ece_auroc_brier_on_hand_made_cases():
    p = torch.tensor([0.1, 0.12, 0.9, 0.95])
    y = torch.tensor([0.0, 1.0, 1.0, 1.0])
    # bins: 2 (0.1, 0.12), 18 (0.9), 19 (0.95): |0.11-0.5|*2/4 + |0.9-1|/4 + |0.95-1|/4
    assert ece(p, y) == pytest.approx((0.39 * 2 + 0.1 + 0.05) / 4)
    assert auroc(p, y) == pytest.approx(1.0)
    assert auroc(torch.tensor([0.5, 0.5, 0.2]), torch.tensor([1.0, 0.0, 0.0])) == pytest.approx(0.75)  # tie = ½
    assert brier(p, y) == pytest.approx(float(((p - y) ** 2).mean()))


def test_ece_matches_torchmetrics():
    from torchmetrics.functional.classification import binary_auroc, binary_calibration_error

    g = torch.Generator().manual_seed(0)
    p = torch.rand(5000, generator=g) * 0.98 + 0.01
    y = (torch.rand(5000, generator=g) < p**1.5).long()
    assert ece(p, y) == pytest.approx(float(binary_calibration_error(p, y, n_bins=20, norm="l1")), abs=1e-6)
    assert auroc(p, y) == pytest.approx(float(binary_auroc(p, y)), abs=1e-6)


def synthetic_rounds(n=20000, g=4, seed=0):
    """True conditional acceptance c_k = σ(u_k); the head reports z_k = 3·u_k (overconfident)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(n, g, generator=gen) * 1.2 + 0.8
    accept = torch.rand(n, g, generator=gen) < torch.sigmoid(u)
    m = torch.cumprod(accept.long(), 1).sum(1)  # accepted prefix length
    return 3.0 * u, m, torch.full((n,), g)


def test_sts_reduces_ece_and_preserves_ranking():
    z, m, ell = synthetic_rounds()
    res = fit_sts(z, m, ell)
    for before, after in zip(res.before, res.after, strict=True):
        assert after.ece < before.ece and after.ece < 0.02
    assert res.after[0].auroc == pytest.approx(res.before[0].auroc, abs=1e-12)
    for k, T in enumerate(res.temperatures):  # each ĉ_k keeps its ranking (later survivals mix positions)
        y = m >= k + 1
        zk = z[:, k].double()
        assert auroc(torch.sigmoid(zk / T), y) == pytest.approx(auroc(torch.sigmoid(zk), y), abs=1e-12)
    assert all(2.0 < t < 4.5 for t in res.temperatures)  # recovers the 3x overconfidence


def test_sts_copies_the_temperature_with_too_few_rows():
    z, m, ell = synthetic_rounds(n=1000)
    ell = torch.where(torch.arange(1000) < 150, ell, torch.full_like(ell, 2))  # positions 3, 4: 150 rows
    with pytest.warns(UserWarning, match="positions \\[3, 4\\]"):
        res = fit_sts(z, m, ell)
    assert res.temperatures[2] == res.temperatures[3] == res.temperatures[1]
    assert [r.rows for r in position_reports(z, m, ell, torch.ones(4))] == [1000, 1000, 150, 150]


def test_sts_copies_the_temperature_when_no_round_survives_a_position():
    z, m, ell = synthetic_rounds(n=2000)
    m = m.clamp(max=2)  # nothing survives positions 3 and 4: one class only
    with pytest.warns(UserWarning, match="positions \\[3, 4\\]"):
        res = fit_sts(z, m, ell)
    assert res.temperatures[2] == res.temperatures[3] == res.temperatures[1]
    m[:5] = 4  # five survivors: below min_class = 10, still copied; with min_class = 5, fitted
    with pytest.warns(UserWarning, match="positions \\[3, 4\\]"):
        fit_sts(z, m, ell)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_sts(z, m, ell, min_class=5)


def test_heldout_prompts_interleave_within_each_domain():
    from dspark_lightning.calibration import heldout_prompts

    assert heldout_prompts([4, 4], 0.5) == [1, 3, 5, 7]
    assert heldout_prompts([4, 4, 4], 0.25) == [3, 7, 11]
    assert heldout_prompts([5], 0.0) == []
    with pytest.raises(ValueError, match="heldout_fraction"):
        heldout_prompts([4], 1.0)


def test_rollouts_round_trip(tmp_path):
    from dspark_lightning.calibration import Rollouts

    z, m, ell = synthetic_rounds(n=50)
    ro = Rollouts(z, m, ell, torch.arange(50) % 5, z.abs())
    ro.save(tmp_path / "r.pt")
    back = Rollouts.load(tmp_path / "r.pt")
    for k in ("z", "m", "ell", "prompt", "mu"):
        assert torch.equal(getattr(back, k), getattr(ro, k))
    Rollouts(z, m, ell, ro.prompt).save(tmp_path / "old.pt")  # written before margins were logged
    with pytest.raises(ValueError, match="record them again"):
        Rollouts.load(tmp_path / "old.pt").confidence_rows(torch.ones(50, dtype=torch.bool))
    zs, ms, es = back.rows(back.prompt == 2)
    assert zs.shape == (10, 4) and torch.equal(ms, m[2::5])


def test_ece_floor_is_the_finite_sample_bias_of_a_calibrated_predictor():
    from dspark_lightning.calibration import ece_floor

    g = torch.Generator().manual_seed(3)
    small, large = torch.rand(400, generator=g) * 0.9 + 0.05, torch.rand(40000, generator=g) * 0.9 + 0.05
    f_small, f_large = ece_floor(small), ece_floor(large)
    assert f_large < f_small / 5  # shrinks like 1/sqrt(N): 10x here
    y = (torch.rand(40000, generator=g) < large).double()  # labels drawn from the scores: calibrated by construction
    assert ece(large, y) < 2.5 * f_large
    assert ece(large, torch.zeros(40000)) > 0.4 > 20 * f_large  # a miscalibrated one stands far above it
