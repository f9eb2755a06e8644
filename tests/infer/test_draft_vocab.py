"""A reduced draft vocabulary (FR-Spec / EAGLE-3) keeps decoding lossless: greedy equality and output laws."""

import pytest
import torch
from infer_helpers import chi2_pvalue, exact_marginals, hf_greedy, make_drafter

from dspark_lightning import load_drafter, names
from dspark_lightning.checkpoint import save_drafter
from dspark_lightning.drafters.drafter import check_draft_vocab
from dspark_lightning.infer import SamplingParams, SPSTable, decode, make_proposer
from dspark_lightning.losses import dspark_loss

MAX_NEW = 24


def vocab_drafter(target, name="dspark", block_size=3, seed=0, **kw):
    """A random drafter whose draft vocabulary is every other target token (plus the stop tokens)."""
    V = target.geometry.vocab_size
    ids = sorted(set(range(0, V, 2)) | set(target.stop_token_ids))
    d = make_drafter(target, name, block_size=block_size, seed=seed, draft_vocab_size=len(ids), **kw)
    d.set_draft_vocab(torch.tensor(ids))
    return d


@pytest.fixture(scope="module")
def reference(varied_target, prompts):
    return [hf_greedy(varied_target, p, MAX_NEW, varied_target.stop_token_ids) for p in prompts]


@pytest.mark.parametrize("seq_head", [*names("seq_head"), None])
@pytest.mark.parametrize("scheduler", ["static", "hardware_aware"])
def test_greedy_equality_with_reduced_vocab(varied_target, prompts, reference, seq_head, scheduler):
    d = vocab_drafter(varied_target, block_size=4, seq_head=seq_head)
    sps = SPSTable.from_points({1: 1.0, 4: 0.9, 8: 0.7, 16: 0.45, 32: 0.25})
    spec = (
        {"class_path": "hardware_aware", "init_args": {"sps": sps, "include_draft_time": False}}
        if scheduler != "static"
        else "static"
    )
    res = decode(varied_target, d, prompts, max_new_tokens=MAX_NEW, scheduler=spec)
    assert res.token_ids == reference


@pytest.mark.parametrize("drafter_name", [n for n in names("drafter") if n != "dspark"])
def test_every_drafter_family_greedy_with_reduced_vocab(varied_target, prompts, reference, drafter_name):
    d = vocab_drafter(varied_target, drafter_name, block_size=5)
    assert decode(varied_target, d, prompts, max_new_tokens=MAX_NEW).token_ids == reference


def test_proposal_law_is_zero_outside_the_subset(varied_target, prompts):
    d = vocab_drafter(varied_target, block_size=5)
    prop = make_proposer(d)
    prop.add([0])
    ctx = torch.randn(1, 6, varied_target.geometry.n_tapped * varied_target.geometry.hidden_size)
    prop.extend([0], ctx, torch.tensor([0]), torch.tensor([6]))
    out = prop.propose([0], torch.tensor([3]), torch.tensor([6]), SamplingParams(1.0), torch.Generator().manual_seed(0))
    outside = torch.ones(varied_target.geometry.vocab_size, dtype=torch.bool)
    outside[d.draft_vocab] = False
    assert out.q.shape[-1] == varied_target.geometry.vocab_size
    assert bool((out.q[..., outside] == 0).all()) and bool((out.logits[..., outside] == float("-inf")).all())
    torch.testing.assert_close(out.q.sum(-1), torch.ones(1, 5))
    assert bool(torch.isin(out.tokens, d.draft_vocab).all())


# --- output laws on the 8-token toy target ---------------------------------------------------
N = 4000
PROMPT = [1, 2, 3, 4]
SUBSET = [0, 2, 5, 7]  # the target emits every token; the drafter can only propose these


LAWS = [("dspark", 1.0, None, None), ("dspark", 0.7, None, None), ("dspark", 0.7, 5, None),
        ("dspark", 1.0, None, 0.8), ("eagle3", 1.0, None, None)]  # fmt: skip


@pytest.mark.parametrize(("name", "T", "top_k", "top_p"), LAWS)
def test_output_law_with_reduced_vocab(toy_target, name, T, top_k, top_p):
    params = SamplingParams(T, top_k, top_p)
    marg = exact_marginals(toy_target, PROMPT, 4, params)
    d = make_drafter(toy_target, name, block_size=3, draft_vocab_size=len(SUBSET))
    d.set_draft_vocab(torch.tensor(SUBSET))
    res = decode(toy_target, d, [PROMPT] * N, max_new_tokens=4, stop_token_ids=[], temperature=T, top_k=top_k,
                 scheduler="static",
                 top_p=top_p, seed=7)  # fmt: skip
    out = torch.tensor(res.token_ids)
    assert res.stats.acceptance_rate > 0  # drafts do get accepted
    for pos in (1, 3):
        counts = torch.bincount(out[:, pos], minlength=8).double()
        assert counts[marg[pos] == 0].sum() == 0
        assert chi2_pvalue(counts, marg[pos]) > 1e-3, (pos, counts, marg[pos])


# --- training loss, export --------------------------------------------------------------------
def test_loss_counts_outside_mass_as_rejected():
    """V = 4, draft vocabulary {0, 1}: p_d = (0.5, 0.5, 0, 0) against p_t = (0.4, 0.3, 0.2, 0.1)."""
    z = torch.tensor([[[0.0, 0.0, float("-inf"), float("-inf")]]], requires_grad=True)
    pt = torch.tensor([0.4, 0.3, 0.2, 0.1])
    labels = torch.tensor([[2]])  # outside the subset: no CE term, but no NaN either
    terms = dspark_loss(z, pt.log()[None, None], labels, torch.ones(1, 1), torch.ones(1), torch.zeros(1, 1))
    assert abs(float(terms.l1.detach()) - 0.6) < 1e-6  # |0.5-0.4| + |0.5-0.3| + 0.2 + 0.1
    assert abs(float(terms.acc[0, 0]) - 0.7) < 1e-6  # c* = 0.4 + 0.3
    assert float(terms.ce.detach()) == 0.0
    terms.total.backward()
    assert torch.isfinite(z.grad[..., :2]).all() and bool((z.grad[..., 2:] == 0).all())
    in_vocab = dspark_loss(z, pt.log()[None, None], torch.tensor([[1]]), torch.ones(1, 1), torch.ones(1))
    assert abs(float(in_vocab.ce.detach()) - float(torch.log(torch.tensor(2.0)))) < 1e-6


def test_export_round_trip_keeps_the_vocab(varied_target, tmp_path):
    d = vocab_drafter(varied_target, block_size=3)
    save_drafter(d, tmp_path / "d", varied_target)
    back = load_drafter(tmp_path / "d", varied_target)
    assert torch.equal(back.draft_vocab, d.draft_vocab)
    assert back.geometry.draft_vocab_size == d.draft_vocab.numel()


def test_bad_vocab_is_refused(varied_target):
    d = make_drafter(varied_target, block_size=3, draft_vocab_size=4)
    with pytest.raises(RuntimeError, match="not set"):
        d.draft_head_weight()
    with pytest.raises(ValueError, match="4 distinct"):
        d.set_draft_vocab(torch.tensor([1, 2, 2, 3]))
    with pytest.raises(ValueError, match=r"\[0, 260\)"):
        check_draft_vocab(torch.tensor([1, 2, 3, 999]), 4, 260)
    with pytest.raises(ValueError, match="sorted"):
        check_draft_vocab(torch.tensor([3, 2, 1, 0]), 4, 260)
