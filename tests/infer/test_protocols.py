"""The interfaces the engine drives (infer/protocols.py) are complete and every built-in part satisfies them.

Every registered scheduler, verifier and proposer, and both acceptance modes, pass ``isinstance`` against their
protocol; every attribute the engine and ``decode()`` take of a part is declared by that part's protocols, read
both from the source (attribute accesses on ``scheduler`` / ``verifier`` / ``proposer`` / ``acceptance``) and from a
decode whose parts are wrapped to record each attribute they are asked for.
"""

import ast
from pathlib import Path

import pytest
import torch
from infer_helpers import make_drafter

import dspark_lightning.infer as infer
from dspark_lightning import create, names
from dspark_lightning.infer import SamplingParams, SPSTable, StatelessProposer, decode, make_proposer
from dspark_lightning.infer.acceptance.accept import RejectionAcceptance
from dspark_lightning.infer.acceptance.coupled import CoupledAcceptance
from dspark_lightning.infer.protocols import (
    SCHEDULER_HOOKS,
    AcceptanceMode,
    AdaptiveScheduler,
    Proposer,
    ReducedVocabulary,
    Scheduler,
    SPSDriven,
    Verifier,
    members,
)
from dspark_lightning.infer.schedule.draft_cost import DraftCost

SPS = SPSTable.from_points({1: 30.0, 4: 28.0, 16: 20.0, 64: 8.0})
HARDWARE_AWARE = {"hardware_aware", "async_hardware_aware", "auto"}

# the part each name stands for in the engine's code -> the protocols that declare what may be taken of it
ROLES = {
    "scheduler": (Scheduler, *SCHEDULER_HOOKS),
    "verifier": (Verifier,),
    "proposer": (Proposer, ReducedVocabulary),
    "acceptance": (AcceptanceMode,),
}
DRIVERS = ("engine.py", "decode.py", "build.py", "propose/backlog.py")  # the code that drives the parts


def declared(role: str) -> set[str]:
    return set().union(*(members(p) for p in ROLES[role]))


def test_every_registered_scheduler_is_a_scheduler():
    for name in names("scheduler"):
        s = create("scheduler", name, **({"sps": SPS} if name in HARDWARE_AWARE else {}))
        assert isinstance(s, Scheduler), name
        if name in HARDWARE_AWARE:
            assert isinstance(s, AdaptiveScheduler), name
    assert HARDWARE_AWARE <= set(names("scheduler"))


def test_every_registered_verifier_is_a_verifier(varied_target):
    for name in names("verifier"):
        assert isinstance(create("verifier", name, varied_target), Verifier), name


def test_every_registered_proposer_is_a_proposer(varied_target):
    for name in names("drafter"):
        p = make_proposer(make_drafter(varied_target, name=name, block_size=3))
        assert isinstance(p, Proposer) and isinstance(p, ReducedVocabulary), name
    assert isinstance(type("Lookup", (StatelessProposer,), {"block_size": 3})(), Proposer)  # a third-party one


def test_both_acceptance_modes_are_acceptance_modes():
    for mode in (RejectionAcceptance(SamplingParams(1.0), torch.device("cpu")),
                 CoupledAcceptance(SamplingParams(1.0), torch.device("cpu"))):  # fmt: skip
        assert isinstance(mode, AcceptanceMode)


def test_the_protocols_are_public_and_name_their_members():
    assert infer.Scheduler is Scheduler and infer.Verifier is Verifier and infer.Proposer is Proposer
    assert members(Scheduler) == {"__call__"}
    assert members(Verifier) == {"device", "prefill", "forward", "logits", "commit", "remove"}
    assert members(Proposer) == {"block_size", "add", "remove", "extend", "propose"}
    assert members(SPSDriven) == {"bind", "needs_draft_cost", "use_draft_cost"}
    assert members(AdaptiveScheduler) == {"__call__", "reset", "wants_draft", "observe_step", "observe_draft_time",
                                          "bind", "needs_draft_cost", "use_draft_cost"}  # fmt: skip


def accessed_in_source() -> dict[str, set[str]]:
    """Role -> attributes the driving code takes of it (``x.scheduler.bind``, ``proposer.extend``,
    ``self.scheduler(...)``)."""
    out: dict[str, set[str]] = {role: set() for role in ROLES}
    root = Path(infer.__file__).parent

    def role_of(node) -> str | None:
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        return name if name in ROLES else None

    for file in DRIVERS:
        for node in ast.walk(ast.parse((root / file).read_text())):
            if isinstance(node, ast.Attribute) and role_of(node.value):
                out[role_of(node.value)].add(node.attr)
            elif isinstance(node, ast.Call) and role_of(node.func) and isinstance(node.func, ast.Attribute):
                out[role_of(node.func)].add("__call__")
    return out


def test_the_source_takes_only_declared_attributes():
    seen = accessed_in_source()
    for role, attrs in seen.items():
        assert attrs, f"no access to the {role} found: the reading of the source is broken"
        assert attrs <= declared(role), f"the engine takes {sorted(attrs - declared(role))} of its {role}"
    assert {"wants_draft", "observe_step", "observe_draft_time", "__call__"} <= seen["scheduler"]


class Recorder:
    """Forwards everything to ``inner`` and records the name of every attribute asked for."""

    def __init__(self, inner, seen: set[str]) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name: str):
        self._seen.add(name)
        return getattr(self._inner, name)

    def __call__(self, *args, **kwargs):
        self._seen.add("__call__")
        return self._inner(*args, **kwargs)


@pytest.mark.filterwarnings("ignore:.*uncalibrated confidences")
@pytest.mark.parametrize("acceptance", ["rejection", "coupled"])
def test_a_decode_takes_only_declared_attributes(varied_target, monkeypatch, acceptance):
    import dspark_lightning.infer.build as build
    import dspark_lightning.infer.engine as engine
    import dspark_lightning.profiling.draft_cost as draft_cost

    seen: dict[str, set[str]] = {role: set() for role in ROLES}
    real = (build.make_proposer, engine.build_verifier, engine.acceptance_mode)
    monkeypatch.setattr(draft_cost, "load_or_profile_draft_cost", lambda *a, **k: DraftCost([1, 8], [0.01, 0.05]))
    torch.manual_seed(0)
    drafter = make_drafter(varied_target, block_size=3, draft_vocab_size=64)
    drafter.set_draft_vocab(torch.arange(64) * 4)
    prompts = [[5, 17, 33, 9, 41], [7, 2, 99, 14, 3, 60, 21, 8], [11, 4]]
    kw = {"max_new_tokens": 16, "temperature": 1.0, "seed": 2, "stop_token_ids": [], "acceptance": acceptance,
          "batch_size": 2}  # fmt: skip
    with monkeypatch.context() as m:
        m.setattr(build, "make_proposer", lambda *a, **k: Recorder(real[0](*a, **k), seen["proposer"]))
        m.setattr(engine, "build_verifier", lambda *a, **k: Recorder(real[1](*a, **k), seen["verifier"]))
        m.setattr(engine, "acceptance_mode", lambda *a, **k: Recorder(real[2](*a, **k), seen["acceptance"]))
        scheduler = Recorder(create("scheduler", "hardware_aware", sps=SPS), seen["scheduler"])
        got = decode(varied_target, drafter, prompts, scheduler=scheduler, **kw)
    want = decode(varied_target, drafter, prompts, scheduler={"name": "hardware_aware", "sps": SPS}, **kw)
    assert got.token_ids == want.token_ids and got.log.ell == want.log.ell  # the recorders change nothing
    for role, attrs in seen.items():
        assert attrs <= declared(role), f"decode() took {sorted(attrs - declared(role))} of its {role}"
    assert {"add", "extend", "propose", "remove", "block_size"} <= seen["proposer"]
    assert seen["verifier"] == members(Verifier)
    assert seen["acceptance"] == members(AcceptanceMode)
    assert {"__call__", "bind", "use_draft_cost", "wants_draft", "observe_step"} <= seen["scheduler"]
