"""docs/algorithm.md §11.4 literal-token acceptance and §11.8 metrics on hand-made rounds."""

import pytest
import torch

from dspark_lightning.infer import RoundLog, SamplingParams, accept, summarize

GREEDY, T1 = SamplingParams(0.0), SamplingParams(1.0)
V = 5


def onehot_laws(tokens):
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()[None]  # (1, W, V)


def target_argmax_block(targets):
    """Target laws whose argmax at position k is targets[k] (soft, not one-hot)."""
    p = torch.full((1, len(targets), V), 0.1)
    for k, t in enumerate(targets):
        p[0, k, t] = 0.6
    return p


@pytest.mark.parametrize(
    ("drafts", "ell", "m", "y"),
    [
        ([1, 2, 3], 3, 3, 4),  # perfect match: all accepted + bonus from p_t,4
        ([0, 2, 3], 3, 0, 1),  # mismatch at position 1: the recovered token is the target argmax
        ([1, 2, 0], 3, 2, 3),  # mismatch at position 3: m = 2
        ([1, 2, 3], 2, 2, 3),  # l = 2 < γ: the bonus comes from p_t,3
        ([0, 0, 0], 0, 0, 1),  # empty block: one token from p_t,1
    ],
)
def test_greedy_literal_cases(drafts, ell, m, y):
    p = target_argmax_block([1, 2, 3, 4])
    q = onehot_laws(drafts)
    res = accept(torch.tensor([drafts]), q, p, torch.tensor([ell]), GREEDY)
    assert res.accepted.tolist() == [m] and res.next_token.tolist() == [y]


def test_sampling_q_equal_p_always_accepts_and_zero_p_always_rejects():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, 4, V, generator=gen), -1).expand(1000, 4, V)
    drafts = torch.multinomial(p[:, 0], 3, replacement=True, generator=gen)
    q = p[:, :3].gather(-1, drafts[..., None]).expand(1000, 3, V)  # shape only
    q = p[:, :3].clone()
    res = accept(drafts, q, p, torch.full((1000,), 3), T1, gen)
    assert (res.accepted == 3).all()
    # a draft the target gives probability 0: always rejected, the recovered token is from max(0, p - q)
    p0 = torch.tensor([[[0.0, 0.5, 0.5, 0.0, 0.0], [0.2] * 5]]).expand(1000, 2, V)
    q0 = torch.tensor([[[1.0, 0.0, 0.0, 0.0, 0.0]]]).expand(1000, 1, V)
    res = accept(torch.zeros(1000, 1, dtype=torch.long), q0, p0, torch.ones(1000, dtype=torch.long), T1, gen)
    assert (res.accepted == 0).all() and set(res.next_token.tolist()) == {1, 2}


def test_residual_guard_falls_back_to_p():
    p = torch.tensor([[[0.5, 0.5, 0, 0, 0], [0.2] * 5]])
    q = torch.tensor([[[0.5, 0.5, 0, 0, 0]]])  # p - q = 0 everywhere: only rounding could reject
    drafts = torch.tensor([[0]])
    res = accept(drafts, q, p, torch.tensor([1]), T1, torch.Generator().manual_seed(0))
    assert res.accepted.tolist() == [1]


def test_metrics_on_hand_made_rounds():
    log = RoundLog()
    # (l, m, e): a full accept with bonus, an early rejection, an empty block, an accepted EOS at draft 2 (l_eff = 2)
    for ell, m, e in [(3, 3, 4), (3, 1, 2), (0, 0, 1), (2, 2, 2)]:
        log.add(0, ell, m, e, None)
    s = summarize(log, block_size=3, generated=9, prompts=1, time_s={"total": 2.0, "prefill": 0.5})
    assert s.tau == pytest.approx(9 / 4)
    assert s.acceptance_rate == pytest.approx(6 / 8)
    assert s.verify_rate == pytest.approx(9 / 12)
    # S_k = #{m >= k} / #{l >= k}; A_k = #{m >= k} / #{l >= k and m >= k-1}
    assert s.survival == pytest.approx([3 / 3, 2 / 3, 1 / 2])
    assert s.conditional_acceptance == pytest.approx([3 / 3, 2 / 3, 1 / 1])
    assert s.mean_verify_len == pytest.approx(2.0)
    assert s.tokens_per_s == pytest.approx(4.5) and s.decode_tokens_per_s == pytest.approx(6.0)
