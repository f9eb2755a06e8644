"""docs/algorithm.md §11.5: scheduler units with fixed confidences and SPS tables."""

import pytest
import torch

from dspark_lightning import create, names
from dspark_lightning.infer import SPSTable, prefix_schedule
from dspark_lightning.infer.schedule.schedulers import (
    AsyncHardwareAwareScheduler,
    admit,
    global_capacity,
    ranked_pool,
    survival,
    throughput_curve,
)

WORKED = SPSTable.from_points({1: 1.0, 2: 0.95, 3: 0.52, 4: 0.48})


def test_registered_names():
    assert {"static", "threshold", "hardware_aware", "async_hardware_aware"} <= set(names("scheduler"))
    assert create("scheduler", "static", gamma=2)(torch.rand(3, 5)).tolist() == [2, 2, 2]


def test_worked_example():
    conf = torch.tensor([[0.8, 0.7, 0.9]])
    values, _ = ranked_pool(survival(conf))
    theta = throughput_curve(values, 1, WORKED)
    assert torch.allclose(theta[:3], torch.tensor([1.0, 1.71, 1.2272], dtype=torch.float64))
    assert theta[3] == pytest.approx((1 + 0.8 + 0.56 + 0.504) * 0.48)
    assert prefix_schedule(conf, WORKED).tolist() == [1]


def test_flat_sps_verifies_whole_block_and_tiny_confidence_verifies_nothing():
    flat = SPSTable.from_points({1: 1.0, 64: 1.0})
    assert prefix_schedule(torch.full((2, 5), 0.5), flat).tolist() == [5, 5]
    falling = SPSTable.from_points({1: 1.0, 64: 0.5})
    assert prefix_schedule(torch.full((2, 5), 1e-6), falling).tolist() == [0, 0]
    assert prefix_schedule(torch.zeros(2, 5), flat).tolist() == [0, 0]  # a = 0 is never a candidate


def test_two_requests_interleaved_pool_and_bookkeeping():
    conf = torch.tensor([[0.9, 0.9], [0.95, 0.5]])  # a_A = (0.9, 0.81), a_B = (0.95, 0.475)
    values, req = ranked_pool(survival(conf))
    assert req.tolist() == [1, 0, 0, 1]
    assert torch.allclose(values, torch.tensor([0.95, 0.9, 0.81, 0.475], dtype=torch.float64))
    sps = SPSTable.from_points({2: 1.0, 5: 0.95, 6: 0.3})
    theta = throughput_curve(values, 2, sps)
    # B = R + n and tau* = R + sum of the admitted a: Θ_n = tau*_n SPS(B_n)
    for n in range(5):
        assert theta[n] == pytest.approx((2 + float(values[:n].sum())) * float(sps(2 + n)))
    assert prefix_schedule(conf, sps).tolist() == [2, 1]


def test_ties_at_one_keep_prefixes():
    conf = torch.ones(2, 3)
    values, req = ranked_pool(survival(conf))
    assert req.tolist() == [0, 1, 0, 1, 0, 1]  # (j, r) order among equal a
    for n in range(7):
        ell = admit(req, n, 2)
        assert ell.tolist() == [(n + 1) // 2, n // 2]


def test_sps_above_profile_is_inadmissible():
    sps = SPSTable.from_points({1: 1.0, 3: 1.0})
    assert prefix_schedule(torch.full((1, 5), 0.9), sps).tolist() == [2]  # B = 4 > 3 is never admitted


def test_async_top_k_exact_prefix_closed_rank_stable():
    sps = SPSTable.from_points({1: 1.0, 8: 0.9, 16: 0.5, 32: 0.2})
    gen = torch.Generator().manual_seed(0)
    stale = survival(torch.rand(4, 5, generator=gen))
    K = global_capacity(stale, sps)
    theta = throughput_curve(ranked_pool(stale)[0], 4, sps)
    assert K == int(torch.argmax(theta))  # global search, no early stop
    s = AsyncHardwareAwareScheduler(sps, lag=2)
    s.history.extend([stale, stale])
    fresh = torch.rand(4, 5, generator=gen)
    ell = s(fresh)
    assert int(ell.sum()) == K
    a = survival(fresh)
    admitted = torch.arange(5)[None, :] < ell[:, None]
    assert admitted.sum() == K
    # rank-stable: every admitted candidate ranks above every rejected one
    assert a[admitted].min() >= a[~admitted & (a > 0)].max()


def test_async_without_history_uses_algorithm_1():
    sps = SPSTable.from_points({1: 1.0, 8: 0.9, 16: 0.5, 32: 0.2})
    conf = torch.rand(3, 4, generator=torch.Generator().manual_seed(1))
    s = AsyncHardwareAwareScheduler(sps)
    assert s(conf).tolist() == prefix_schedule(conf, sps).tolist()


def test_threshold_variants():
    conf = torch.tensor([[0.9, 0.6, 0.95]])  # a = (0.9, 0.54, 0.513)
    cum = lambda t: create("scheduler", "threshold", threshold=t)(conf).tolist()  # noqa: E731
    raw = lambda t: create("scheduler", "threshold", threshold=t, mode="raw")(conf).tolist()  # noqa: E731
    assert cum(0.0) == [3] and cum(0.5) == [3] and cum(0.55) == [1] and cum(0.95) == [0]
    assert raw(0.0) == [3] and raw(0.7) == [1] and raw(0.5) == [3] and raw(0.92) == [0]


def test_schedulers_never_see_tokens():
    """Non-anticipation by construction: every scheduler's only input is the confidence matrix."""
    import inspect

    for name in names("scheduler"):
        cls = create("scheduler", name, **({"sps": WORKED} if "hardware" in name else {}))
        params = list(inspect.signature(cls.__call__).parameters)
        assert params == ["conf"], (name, params)


def test_whole_step_rate_includes_the_draft_time():
    """A CPU-like curve (B=1 63 ms, B=2 107 ms): drafting costs 73 ms per step whatever l is, so l=1 pays off.

    Model timing (default) takes the cost from the profile or ``draft_cost``; live timing from the wall clock."""
    from dspark_lightning.infer import HardwareAwareScheduler
    from dspark_lightning.infer.schedule.draft_cost import DraftCost

    sps = SPSTable.from_points({1: 1 / 0.063, 2: 1 / 0.107, 8: 1 / 0.110})
    conf = torch.tensor([[0.5, 0.5, 0.5]])
    target_only = HardwareAwareScheduler(sps, include_draft_time=False)
    assert target_only(conf).tolist() == [0]  # (1 + 0.5) / 0.107 < 1 / 0.063
    assert HardwareAwareScheduler(sps, draft_cost=0.073)(conf).tolist() == [3]  # (1 + .5) / .180 > 1 / .136
    profiled = HardwareAwareScheduler(sps)
    assert profiled(conf).tolist() == [0]  # no profile bound yet: same as target-only
    profiled.cost = DraftCost([1, 8], [0.073, 0.2])
    assert profiled(conf).tolist() == [3]
    profiled.observe_draft_time(5.0)  # the wall clock does not move a model-timed schedule
    assert profiled(conf).tolist() == [3]
    live = HardwareAwareScheduler(sps, timing="live")
    assert live(conf).tolist() == [0]  # no draft time observed yet
    live.observe_draft_time(0.073)
    assert live(conf).tolist() == [3]


def test_draft_cost_interpolates():
    from dspark_lightning.infer.schedule.draft_cost import DraftCost

    c = DraftCost([1, 2, 8], [0.01, 0.02, 0.05])
    assert c(1) == 0.01 and c(2) == 0.02 and abs(c(5) - 0.035) < 1e-12 and abs(c(16) - 0.1) < 1e-12


def test_draft_gate_skips_when_drafting_loses_and_probes_back():
    from dspark_lightning.infer.schedule.schedulers import DraftGate

    gate = DraftGate(probe=2, max_probe=8, window=1, warmup=1)  # window 1: each observation replaces the estimate
    assert gate.wants_draft(1, plain_rate=None)  # nothing measured yet: draft
    gate.observe(True, 1, tokens=2, seconds=1.0)  # drafting: 2 tok/s
    assert not gate.wants_draft(1, plain_rate=3.0)  # the table says plain gives 3 tok/s: skip
    gate.observe(False, 1, tokens=1, seconds=0.25)  # measured plain: 4 tok/s
    decisions = [gate.wants_draft(1, plain_rate=3.0) for _ in range(12)]
    # one more skip (2 in a row), a probe, then the interval doubles: 4 skips, a probe, then 8 skips
    assert decisions[:2] == [False, True] and decisions[2:7] == [False] * 4 + [True] and not any(decisions[7:])
    gate.observe(True, 1, tokens=6, seconds=1.0)  # the probe finds drafting pays again (6 tok/s > 4)
    assert all(gate.wants_draft(1, plain_rate=3.0) for _ in range(5))
    assert gate.wants_draft(8, plain_rate=3.0)  # another batch size has its own estimates


def test_draft_gate_warms_up_and_judges_a_ratio_of_sums():
    """One unlucky first round (1 token in a long step) must not lock a drafter that pays out: the gate drafts
    through its warm-up, then compares tokens / seconds summed over the window (not a mean of per-step rates)."""
    from dspark_lightning.infer.schedule.schedulers import DraftGate

    gate = DraftGate(probe=8, max_probe=64, window=4, warmup=3)
    for tokens in (1, 4, 4):  # 1 token, then 4 per 0.1 s step: 9 tokens in 0.3 s = 30 tok/s
        assert gate.wants_draft(1, plain_rate=26.0)
        gate.observe(True, 1, tokens=tokens, seconds=0.1)
    assert gate.rate(True, 1) == pytest.approx(30.0) and gate.wants_draft(1, plain_rate=26.0)
    gate.observe(True, 1, tokens=1, seconds=0.1)  # window (1, 4, 4, 1): 25 tok/s < 26: skip
    assert not gate.wants_draft(1, plain_rate=26.0)
    gate.observe(True, 1, tokens=8, seconds=0.1)  # the oldest step leaves the window: (4, 4, 1, 8) = 42.5 tok/s
    assert gate.rate(True, 1) == pytest.approx(42.5) and gate.wants_draft(1, plain_rate=26.0)
    with pytest.raises(ValueError):
        DraftGate(window=0)

    old = DraftGate(probe=100, max_probe=100, window=4, warmup=2, max_age=10)  # probes too rare to matter here
    for _ in range(2):
        old.observe(True, 1, tokens=1, seconds=0.1)  # 10 tok/s: loses to 26
    assert not old.wants_draft(1, plain_rate=26.0)
    for _ in range(8):
        old.observe(False, 1, tokens=1, seconds=0.04)  # plain steps; the drafted ones age (step 10 of 10)
    assert old.rate(True, 1) == pytest.approx(10.0) and not old.wants_draft(1, plain_rate=26.0)
    old.observe(False, 1, tokens=1, seconds=0.04)  # the first drafted step is older than max_age...
    old.observe(False, 1, tokens=1, seconds=0.04)
    assert old.rate(True, 1) is None  # ...and so is the second: none is fresh
    assert not any(old.wants_draft(1, plain_rate=26.0) for _ in range(50))  # the last ones stand: no new warm-up
    old.observe(True, 1, tokens=4, seconds=0.1)  # a fresh drafted step (a probe's) at 40 tok/s replaces them
    assert old.rate(True, 1) == pytest.approx(40.0) and old.wants_draft(1, plain_rate=26.0)


def test_draft_gate_where_drafting_loses_drafts_only_its_warmup_and_probes():
    """Over a long response where drafting never pays, the drafted steps are the warm-up plus one probe per
    doubling interval: expiring estimates do not restart the warm-up (they used to, every max_age steps)."""
    from dspark_lightning.infer.schedule.schedulers import DraftGate

    gate = DraftGate(probe=8, max_probe=64, window=16, warmup=4, max_age=64)
    drafted = 0
    for _ in range(1000):
        d = gate.wants_draft(1, plain_rate=25.0)  # the SPS table's estimate until plain steps are measured
        drafted += d
        gate.observe(d, 1, tokens=1, seconds=0.06 if d else 0.04)  # a drafted step commits 1 token, slower
    assert drafted <= 4 + 1 + 1 + 1 + 1000 // 64 + 1  # warm-up, probes after 8, 16, 32, then one per 64


def test_engine_skips_the_drafter_when_the_gate_says_so(varied_target, prompts):
    from infer_helpers import make_drafter

    from dspark_lightning.infer import HardwareAwareScheduler, SPSTable, decode

    sched = HardwareAwareScheduler(SPSTable.from_points({1: 1.0, 8: 0.5, 64: 0.1}))
    sched.wants_draft = lambda R: False  # noqa: ARG005 - a gate that always skips
    drafter = make_drafter(varied_target, block_size=4)

    res = decode(varied_target, drafter, prompts, max_new_tokens=12, scheduler=sched)
    plain = decode(varied_target, None, prompts, max_new_tokens=12)
    assert res.token_ids == plain.token_ids
    assert res.stats.skipped_steps == res.stats.steps > 0 and res.stats.mean_verify_len == 0


def test_a_step_in_the_sps_curve_is_named():
    """Algorithm 1's break needs a smooth SPS: a step at B = 1 (this project's AMD EPYC) is detected and warned about;
    a smooth curve (its Intel Xeon) is not."""
    import warnings

    from dspark_lightning.infer import HardwareAwareScheduler, SPSTable
    from dspark_lightning.infer.schedule.schedulers import step_in_curve

    step = SPSTable.from_points({1: 26.4, 2: 15.8, 8: 15.8, 9: 14.0, 16: 12.0})
    smooth = SPSTable.from_points({1: 33.3, 2: 30.1, 3: 27.3, 4: 21.0, 8: 17.2, 16: 10.7})
    assert step_in_curve(step) == 1 and step_in_curve(smooth) is None
    assert step_in_curve(SPSTable.from_points({1: 1.0, 2: 0.9})) is None  # too short to judge
    sched = HardwareAwareScheduler(step)
    conf = torch.full((1, 4), 0.5)
    with pytest.warns(UserWarning, match="auto looks ahead"):
        sched(conf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched(conf)  # once per scheduler
        HardwareAwareScheduler(smooth)(conf)


def test_auto_scheduler_admits_blocks_that_pay_past_a_step_in_the_curve():
    """``auto`` (decode()'s default) looks ahead along a request's block: on a curve with a step at B = 1, where
    Algorithm 1 stops at ℓ = 0, it admits the block; where looking ahead cannot pay it is Algorithm 1."""
    import warnings

    from dspark_lightning.infer import HardwareAwareScheduler
    from dspark_lightning.infer.schedule.schedulers import AutoScheduler, lookahead_schedule, step_rates

    step = SPSTable.from_points({1: 26.4, 2: 15.8, 8: 15.8, 9: 14.0, 16: 12.0})
    conf = torch.tensor([[0.6, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picked = AutoScheduler(step, skip_draft=False, online=False)(conf)
    assert picked.tolist() == [7]
    assert HardwareAwareScheduler(step)(conf).tolist() == [0]  # what the step costs Algorithm 1 here
    worked = torch.tensor([[0.8, 0.7, 0.9]])
    assert lookahead_schedule(worked, step_rates(WORKED)).tolist() == prefix_schedule(worked, WORKED).tolist() == [1]
    assert "auto" in names("scheduler")
    with pytest.raises(RuntimeError, match="no SPS table"):
        AutoScheduler()(conf)


@pytest.mark.parametrize("walk", ["lookahead", "uniform"])
@pytest.mark.parametrize("seed", range(20))
def test_auto_admission_of_a_position_never_reads_later_confidences(seed, walk):
    """Non-anticipation (docs/algorithm.md §6): whether request r verifies position k may depend on ĉ_{r,1..k} and
    on other requests, never on ĉ_{r,k+1..} (which depend on the token x_{r,k}). Appendix A's counterexample is one
    case: c_2 = 0.9 or 0 must not decide whether x_1 is admitted. Both walks: the lookahead along a request's block
    and the padded one (every request the same length)."""
    from dspark_lightning.infer.schedule import schedulers

    lookahead_schedule = getattr(schedulers, f"{walk}_schedule")
    step_rates = schedulers.step_rates

    g = torch.Generator().manual_seed(seed)
    R, gamma = 1 + seed % 4, 5
    pts = sorted({1, *torch.randint(2, 40, (6,), generator=g).tolist()})
    sps = SPSTable.from_points(dict(zip(pts, sorted(torch.rand(len(pts), generator=g).tolist(), reverse=True),
                                        strict=True)))  # fmt: skip
    rates = step_rates(sps, extra=float(torch.rand(1, generator=g)) * 0.5)
    conf = torch.rand(R, gamma, generator=g)
    base = lookahead_schedule(conf, rates)
    for r in range(R):
        for k in range(gamma):
            other = conf.clone()
            other[r, k + 1 :] = torch.rand(gamma - k - 1, generator=g)
            assert bool(lookahead_schedule(other, rates)[r] >= k + 1) == bool(base[r] >= k + 1)
    appendix = SPSTable.from_points({1: 1.0, 2: 0.5, 3: 0.45})
    picks = {c2: lookahead_schedule(torch.tensor([[0.8, c2]]), step_rates(appendix)).tolist() for c2 in (0.9, 0.0)}
    assert picks[0.9][0] >= 1 if picks[0.0][0] >= 1 else picks[0.9][0] == 0


def test_auto_corrects_miscalibrated_confidences_and_stops_drafting_where_it_loses():
    """Rounds that accept far less than the head says shift its confidences down (online, from finished rounds),
    until drafting no longer pays and the gate skips the drafter, probing back now and then."""
    from dspark_lightning.infer.schedule.schedulers import AutoScheduler

    sps = SPSTable.from_points({1: 30.0, 4: 28.0, 8: 20.0, 16: 10.0})
    sched = AutoScheduler(sps, draft_cost=0.01, probe=4, max_probe=8, probe_budget=1.0)  # probes at any price
    conf = torch.full((1, 5), 0.9)
    assert sched.wants_draft(1)  # nothing observed yet
    first = sched(conf)
    assert int(first[0]) >= 3
    for _ in range(200):  # every round rejects its first draft
        ell = sched(conf)
        sched.observe_rounds(conf, ell, [0])
    assert sched.online(conf)[0, 0] < 0.3  # lowered until no draft is admitted (no more observations)
    decisions = [sched.wants_draft(1) for _ in range(12)]
    assert decisions.count(True) in (1, 2) and not decisions[0]  # skips, and probes after 4 skipped steps


def test_a_table_measured_on_a_busy_machine_is_named_once():
    """decode() warns when its verification steps ran far faster than the cached SPS table says (a table measured
    under load makes the hardware-aware schedulers timid); slower steps are this machine's load now, not warned."""
    import warnings

    from dspark_lightning.infer.decode import check_profile

    slow = SPSTable(tokens=[1, 8], sps=[10.0, 5.0], meta={"date": "busy-day"})
    steps = [2] * 40
    modelled = sum(1 / float(slow(torch.tensor(2.0))) for _ in steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_profile(slow, steps, modelled * 2.0)  # slower than the table: no warning
        check_profile(slow, steps[:10], modelled / 10)  # too few steps to judge
    with pytest.warns(UserWarning, match="faster than the SPS table measured on busy-day"):
        check_profile(slow, steps, modelled / 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_profile(slow, steps, modelled / 3)  # once per table


def test_online_expectation_applies_the_current_correction_to_every_remembered_step():
    """The lookahead's and the gate's expectation of a position is the window of remembered confidences corrected
    with the shift learned so far, not a running mean of corrections that were stale when they were taken."""
    from dspark_lightning.infer.schedule.schedulers import OnlineCalibration

    online = OnlineCalibration()
    conf = torch.full((1, 3), 0.9)
    for _ in range(30):  # the head says 0.9, every round rejects its first draft
        online.observe(conf, torch.tensor([3]), [0])
    assert online.expected(0) == pytest.approx(float(online(conf)[0, 0]))
    assert online.expected(0) < 0.35


def test_auto_drafts_only_when_drafting_beats_plain_by_its_margin():
    """A modelled gain smaller than ``margin`` (2 % here) is not worth the estimate's error: the gate skips."""
    from dspark_lightning.infer.schedule.schedulers import AutoScheduler

    flat = SPSTable.from_points({1: 10.0, 8: 10.0})
    conf = torch.full((1, 1), 0.5)
    decisions = {}
    for margin in (0.0, 0.03):  # drafting: 1.5 tokens per 0.1 + 0.0471 s = 10.2 tok/s against plain's 10
        sched = AutoScheduler(flat, draft_cost=0.0471, margin=margin)
        for m in (1, 0):  # two rounds that accept as often as the head says: no correction
            sched.observe_rounds(conf, torch.tensor([1]), [m])
        decisions[margin] = sched.wants_draft(1)
    assert decisions == {0.0: True, 0.03: False}


def test_padded_verification_is_priced_at_what_the_padded_step_computes():
    """A padded forward computes R (1 + max ℓ) positions whatever the lengths, so ``auto`` on a padded engine gives
    every request the same n, priced at B = R (1 + n): here the token-count walk gives the 0.95 request four drafts
    (8 tokens priced, 20 computed: 68 tokens/s, not the 218 it expected), the padded walk one draft each (167)."""
    from dspark_lightning.infer.schedule.schedulers import lookahead_schedule, step_rates, uniform_schedule

    rates = step_rates(SPSTable.from_points({1: 30.0, 4: 30.0, 8: 29.0, 12: 12.0, 28: 6.0}))
    conf = torch.tensor([[0.95] * 6, [0.6] * 6, [0.1] * 6, [0.1] * 6])
    a = conf.cumprod(-1)

    def padded_rate(lengths: torch.Tensor) -> float:
        value = 4 + sum(float(a[r, : int(n)].sum()) for r, n in enumerate(lengths))
        return value * rates[4 * (1 + int(lengths.max()))]

    ragged, uniform = lookahead_schedule(conf, rates), uniform_schedule(conf, rates)
    assert ragged.tolist() == [4, 0, 0, 0] and uniform.tolist() == [1, 1, 1, 1]
    assert padded_rate(uniform) > 2 * padded_rate(ragged)
    flat = step_rates(SPSTable.from_points({1: 30.0, 64: 30.0}))
    assert uniform_schedule(conf, flat).tolist() == [6] * 4  # free positions: the whole block


def test_the_engine_tells_auto_how_it_batches_a_verification(tiny_target):
    """The lean verifier pads (one cache row per request); the HF verifier's flat batching does not."""
    from dspark_lightning.infer import Engine, SamplingParams
    from dspark_lightning.infer.schedule.schedulers import AutoScheduler

    for verifier, batching, padded in (("lean", "padded", True), ("hf", "flat", False)):
        sched = AutoScheduler(SPSTable.from_points({1: 30.0, 8: 20.0}), draft_cost=0.01)
        Engine(tiny_target, None, params=SamplingParams(), scheduler=sched, stop_token_ids=[],
               verifier=verifier, batching=batching)  # fmt: skip
        assert sched.padded is padded


def test_a_shut_gates_probes_cost_at_most_their_budget_of_plain_decoding():
    """A probe's modelled time beyond a plain step, over the skipped plain steps between probes, stays within
    ``probe_budget``: a costly probe (a wide batch, where verifying one draft per request costs most of a plain
    step) waits longer than a cheap one."""
    from dspark_lightning.infer.schedule.schedulers import AutoScheduler

    sps = SPSTable.from_points({1: 30.0, 4: 28.0, 8: 20.0, 16: 10.0})
    for R in (1, 8):
        sched = AutoScheduler(sps, draft_cost=0.01, probe=2, max_probe=4, probe_budget=0.02)
        low = torch.full((R, 4), 0.02)
        sched.observe_rounds(low, torch.ones(R, dtype=torch.long), [0] * R)  # drafting does not pay: shut
        plain_step = R / sched._plain_rate(R)
        probe_extra = 1 / sched._rates(R, 1)[2 * R] - plain_step
        assert probe_extra > 0
        steps = 2000
        probes = sum(sched.wants_draft(R) for _ in range(steps))
        assert probes >= 1  # it still looks now and then
        assert probes * probe_extra <= 0.02 * steps * plain_step * (1 + 1e-9)
    assert AutoScheduler(sps, draft_cost=0.01).min_gap(8) > AutoScheduler(sps, draft_cost=0.01).min_gap(1)


def test_a_probe_verifies_at_least_one_draft_per_request():
    """A shut gate's probe that verified nothing would observe nothing and leave the gate shut for good: a probe
    verifies one draft per request however low the confidences; drafted steps that pay keep the walk's lengths."""
    from dspark_lightning.infer.schedule.schedulers import AutoScheduler

    sps = SPSTable.from_points({1: 30.0, 4: 28.0, 8: 20.0, 16: 10.0})
    sched = AutoScheduler(sps, draft_cost=0.01, probe=2, max_probe=2, probe_budget=1.0)
    low = torch.full((2, 4), 0.02)
    sched.observe_rounds(low, torch.tensor([1, 1]), [0, 0])  # drafting does not pay: the gate shuts
    decisions, lengths = [], []
    for _ in range(6):
        decisions.append(sched.wants_draft(2))
        if decisions[-1]:
            lengths.append(sched(low).tolist())
    assert decisions == [False, False, True] * 2
    assert lengths == [[1, 1], [1, 1]]
    assert sched(low).tolist() == [0, 0]  # not a probe: the walk's own answer
