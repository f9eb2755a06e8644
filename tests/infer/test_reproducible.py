"""docs/algorithm.md §10: what a seed fixes.

- Every request draws from its own streams, derived from (seed, prompt index) or pinned by ``seeds[i]``; with the
  static and threshold schedulers (l from the request's own confidences) a request's T > 0 output does not depend
  on the other requests, ``batch_size`` or the batching mode.
- The hardware-aware schedulers share a budget across the batch, but with their default model timing they read no
  clock: the same call gives the same output however slow or noisy the machine is.
"""

import itertools
import random

import pytest
from infer_helpers import make_drafter

from dspark_lightning.infer import SPSTable, decode

MAX_NEW = 16


@pytest.fixture(scope="module")
def drafter(varied_target):
    return make_drafter(varied_target, "dspark", block_size=4)


@pytest.mark.parametrize("scheduler", ["static", {"class_path": "threshold", "init_args": {"threshold": 0.3}}])
@pytest.mark.parametrize("batching", ["padded", "flat"])
def test_pinned_seed_fixes_a_request_whatever_its_neighbours(varied_target, prompts, drafter, scheduler, batching):
    A, B, C = prompts[1], prompts[0], prompts[3]
    kw = {"max_new_tokens": MAX_NEW, "temperature": 1.0, "scheduler": scheduler, "batching": batching}
    alone = decode(varied_target, drafter, [A], seeds=[7], **kw).token_ids[0]
    assert decode(varied_target, drafter, [B, A], seeds=[3, 7], **kw).token_ids[1] == alone
    assert decode(varied_target, drafter, [A, C, B], seeds=[7, 1, 2], batch_size=2, **kw).token_ids[0] == alone
    assert decode(varied_target, drafter, [A], seeds=[8], **kw).token_ids[0] != alone  # the seed matters


def test_default_streams_follow_the_prompt_index(varied_target, prompts, drafter):
    kw = {"max_new_tokens": MAX_NEW, "temperature": 1.0, "seed": 5, "scheduler": "static"}  # the property's scheduler
    first = decode(varied_target, drafter, [prompts[0], prompts[1]], **kw).token_ids[0]
    assert decode(varied_target, drafter, [prompts[0], prompts[2]], **kw).token_ids[0] == first
    assert decode(varied_target, drafter, [prompts[0]], batch_size=1, **kw).token_ids[0] == first


def test_seeds_must_match_the_prompts(varied_target, prompts, drafter):
    with pytest.raises(ValueError, match="seeds has 1 entries for 2 prompts"):
        decode(varied_target, drafter, prompts[:2], seeds=[1])


@pytest.mark.parametrize("name", ["hardware_aware", "async_hardware_aware"])
def test_hardware_aware_output_does_not_depend_on_machine_load(varied_target, prompts, drafter, name, monkeypatch):
    """Two runs under different fake clocks (a loaded machine: every step takes a random time) give the same T = 1
    output with model timing; the gate and l see the SPS table and the drafter's profiled cost only."""
    import dspark_lightning.infer.engine as engine_mod

    sps = SPSTable.from_points({1: 1 / 0.04, 4: 1 / 0.05, 8: 1 / 0.06, 16: 1 / 0.09, 64: 1 / 0.3})

    def run(jitter_seed: int) -> list[list[int]]:
        rng, now = random.Random(jitter_seed), itertools.count()

        def clock() -> float:
            return next(now) * 0.01 + rng.random() * 0.5  # not even monotone within a step

        monkeypatch.setattr(engine_mod.time, "perf_counter", clock)
        spec = {"class_path": name, "init_args": {"sps": sps, "draft_cost": 0.012}}
        out = decode(varied_target, drafter, prompts, max_new_tokens=MAX_NEW, temperature=1.0, seed=9, scheduler=spec)
        monkeypatch.undo()
        return out.token_ids

    assert run(1) == run(2)


def test_profiled_draft_cost_is_reused(varied_target, prompts, drafter):
    """The drafter's cost is measured once (per process for an in-memory drafter) and then read, not re-timed."""
    from dspark_lightning.infer.profiling.measure_draft_cost import load_or_profile_draft_cost

    first = load_or_profile_draft_cost(varied_target, drafter, max_batch=4, progress=False)
    again = load_or_profile_draft_cost(varied_target, drafter, max_batch=2, progress=False)
    assert again is first and first.batches == [1, 2, 4] and all(s > 0 for s in first.seconds)


def test_the_draft_cost_is_profiled_per_sampling_kind(varied_target, drafter):
    """A sampled step costs more than a greedy one (coupled acceptance hashes noise over the vocabulary at every
    verified position): ``auto`` reads the profile of the sampling it serves."""
    from dspark_lightning.infer.acceptance.sampling import SamplingParams
    from dspark_lightning.infer.profiling.measure_draft_cost import load_or_profile_draft_cost, sampling_kind

    assert sampling_kind(SamplingParams(0.0), "coupled") == "greedy"
    assert sampling_kind(SamplingParams(1.0), "coupled") == "coupled"
    assert sampling_kind(SamplingParams(0.7), {"class_path": "rejection"}) == "rejection"
    greedy = load_or_profile_draft_cost(varied_target, drafter, max_batch=2, progress=False)
    coupled = load_or_profile_draft_cost(varied_target, drafter, max_batch=2, progress=False,
                                         params=SamplingParams(1.0), acceptance="coupled")  # fmt: skip
    assert coupled is not greedy and coupled.meta["sampling"] == "coupled" and greedy.meta["sampling"] == "greedy"
    again = load_or_profile_draft_cost(varied_target, drafter, max_batch=2, progress=False,
                                       params=SamplingParams(0.5), acceptance="coupled")  # fmt: skip
    assert again is coupled  # the temperature's value does not change what a step costs
