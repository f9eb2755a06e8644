"""Confidence maps: the per-position logistic fits, the out-of-fold choice, the report, and the file round trip."""

import json

import pytest
import torch

from dspark_lightning.calibration.confidence import Rows, choose, conditional, fit_map, logistic, report
from dspark_lightning.checkpoint.calibration import ConfidenceMap, load_confidence_maps, write_calibration


def synthetic(n=4000, g=3, head_noise=3.0, seed=0):
    """Rounds whose per-position acceptance follows σ(2·μ − 1) exactly: the margin μ is informative, the head's
    logit z is that signal plus heavy noise."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.rand(n, g, generator=gen, dtype=torch.float64) * 3
    true = 2.0 * mu - 1.0
    z = true + head_noise * torch.randn(n, g, generator=gen, dtype=torch.float64)
    ok = torch.rand(n, g, generator=gen, dtype=torch.float64) < torch.sigmoid(true)
    m = ok.long().cumprod(1).sum(1)
    return Rows(z, mu, m, torch.full((n,), g))


def test_logistic_recovers_coefficients():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(20000, 2, generator=gen, dtype=torch.float64)
    y = torch.rand(20000, generator=gen, dtype=torch.float64) < torch.sigmoid(1.5 * x[:, 0] - 0.5 * x[:, 1] + 0.3)
    w = logistic(x, y.double())
    assert torch.allclose(w, torch.tensor([1.5, -0.5, 0.3], dtype=torch.float64), atol=0.08)


def test_margin_map_fits_the_law_and_wins_the_choice():
    rows = synthetic()
    cmap = fit_map("margin", rows)
    assert cmap.head == (0.0, 0.0, 0.0)
    assert cmap.margin[0] == pytest.approx(2.0, abs=0.25) and cmap.bias[0] == pytest.approx(-1.0, abs=0.25)
    chosen, picked = choose(rows, torch.arange(len(rows.m)) // 10)  # 10 rounds per prompt
    assert picked[0] in ("margin", "head+margin")  # the noisy head alone loses out of fold
    held = synthetic(seed=5)
    out = report(held, chosen, picked, fit=rows)
    assert out[0].auroc_margin > out[0].auroc_head + 0.1
    assert out[0].auroc >= out[0].auroc_head
    assert out[0].ece_calibrated < 0.03


def test_the_choice_splits_the_fit_prompts_whatever_their_ids():
    """calibrate holds out every other prompt, so the fit's prompt ids are all even: the two folds must still split
    them (before, parity made one fold empty, every score stayed 0 and the first candidate, STS, always won)."""
    rows = synthetic()
    for groups in (2 * (torch.arange(len(rows.m)) // 10), 7 + 3 * (torch.arange(len(rows.m)) // 10)):
        _, picked = choose(rows, groups)
        assert picked[0] in ("margin", "head+margin"), groups[:3]


def test_sts_candidate_is_a_temperature_map():
    rows = synthetic(head_noise=0.0)
    cmap = fit_map("sts", rows)
    assert cmap.margin == (0.0,) * 3 and cmap.bias == (0.0,) * 3
    assert all(h > 0 for h in cmap.head)
    c = conditional(cmap, rows)
    assert torch.allclose(c[:, 0], torch.sigmoid(cmap.head[0] * rows.z[:, 0]))


def test_a_drafter_without_a_head_chooses_the_margin_only():
    rows = synthetic()
    rows = Rows(None, rows.mu, rows.m, rows.ell)
    chosen, picked = choose(rows, torch.arange(len(rows.m)) // 10)
    assert set(picked) == {"margin"} and not chosen.reads_head
    with pytest.raises(ValueError, match="confidence head"):
        fit_map("platt", rows)


def test_map_file_round_trip_and_refusals(tmp_path):
    cmap = ConfidenceMap((0.5, 0.0), (0.0, 1.2), (0.1, -0.3))
    doc = {"temperatures": [2.0, 1.0], "sampling_temperature": 0.0, "weights_sha256": "abc",
           "confidence": cmap.to_dict()}  # fmt: skip
    write_calibration(tmp_path, doc)
    assert load_confidence_maps(tmp_path, "abc") == {(0.0, "rejection"): cmap}
    assert ConfidenceMap.sts([2.0, 4.0]) == ConfidenceMap((0.5, 0.25), (0.0, 0.0), (0.0, 0.0))
    with pytest.raises(ValueError, match="equal-length"):
        write_calibration(tmp_path, {**doc, "confidence": {"head": [1.0], "margin": [0.0, 0.0], "bias": [0.0]}})
    (tmp_path / "calibration_T1.json").write_text(json.dumps({**doc, "sampling_temperature": 1.0,
                                                               "confidence": [1, 2]}))  # fmt: skip
    with pytest.raises(ValueError, match="bad confidence map"):
        load_confidence_maps(tmp_path, "abc")


def test_frontier_replays_policies_and_ranking_confidences_dominate_static():
    """A static γ accepts min(m, γ); with confidences that rank, some threshold verifies fewer drafts per committed
    token than a static γ for at least its τ."""
    from dspark_lightning.calibration.confidence import frontier

    rows = synthetic(head_noise=0.0)
    cmap = fit_map("margin", rows)
    pts = {p["policy"]: p for p in frontier(rows, cmap)}
    m = rows.m.double()
    assert pts["static:0"] == {"policy": "static:0", "drafts_per_token": 0.0, "tau": 1.0}
    assert pts["static:3"]["tau"] == pytest.approx(float((m + 1).mean()), abs=1e-4)
    assert pts["static:1"]["tau"] == pytest.approx(float((m.clamp(max=1) + 1).mean()), abs=1e-4)
    static = [p for k, p in pts.items() if k.startswith("static:") and k != "static:0"]
    thresholds = [p for k, p in pts.items() if k.startswith("threshold:")]
    assert any(
        t["tau"] >= s["tau"] and t["drafts_per_token"] < s["drafts_per_token"] for s in static for t in thresholds
    )
