"""At most 2 device -> host synchronisations per decoding round (the confidences for the scheduler, the packed
acceptance results), counted on the CPU by :class:`host_reads.HostReads` (``tests/infer/host_reads.py``)."""

import pytest
import torch
from host_reads import HostReads
from infer_helpers import make_drafter

from dspark_lightning.infer import Engine, SamplingParams, make_proposer

BUDGET = 2


def test_the_counter_sees_device_reads_and_not_host_ones():
    with HostReads() as h:  # (tensors made before the counter starts count as device tensors)
        dev = torch.arange(6, device="cpu")  # a factory given a device: a device tensor
        host = torch.arange(6)  # no device: host data
        int(host.max()), host.tolist(), bool((host > 2).any())  # free
        up = host.to(torch.device("cpu"))  # an upload makes a device tensor
        assert h.count == 0
        int(dev.max())
        dev[dev > 2]
        up.tolist()
        dev.cpu().tolist()  # one transfer, then host data
    assert h.count == 4
    assert h.where == {"__int__": 1, "bool-mask index": 1, "tolist": 1, "cpu": 1}


def rounds(target, name, verifier, R, T, scheduler="static", batching="padded"):
    prop = make_proposer(make_drafter(target, name=name, block_size=4), batching=batching) if name else None
    params = SamplingParams(T, top_p=0.9 if T else 1.0)
    eng = Engine(target, prop, params=params, scheduler=scheduler, stop_token_ids=[7], verifier=verifier,
                 batching=batching)  # fmt: skip
    eng.add([[5 + i, 17, 33, 9, 41 + i, 3][: 3 + i % 4] for i in range(R)], 16)
    eng.step()  # the first round after prefill
    counts = []
    while eng.active:
        with HostReads(trace=True) as h:
            eng.step()
        counts.append((h.count, dict(h.sites)))
    return counts


@pytest.mark.parametrize("R", [1, 8])
@pytest.mark.parametrize("verifier", ["lean", "hf"])
@pytest.mark.parametrize("name", ["dspark", "eagle3", "mtp1", None])
def test_at_most_two_syncs_per_round(varied_target, name, verifier, R):
    for T in (0.0, 1.0):
        counts = rounds(varied_target, name, verifier, R, T)
        assert counts, "no rounds ran"
        worst = max(counts, key=lambda c: c[0])
        assert worst[0] <= BUDGET, f"T={T}: {worst[0]} syncs in a round: {worst[1]}"


@pytest.mark.parametrize("scheduler", ["threshold", "flat"])
def test_at_most_two_syncs_per_round_other_schedulers_and_layouts(varied_target, scheduler):
    kw = {"batching": "flat", "scheduler": "static"} if scheduler == "flat" else {"scheduler": scheduler}
    counts = rounds(varied_target, "dspark", "hf", 4, 0.0, **kw)
    worst = max(counts, key=lambda c: c[0])
    assert worst[0] <= BUDGET, f"{worst[0]} syncs in a round: {worst[1]}"
