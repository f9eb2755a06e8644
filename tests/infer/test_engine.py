"""Engine-level invariants: stop tokens inside a block, cache lengths P+m+1, train/infer parity."""

import pytest
import torch
from infer_helpers import hf_greedy, make_drafter

from dspark_lightning import names
from dspark_lightning.infer import Engine, Proposal, SamplingParams, StatelessProposer, make_proposer


class ScriptedProposer(StatelessProposer):
    """Drafts a fixed continuation (each block continues the script from the anchor's position)."""

    def __init__(self, script: list[int], offset: int, block_size: int, vocab: int, wrong_at: int | None = None):
        self.script, self.offset, self.block_size, self.V, self.wrong_at = script, offset, block_size, vocab, wrong_at

    def propose(self, ids, anchors, anchor_pos, params, generator=None, requests=None):
        P = int(anchor_pos[0]) - self.offset  # index in the script of the anchor
        block = [self.script[P + k] if P + k < len(self.script) else 0 for k in range(1, self.block_size + 1)]
        if self.wrong_at is not None:
            block[self.wrong_at] = (block[self.wrong_at] + 1) % self.V
        toks = torch.tensor([block])
        q = torch.nn.functional.one_hot(toks, self.V).float()
        return Proposal(tokens=toks, q=q, conf=torch.ones(1, self.block_size), logits=q)


def run_engine(target, prompt, proposer, stop_ids, max_new=30, verifier="auto"):
    eng = Engine(
        target, proposer, params=SamplingParams(0.0), scheduler="static", stop_token_ids=stop_ids, verifier=verifier
    )
    eng.add([prompt], max_new)
    steps = []
    while eng.active:
        r = eng.active[0]
        eng.step()
        live = eng.verifier.cached_length(r.rid) if not r.done else None
        steps.append((eng.log.accepted[-1], eng.log.committed[-1], r.pos, live))
    return eng, steps


@pytest.mark.parametrize("verifier", ["lean", "hf"])
def test_cache_holds_exactly_the_committed_positions(varied_target, prompts, verifier):
    script = hf_greedy(varied_target, prompts[0], 30, varied_target.stop_token_ids)
    prop = ScriptedProposer(script, len(prompts[0]), 4, varied_target.geometry.vocab_size, wrong_at=2)
    eng, steps = run_engine(varied_target, prompts[0], prop, varied_target.stop_token_ids, verifier=verifier)
    assert eng.requests[0].output == script
    for m, e, pos, live in steps[:-1]:
        assert m == 2 and e == 3  # drafts 1-2 match, draft 3 is wrong: recovered token
        assert live == pos  # target cache = positions 0..P+m (anchor + accepted); the new anchor is not cached


@pytest.mark.parametrize("verifier", ["lean", "hf"])
def test_accepted_stop_token_ends_the_round_without_bonus(varied_target, prompts, verifier):
    script = hf_greedy(varied_target, prompts[1], 30, [])
    P = len(prompts[1])
    # round 1: anchor script[0], drafts script[1..5] (all accepted), bonus script[6]; round 2 drafts script[7..11]
    j = next(i for i in range(7, 12) if script[i] not in script[:i])
    stop, first = script[j], j
    prop = ScriptedProposer(script, P, 5, varied_target.geometry.vocab_size)
    eng, steps = run_engine(varied_target, prompts[1], prop, [stop], verifier=verifier)
    r = eng.requests[0]
    assert r.output == script[: first + 1] and r.finish_reason == "stop"
    assert len(steps) == 2 and eng.log.accepted[0] == 5  # round 1 accepts a whole block (+ bonus)
    assert eng.log.committed[-1] == eng.log.ell[-1] == eng.log.accepted[-1] == 1  # l_eff = m = e = j = 1: no bonus
    assert eng.verifier.cached_length(r.rid) == 0 and not eng.active  # finished requests leave both caches


@pytest.mark.parametrize("seq_head", [*names("seq_head"), None])
@pytest.mark.parametrize("batching", ["padded", "flat"])
def test_train_infer_parity(tiny_target, tiny_batch, seq_head, batching):
    """docs/algorithm.md §11.11: teacher-forced logits/confidences for one anchor equal the cached inference propose."""
    context, _, ids = tiny_batch
    g, a = 4, 11
    drafter = make_drafter(tiny_target, "dspark", block_size=g, seq_head=seq_head).eval()
    with torch.no_grad():
        ref = drafter(context[:1], ids[:1], torch.tensor([[a]]), torch.tensor([[True]]))
    prop = make_proposer(drafter, batching=batching)
    prop.add([7])
    # the context arrives in two pieces, as prefill + one round would deliver it
    prop.extend([7], context[:1, :5], torch.tensor([0]), torch.tensor([5]))
    prop.extend([7], context[:1, 5:a], torch.tensor([5]), torch.tensor([a - 5]))
    out = prop.propose(
        [7], ids[0, a : a + 1], torch.tensor([a]), SamplingParams(1.0), teacher_tokens=ids[:1, a + 1 : a + 1 + g]
    )
    torch.testing.assert_close(out.logits, ref.logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.conf, torch.sigmoid(ref.conf_logits[0]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batching", ["padded", "flat"])
def test_train_infer_parity_with_context_state(tiny_target, tiny_batch, batching):
    """A context_state backbone reads h^T_{a-1} in training and the last extended final hidden state at inference:
    the two give the same logits; the injection is live (a non-zero W_s changes them)."""
    context, hidden, ids = tiny_batch
    g, a = 4, 11
    drafter = make_drafter(
        tiny_target,
        "dspark",
        block_size=g,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1, "context_state": True}},
    ).eval()
    assert not drafter.backbone.state_proj.weight.any()  # starts as the plain design
    with torch.no_grad():
        plain = drafter(context[:1], ids[:1], torch.tensor([[a]]), torch.tensor([[True]]), hidden=hidden[:1])
        torch.nn.init.normal_(drafter.backbone.state_proj.weight, std=0.5)
        ref = drafter(context[:1], ids[:1], torch.tensor([[a]]), torch.tensor([[True]]), hidden=hidden[:1])
    assert not torch.allclose(plain.logits, ref.logits)
    prop = make_proposer(drafter, batching=batching)
    prop.add([7])
    prop.extend([7], context[:1, :5], torch.tensor([0]), torch.tensor([5]), hidden=hidden[:1, :5])
    prop.extend([7], context[:1, 5:a], torch.tensor([5]), torch.tensor([a - 5]), hidden=hidden[:1, 5:a])
    out = prop.propose(
        [7], ids[0, a : a + 1], torch.tensor([a]), SamplingParams(1.0), teacher_tokens=ids[:1, a + 1 : a + 1 + g]
    )
    torch.testing.assert_close(out.logits, ref.logits[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="final hidden"):
        prop.extend([7], context[:1, a : a + 1], torch.tensor([a]), torch.tensor([1]))
