"""Round timings: on a CPU every interval is known at once; with device events an interval is handed over only
once its end has completed, never by reading it early (a fake event stands in for CUDA's)."""

import torch
from infer_helpers import make_drafter

from dspark_lightning.infer import Engine, SamplingParams, make_proposer
from dspark_lightning.infer.schedule.clock import RoundClock


class FakeEvent:
    """Completes when the test says so; elapsed_time in ms like torch.cuda.Event."""

    def __init__(self, t: float) -> None:
        self.t, self.done, self.synced = t, False, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = self.synced = True

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.done and end.done, "elapsed_time read before the events completed"
        return (end.t - self.t) * 1e3


def test_device_intervals_are_read_only_when_finished():
    clock = RoundClock(torch.device("cpu"))
    clock.events = True  # as on CUDA
    got = []
    a, b, c = FakeEvent(0.0), FakeEvent(0.25), FakeEvent(1.0)
    a.done = True
    clock.span(a, b, got.append)
    assert got == []  # b still running: nothing read
    b.done = True
    clock.span(b, c, got.append)
    assert got == [0.25]  # settled on the next span, c still pending
    clock.settle(wait=True)
    assert got == [0.25, 0.75] and c.synced


def test_cpu_intervals_are_immediate_and_the_engine_accounts_every_phase(varied_target):
    clock = RoundClock(torch.device("cpu"))
    got = []
    clock.span(1.0, 3.5, got.append)
    assert got == [2.5]
    prop = make_proposer(make_drafter(varied_target, block_size=3))
    eng = Engine(varied_target, prop, params=SamplingParams(0.0), scheduler="static", stop_token_ids=[])
    eng.add([[5, 17, 33, 9]], 12)
    while eng.active:
        eng.step()
    eng.settle_timings()
    assert all(eng.time_s[k] > 0 for k in ("prefill", "draft", "schedule", "verify", "accept"))
