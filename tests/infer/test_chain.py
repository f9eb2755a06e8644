"""Chain drafters (EAGLE-3, MTP): the cached inference chain computes exactly the training-time test (TTT)."""

from types import SimpleNamespace

import pytest
import torch
from infer_helpers import make_drafter

from dspark_lightning.infer import SamplingParams, make_proposer


def _request(ids, anchor_pos):
    return SimpleNamespace(prompt=ids[:anchor_pos], output=[ids[anchor_pos]])  # the output ends with the anchor


@pytest.mark.parametrize("name", ["eagle3", "mtp1"])
@pytest.mark.parametrize("batching", ["padded", "flat"])
def test_chain_train_infer_parity_over_two_rounds(tiny_target, tiny_batch, name, batching):
    context, hidden, ids = tiny_batch
    g, a1, a2 = 4, 9, 14
    drafter = make_drafter(tiny_target, name, block_size=g).eval()
    with torch.no_grad():
        ref = drafter(context[:1], ids[:1], torch.tensor([[a1, a2]]), torch.tensor([[True, True]]), hidden=hidden[:1])
    prop = make_proposer(drafter, batching=batching)
    prop.add([3, 7])  # a second request shares the cache (and the flat strip) without interfering
    seq, other = ids[0].tolist(), ids[1].tolist()
    prop.extend([7, 3], context[:, :8], torch.tensor([0, 0]), torch.tensor([5, 8]), hidden=hidden[:, :8])
    prop.extend([7], context[:1, 5:a1], torch.tensor([5]), torch.tensor([a1 - 5]), hidden=hidden[:1, 5:a1])
    params = SamplingParams(1.0)
    out = prop.propose(
        [7, 3],
        torch.tensor([seq[a1], other[8]]),
        torch.tensor([a1, 8]),
        params,
        teacher_tokens=torch.stack([ids[0, a1 + 1 : a1 + 1 + g], ids[1, 9 : 9 + g]]),
        requests=[_request(seq, a1), _request(other, 8)],
    )
    torch.testing.assert_close(out.logits[0], ref.logits[0, 0], atol=1e-5, rtol=1e-5)
    # round 2: a1 and four accepted drafts committed; their features come from the verification pass
    prop.extend([7], context[:1, a1:a2], torch.tensor([a1]), torch.tensor([a2 - a1]), hidden=hidden[:1, a1:a2])
    out2 = prop.propose(
        [7], torch.tensor([seq[a2]]), torch.tensor([a2]), params,
        teacher_tokens=ids[:1, a2 + 1 : a2 + 1 + g], requests=[_request(seq, a2)],
    )  # fmt: skip
    torch.testing.assert_close(out2.logits[0], ref.logits[0, 1], atol=1e-5, rtol=1e-5)
    assert out2.q.shape == (1, g, tiny_target.geometry.vocab_size) and out2.conf.shape == (1, g)


def test_ttt_steps_see_only_the_diagonal_and_earlier_context(tiny_target, tiny_batch):
    """Changing tokens after the anchor block leaves an anchor's TTT logits unchanged; before it, changes them."""
    context, hidden, ids = tiny_batch
    drafter = make_drafter(tiny_target, "eagle3", block_size=3).eval()
    anchors, valid = torch.tensor([[6]]), torch.tensor([[True]])
    base = drafter(context[:1], ids[:1], anchors, valid).logits
    late = ids[:1].clone()
    late[0, 12:] = (late[0, 12:] + 1) % 256
    torch.testing.assert_close(drafter(context[:1], late, anchors, valid).logits, base)
    early = ids[:1].clone()
    early[0, 2] = (early[0, 2] + 1) % 256
    assert not torch.allclose(drafter(context[:1], early, anchors, valid).logits, base)
