"""docs/algorithm.md §11.1: greedy speculative output equals the target's own greedy decoding, token for token."""

import inspect

import pytest
from infer_helpers import hf_greedy, make_drafter

from dspark_lightning import names
from dspark_lightning.infer import decode
from dspark_lightning.registry import get

MAX_NEW = 24


@pytest.fixture(scope="module")
def reference(varied_target, prompts):
    return [hf_greedy(varied_target, p, MAX_NEW, varied_target.stop_token_ids) for p in prompts]


@pytest.fixture(scope="module")
def sps():
    from dspark_lightning.infer import SPSTable

    # Costly long blocks: hardware_aware must choose a mix of lengths.
    return SPSTable.from_points({1: 1.0, 4: 0.9, 8: 0.7, 16: 0.45, 32: 0.25, 64: 0.12})


def scheduler_spec(name, sps):
    """Registered schedulers that take an SPS table get the test's table (no profiling in tests)."""
    params = inspect.signature(get("scheduler", name)).parameters
    return {"class_path": name, "init_args": {"sps": sps}} if "sps" in params else name


@pytest.mark.parametrize("drafter_name", names("drafter"))
@pytest.mark.parametrize("scheduler", names("scheduler"))
def test_every_drafter_and_scheduler(varied_target, prompts, reference, sps, drafter_name, scheduler):
    drafter = make_drafter(varied_target, drafter_name, block_size=3)
    res = decode(varied_target, drafter, prompts, max_new_tokens=MAX_NEW, scheduler=scheduler_spec(scheduler, sps))
    assert res.token_ids == reference
    assert res.stats.rounds > 0 and 1.0 <= res.stats.tau <= 4.0


@pytest.mark.parametrize("seq_head", names("seq_head"))
@pytest.mark.parametrize("block_size", [1, 7])
def test_every_head_and_block_size(varied_target, prompts, reference, seq_head, block_size):
    drafter = make_drafter(varied_target, "dspark", block_size=block_size, seq_head=seq_head)
    res = decode(varied_target, drafter, prompts, max_new_tokens=MAX_NEW, scheduler="static")
    assert res.token_ids == reference


@pytest.mark.parametrize("batching", ["padded", "flat"])
def test_batched_equals_per_request(varied_target, prompts, batching):
    drafter = make_drafter(varied_target, block_size=4)
    together = decode(varied_target, drafter, prompts, max_new_tokens=MAX_NEW, batching=batching)
    one_by_one = [decode(varied_target, drafter, [p], max_new_tokens=MAX_NEW, batching=batching) for p in prompts]
    assert together.token_ids == [r.token_ids[0] for r in one_by_one]
    rolling = decode(varied_target, drafter, prompts, max_new_tokens=MAX_NEW, batching=batching, batch_size=2)
    assert rolling.token_ids == together.token_ids  # continuous batching: requests join as others finish


def test_good_drafter_through_stop_token_and_length_cut(varied_target, prompts):
    """An oracle-quality block (the target's own continuation) is accepted; a stop token inside it ends the request."""
    long = hf_greedy(varied_target, prompts[1], 40)
    stop = long[9]
    first = long.index(stop)
    ref = hf_greedy(varied_target, prompts[1], 40, stop_ids=[stop])
    assert ref == long[: first + 1]
    drafter = make_drafter(varied_target, block_size=5)
    res = decode(varied_target, drafter, [prompts[1]], max_new_tokens=40, stop_token_ids=[stop])
    assert res.token_ids[0] == ref and res.finish_reasons == ["stop"]
    cut = decode(varied_target, drafter, [prompts[1]], max_new_tokens=7, stop_token_ids=[])
    assert cut.token_ids[0] == long[:7] and cut.finish_reasons == ["length"]


def test_plain_decoding_matches_hf(varied_target, prompts, reference):
    res = decode(varied_target, None, prompts, max_new_tokens=MAX_NEW)
    assert res.token_ids == reference
    assert res.stats.tau == 1.0 and res.stats.mean_verify_len == 0.0


def test_stop_string_cuts_text_and_tokens(varied_target, prompts, reference):
    tok = varied_target.tokenizer
    ref = reference[3]
    ref_text = tok.decode(ref)
    k = next(i for i in range(4, len(ref)) if tok.decode(ref[i : i + 2]) and tok.decode(ref[i : i + 2]) in ref_text)
    stop = tok.decode(ref[k : k + 2])
    drafter = make_drafter(varied_target, block_size=4)
    res = decode(varied_target, drafter, [prompts[3]], max_new_tokens=MAX_NEW, stop=[stop])
    ids = res.token_ids[0]
    assert res.finish_reasons == ["stop_string"]
    assert ids == ref[: len(ids)] and stop in tok.decode(ids) and stop not in tok.decode(ids[:-1])
    assert stop not in res.texts[0] and tok.decode(ids).startswith(res.texts[0])
