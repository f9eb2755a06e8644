"""docs/algorithm.md §11.2-3: the committed tokens have exactly the target's law, whatever the drafter and scheduler."""

import pytest
import torch
from infer_helpers import OracleDrafter, chi2_pvalue, exact_marginals, make_drafter

from dspark_lightning import names
from dspark_lightning.infer import SamplingParams, SPSTable, accept, decode, prefix_schedule, probs, sample

P_FIXED = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1, 0.0])
Q_FIXED = torch.tensor([0.1, 0.0, 0.3, 0.2, 0.15, 0.25])


def law(values: torch.Tensor, T: float) -> torch.Tensor:
    return probs(values.log(), SamplingParams(T))


@pytest.mark.parametrize("T", [0.7, 1.0])
def test_first_token_law_fixed_p_q(T):
    n, g = 200_000, 1
    gen = torch.Generator().manual_seed(0)
    p, q = law(P_FIXED, T), law(Q_FIXED, T)
    params = SamplingParams(T)
    drafts = sample(q.expand(n, g, 6), params, gen)  # (n, 1)
    res = accept(drafts, q.expand(n, g, 6), p.expand(n, g + 1, 6), torch.ones(n, dtype=torch.long), params, gen)
    first = torch.where(res.accepted >= 1, drafts[:, 0], res.next_token)
    counts = torch.bincount(first, minlength=6).double()
    assert counts[5] == 0  # p_t(5) = 0 is never emitted, though the draft proposes it a quarter of the time
    assert chi2_pvalue(counts[:5], p[:5].double()) > 1e-3


def test_joint_law_of_two_tokens_block3():
    """γ = 3 with context-dependent laws: (first, second) token pairs follow p_1(a) P_2[a](b)."""
    V, n, g = 6, 200_000, 3
    gen = torch.Generator().manual_seed(1)
    params = SamplingParams(1.0)
    logits = torch.randn(g + 1, V, V, generator=gen) * 1.5
    logits[:, :, 5] = float("-inf")  # a token the target never emits
    P = probs(logits, params)  # P[k][prev] = target law at position k+1 given the previous token
    Q = probs(torch.randn(g, V, V, generator=gen) * 1.5, params)  # draft laws, unrelated to P
    p1, q1 = P[0, 0], Q[0, 0]  # first position: fixed context
    x, qs = [], []
    prev = None
    for k in range(g):
        qk = q1.expand(n, V) if k == 0 else Q[k][prev]
        xk = sample(qk, params, gen)
        x.append(xk)
        qs.append(qk)
        prev = xk
    drafts, q = torch.stack(x, 1), torch.stack(qs, 1)
    p = torch.stack([p1.expand(n, V), P[1][drafts[:, 0]], P[2][drafts[:, 1]], P[3][drafts[:, 2]]], 1)
    res = accept(drafts, q, p, torch.full((n,), g), params, gen)
    m, y = res.accepted, res.next_token
    first = torch.where(m >= 1, drafts[:, 0], y)
    second_next_round = sample(P[1][y], params, gen)  # m = 0: the next round's first token, given y
    second = torch.where(m >= 2, drafts[:, 1], torch.where(m == 1, y, second_next_round))
    counts = torch.bincount(first * V + second, minlength=V * V).double()
    expected = (p1[:, None] * P[1]).reshape(-1).double()
    assert counts[expected == 0].sum() == 0
    assert chi2_pvalue(counts[expected > 0], expected[expected > 0]) > 1e-3


def test_sampler_and_verifier_read_the_same_q(toy_target, monkeypatch):
    """Structural: the tensor each draft token is drawn from is bit-identical to Proposal.q used by accept()."""
    import dspark_lightning.infer.propose.draft as draft_mod
    from dspark_lightning.infer import make_proposer

    seen = []
    real = draft_mod.sample

    def spy(p, params, generator):
        seen.append(p)
        return real(p, params, generator)

    monkeypatch.setattr(draft_mod, "sample", spy)
    drafter = make_drafter(toy_target, block_size=3)
    prop = make_proposer(drafter)
    prop.add([0])
    ctx = toy_target(torch.tensor([[1, 2, 3]])).context
    prop.extend([0], ctx, torch.tensor([0]), torch.tensor([3]))
    out = prop.propose([0], torch.tensor([4]), torch.tensor([3]), SamplingParams(1.0), torch.Generator().manual_seed(0))
    assert len(seen) == 3 and out.q.dtype == torch.float32
    for k in range(3):
        assert seen[k].dtype == torch.float32 and torch.equal(seen[k], out.q[:, k])


# --- Appendix A ------------------------------------------------------------------------------
SPS_A = SPSTable.from_points({1: 1.0, 2: 0.5, 3: 0.45})
P_A, Q_A = torch.tensor([0.7, 0.3]), torch.tensor([0.5, 0.5])


def retrospective(conf: torch.Tensor, sps: SPSTable) -> torch.Tensor:
    """The forbidden scheduler: a global argmax over l of (1 + sum_{j<=l} a_j) SPS(1+l), using all confidences."""
    a = conf.double().cumprod(-1)[0]
    theta = [(1 + float(a[:ell].sum())) * float(sps(1 + ell)) for ell in range(len(a) + 1)]
    return torch.tensor([max(range(len(theta)), key=theta.__getitem__)])


def conf_given(x1: int) -> torch.Tensor:
    return torch.tensor([[0.8, 0.9 if x1 == 0 else 0.0]])


def exact_law(scheduler) -> torch.Tensor:
    out = torch.zeros(2)
    for x1 in (0, 1):
        ell = int(scheduler(conf_given(x1), SPS_A)[0])
        if ell == 0:
            out += Q_A[x1] * P_A
            continue
        acc = min(1.0, float(P_A[x1] / Q_A[x1]))
        resid = (P_A - Q_A).clamp(min=0)
        out += Q_A[x1] * (acc * torch.nn.functional.one_hot(torch.tensor(x1), 2) + (1 - acc) * resid / resid.sum())
    return out


def monte_carlo_law(scheduler, n=100_000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(1.0)
    x1 = sample(Q_A.expand(n, 2), params, gen)
    drafts = torch.stack([x1, x1], 1)
    ell = torch.where(x1 == 0, scheduler(conf_given(0), SPS_A)[0], scheduler(conf_given(1), SPS_A)[0])
    res = accept(drafts, Q_A.expand(n, 2, 2), P_A.expand(n, 3, 2), ell, params, gen)
    y = torch.where(res.accepted >= 1, x1, res.next_token)
    return torch.bincount(y, minlength=2).double() / n


def test_appendix_a_schedules():
    assert [int(prefix_schedule(conf_given(x), SPS_A)[0]) for x in (0, 1)] == [0, 0]
    assert [int(retrospective(conf_given(x), SPS_A)[0]) for x in (0, 1)] == [2, 0]


@pytest.mark.parametrize(("scheduler", "expected"), [(prefix_schedule, (0.7, 0.3)), (retrospective, (0.85, 0.15))])
def test_appendix_a_output_laws(scheduler, expected):
    assert torch.allclose(exact_law(scheduler), torch.tensor(expected, dtype=torch.float32), atol=1e-6)
    assert torch.allclose(monte_carlo_law(scheduler), torch.tensor(expected, dtype=torch.float64), atol=0.005)


# --- end to end: decode() on the 8-token toy target -----------------------------------------
N_SAMPLES = 4000
PROMPT = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def marginals(toy_target):
    return {T: exact_marginals(toy_target, PROMPT, 4, SamplingParams(*T)) for T in [(1.0,), (0.8, 5)]}


def toy_sps():
    R = N_SAMPLES
    return SPSTable.from_points({1: 1.0, R: 1.0, int(1.5 * R): 0.8, 2 * R: 0.55, 4 * R: 0.3})


def toy_decode(toy_target, drafter, **kw):
    """N_SAMPLES copies of PROMPT, 4 new tokens each, no stop token: (N, 4) output ids."""
    res = decode(toy_target, drafter, [PROMPT] * N_SAMPLES, max_new_tokens=4, stop_token_ids=[], **kw)
    return res, torch.tensor(res.token_ids)


@pytest.mark.parametrize("quality", ["bad", "good"])
@pytest.mark.parametrize("scheduler", ["static", "threshold", "hardware_aware"])
def test_decode_output_law_matches_target(toy_target, marginals, quality, scheduler):
    drafter = make_drafter(toy_target, block_size=3) if quality == "bad" else OracleDrafter(toy_target, 3, mix=0.6)
    # Without the measured drafting time the schedule does not depend on how busy the machine is (the oracle
    # drafter runs the target, so on a loaded machine its cost alone would push every length to 0).
    hw = {"class_path": "hardware_aware", "init_args": {"sps": toy_sps(), "include_draft_time": False}}
    spec = hw if scheduler == "hardware_aware" else scheduler
    res, out = toy_decode(toy_target, drafter, temperature=1.0, scheduler=spec, seed=3)
    assert out.shape == (N_SAMPLES, 4)
    if scheduler != "static":
        assert 0 < res.stats.mean_verify_len < 3  # the scheduler really mixes lengths
    if quality == "good":
        assert res.stats.acceptance_rate > 0.5
    for pos in (1, 3):  # the first round's first token, and a later one
        counts = torch.bincount(out[:, pos], minlength=8).double()
        assert chi2_pvalue(counts, marginals[(1.0,)][pos]) > 1e-3, (pos, counts, marginals[(1.0,)][pos])


def test_decode_law_with_top_k_and_temperature(toy_target, marginals):
    _, out = toy_decode(toy_target, OracleDrafter(toy_target, 3, mix=0.6), temperature=0.8, top_k=5, seed=4)
    for pos in (1, 3):
        counts = torch.bincount(out[:, pos], minlength=8).double()
        expected = marginals[(0.8, 5)][pos]
        assert counts[expected == 0].sum() == 0
        assert chi2_pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("drafter_name", [n for n in names("drafter") if n != "dspark"])  # dspark: above
def test_decode_output_law_every_drafter(toy_target, marginals, drafter_name):
    """Every registered drafter (chain drafters included) keeps the target's output law at T = 1."""
    _, out = toy_decode(toy_target, make_drafter(toy_target, drafter_name, block_size=3), temperature=1.0, seed=5)
    for pos in (1, 3):
        counts = torch.bincount(out[:, pos], minlength=8).double()
        assert chi2_pvalue(counts, marginals[(1.0,)][pos]) > 1e-3, (drafter_name, pos, counts)
