"""Skipped steps hold their target features and the drafter catches up in one extend when it drafts again: the
drafts it then proposes are the ones an eagerly extended cache gives, and decoding stays greedy-equal to HF."""

import pytest
import torch
from infer_helpers import hf_greedy, make_drafter

from dspark_lightning.infer import Engine, SamplingParams, Scheduler, make_proposer


class ScriptedGate(Scheduler):
    """Static full blocks; drafts only on the steps ``pattern`` marks (cycled), as a draft gate would decide."""

    def __init__(self, block_size: int, pattern: str) -> None:
        self.g, self.pattern, self.n = block_size, pattern, 0

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        return torch.full((conf.shape[0],), self.g, dtype=torch.long)

    def wants_draft(self, R: int) -> bool:
        self.n += 1
        return self.pattern[(self.n - 1) % len(self.pattern)] == "d"


def decode_recorded(target, drafter, prompts, pattern, max_steps, max_new=24):
    """Outputs and each drafting step's (ids, cached positions, logits), with a backlog of ``max_steps`` steps."""
    prop = make_proposer(drafter)
    seen = []
    inner = prop.propose

    def propose(ids, *a, **kw):
        out = inner(ids, *a, **kw)
        held = [sorted(prop.kv.pos[prop.kv.owner == rid].tolist()) for rid in ids]  # cached positions per request
        seen.append((list(ids), held, out.logits.clone()))
        return out

    prop.propose = propose
    eng = Engine(target, prop, params=SamplingParams(0.0), scheduler=ScriptedGate(drafter.block_size, pattern),
                 stop_token_ids=[])  # fmt: skip
    eng.backlog.max_steps = max_steps
    eng.add(prompts, max_new)
    while eng.active:
        eng.step()
    return [r.output for r in sorted(eng.requests, key=lambda r: r.index)], seen, eng


@pytest.mark.parametrize("context_state", [False, True])
@pytest.mark.parametrize("pattern", ["dsssd", "ssssssd", "dsdssd"])
def test_lazy_extend_drafts_what_an_eager_cache_drafts(varied_target, context_state, pattern):
    torch.manual_seed(0)
    drafter = make_drafter(varied_target, block_size=3, backbone={"class_path": "dense",
                               "init_args": {"num_layers": 1, "context_state": context_state}})  # fmt: skip
    prompts = [[5, 17, 33, 9, 41], [7, 2, 99, 14, 3, 60, 21, 8]]  # ragged: the backlog rows differ per request
    lazy_out, lazy_q, eng = decode_recorded(varied_target, drafter, prompts, pattern, max_steps=64)
    eager_out, eager_q, _ = decode_recorded(varied_target, drafter, prompts, pattern, max_steps=1)
    assert eng.log.skipped_steps > 0
    assert lazy_out == eager_out
    for p, out in zip(prompts, lazy_out, strict=True):
        assert out == hf_greedy(varied_target, p, 24)
    assert len(lazy_q) == len(eager_q) > 1
    for (ids_l, held_l, z_l), (ids_e, held_e, z_e) in zip(lazy_q, eager_q, strict=True):
        assert ids_l == ids_e
        assert held_l == held_e
        assert all(h == list(range(len(h))) for h in held_l)  # every position before the anchor, once
        torch.testing.assert_close(z_l, z_e, atol=1e-5, rtol=1e-5)


def test_a_full_backlog_is_flushed_and_requests_that_finish_are_dropped(varied_target):
    drafter = make_drafter(varied_target, block_size=3)
    prompts = [[5, 17, 33, 9, 41], [7, 2, 99]]
    prop = make_proposer(drafter)
    eng = Engine(varied_target, prop, params=SamplingParams(0.0), scheduler=ScriptedGate(3, "s"), stop_token_ids=[])
    eng.backlog.max_steps = 4
    eng.add(prompts, 10)
    for _ in range(3):
        eng.step()
    assert len(eng.backlog) == 3  # held, not yet in the drafter cache

    def cached(rid):
        return int((prop.kv.owner == rid).sum())

    before = [cached(rid) for rid in (0, 1)]
    eng.step()
    assert len(eng.backlog) == 0  # the fourth skipped step flushed
    assert [cached(rid) for rid in (0, 1)] == [n + 4 for n in before]
    while eng.active:
        eng.step()
    eng.backlog.flush(prop, [])  # every request finished: nothing to extend, no error
    assert len(eng.backlog) == 0


@pytest.mark.parametrize("name", ["eagle3", "mtp1", "dflash"])
def test_lazy_extend_for_every_drafter_family(varied_target, name):
    drafter = make_drafter(varied_target, name=name, block_size=3)
    prompts = [[5, 17, 33, 9, 41], [7, 2, 99, 14, 3, 60, 21, 8]]
    lazy_out, lazy_seen, _ = decode_recorded(varied_target, drafter, prompts, "dssssd", max_steps=64)
    eager_out, eager_seen, _ = decode_recorded(varied_target, drafter, prompts, "dssssd", max_steps=1)
    assert lazy_out == eager_out == [hf_greedy(varied_target, p, 24) for p in prompts]
    for (_, _, z_l), (_, _, z_e) in zip(lazy_seen, eager_seen, strict=True):
        torch.testing.assert_close(z_l, z_e, atol=1e-5, rtol=1e-5)
