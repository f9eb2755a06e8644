"""Coupled acceptance: drafter and target share Gumbel noise keyed by (seed, request, position), so at T > 0 the
output is token for token that of plain decoding in the same mode, for every drafter, scheduler and batch; each
position is still an exact sample of the target law."""

import pytest
import torch
from infer_helpers import OracleDrafter, chi2_pvalue, exact_marginals, make_drafter

from dspark_lightning import names
from dspark_lightning.infer import SamplingParams, SPSTable, decode

PROMPTS = [[5, 17, 33, 9, 41], [7, 2, 99, 14, 3, 60, 21, 8], [11, 4]]
LAWS = [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}]


def sps():
    return SPSTable.from_points({1: 30.0, 4: 28.0, 16: 20.0, 64: 8.0})


def schedulers():
    hw = {"sps": sps(), "include_draft_time": False}
    return [
        "static",
        "threshold",
        {"class_path": "hardware_aware", "init_args": {**hw}},
        {"class_path": "async_hardware_aware", "init_args": {**hw}},
    ]


def coupled(target, drafter, prompts=PROMPTS, **kw):
    kw = {"max_new_tokens": 24, "seed": 3, "stop_token_ids": [], "acceptance": "coupled", **kw}
    return decode(target, drafter, prompts, calibrated=False, **kw)


@pytest.mark.filterwarnings("ignore:.*uncalibrated confidences")
@pytest.mark.parametrize("law", LAWS, ids=["T1", "T0.7-topk-topp"])
@pytest.mark.parametrize("name", names("drafter"))
def test_every_drafter_and_scheduler_emits_plain_decodings_tokens(varied_target, name, law):
    plain = coupled(varied_target, None, **law).token_ids
    drafter = make_drafter(varied_target, name=name, block_size=4)
    for sched in schedulers():
        assert coupled(varied_target, drafter, scheduler=sched, **law).token_ids == plain, (name, sched)
    rejection = decode(varied_target, None, PROMPTS, max_new_tokens=24, seed=3, stop_token_ids=[], **law).token_ids
    assert rejection != plain  # a different mode: the equality above is not a property of the seed alone


@pytest.mark.parametrize("law", LAWS, ids=["T1", "T0.7-topk-topp"])
def test_a_good_drafter_is_accepted_and_the_output_does_not_move(toy_target, law):
    prompts = [[1, 2, 3, 4], [4, 3], [2, 2, 2, 5, 6]]
    plain = coupled(toy_target, None, prompts, **law)
    good = coupled(toy_target, OracleDrafter(toy_target, 3, mix=0.9), prompts, **law)
    assert good.token_ids == plain.token_ids
    assert good.stats.acceptance_rate > 0.4  # drafts really were accepted: equality is not by rejecting all
    alone = coupled(toy_target, OracleDrafter(toy_target, 3, mix=0.9), prompts[1:2], seeds=[9], **law)
    batched = coupled(toy_target, OracleDrafter(toy_target, 3, mix=0.9), prompts, seeds=[1, 9, 2], **law)
    assert alone.token_ids[0] == batched.token_ids[1]  # nor on its batch


def test_the_coupled_output_law_is_the_targets(toy_target):
    """4000 seeds: tokens 1 and 3 of a prompt follow the target's exact marginal law."""
    prompt, n = [1, 2, 3, 4], 4000
    want = exact_marginals(toy_target, prompt, 4, SamplingParams(1.0))
    res = decode(toy_target, OracleDrafter(toy_target, 3, mix=0.6), [prompt] * n, max_new_tokens=4,
                 stop_token_ids=[], temperature=1.0, acceptance="coupled", seed=11)  # fmt: skip
    out = torch.tensor(res.token_ids)
    for pos in (1, 3):
        counts = torch.bincount(out[:, pos], minlength=8).double()
        assert chi2_pvalue(counts, want[pos]) > 1e-3, (pos, counts, want[pos])


def test_unknown_acceptance_is_refused(varied_target):
    from dspark_lightning.registry import RegistryError

    with pytest.raises(RegistryError, match="unknown acceptance 'gumbel'; available: coupled, rejection"):
        decode(varied_target, None, PROMPTS[:1], max_new_tokens=2, acceptance="gumbel")


def test_the_noise_is_exponential_per_position_and_a_reduced_vocabulary_reads_its_target_ids():
    """E = -log u is standard exponential, fresh at every position; a draft vocabulary's column reads the noise of
    the target token it stands for, so drafter and target see one noise."""
    from dspark_lightning.infer.acceptance.coupled import CoupledNoise

    cpu = torch.device("cpu")
    full = CoupledNoise([123, 2**40 + 5], [10, 20], cpu).exponential(torch.arange(3), 20000)  # (2, 3, V)
    assert full.shape == (2, 3, 20000) and bool((full > 0).all())
    assert abs(full.mean().item() - 1) < 0.02 and abs(full.var().item() - 1) < 0.06
    flat = full.reshape(6, -1)
    corr = torch.corrcoef(flat)
    assert corr.fill_diagonal_(0).abs().max().item() < 0.03  # positions and requests draw apart
    vocab = torch.tensor([7, 19999, 100, 3])
    sub = CoupledNoise([123, 2**40 + 5], [10, 20], cpu, vocab=vocab).exponential(torch.arange(3), 4)
    assert torch.equal(sub, full[..., vocab])  # rows of 20000 values read as rows of 20000 (a stream's prefix)
    later = CoupledNoise([123, 2**40 + 5], [11, 21], cpu).exponential(torch.arange(2), 20000)
    assert torch.equal(later, full[:, 1:])  # an entry's noise is its (request, absolute position, token)


def test_the_scheduler_reads_the_coupled_chance_of_acceptance(varied_target, monkeypatch):
    """A drafter's confidences predict acceptance by rejection sampling (1 − TV); coupling accepts at least
    (1 − TV) / (1 + TV) of it, and that is what the scheduler weighs under coupled acceptance."""
    from dspark_lightning.infer import Scheduler
    from dspark_lightning.infer.acceptance.coupled import CoupledAcceptance

    c = torch.tensor([[1.0, 0.6, 0.0]])
    assert torch.allclose(CoupledAcceptance(SamplingParams(1.0), torch.device("cpu")).confidence(c),
                          torch.tensor([[1.0, 0.6 / 1.4, 0.0]]))  # fmt: skip

    class Seen(Scheduler):
        def __init__(self):
            self.seen = []

        def __call__(self, conf):
            self.seen.append(conf.clone())
            return torch.full((conf.shape[0],), 2, dtype=torch.long)

    drafter = make_drafter(varied_target, "dspark", block_size=3)
    monkeypatch.setattr(CoupledAcceptance, "confidence", lambda self, conf: torch.full_like(conf, 0.25))
    seen = Seen()
    coupled(varied_target, drafter, PROMPTS[:1], scheduler=seen, temperature=1.0)
    assert seen.seen and all(bool((s == 0.25).all()) for s in seen.seen)
    rejection = Seen()
    coupled(varied_target, drafter, PROMPTS[:1], scheduler=rejection, temperature=1.0, acceptance="rejection")
    assert not any(bool((s == 0.25).all()) for s in rejection.seen)  # rejection sampling reads them as they are
