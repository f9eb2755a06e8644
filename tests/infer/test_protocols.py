"""The interfaces the engine drives are complete and every built-in part satisfies them.

Every registered verifier and proposer, and both acceptance modes, pass ``isinstance`` against their protocol
(infer/protocols.py); every registered scheduler is a subclass of the ``Scheduler`` base class and passes
``testing.check_scheduler``. Every attribute the engine and ``decode()`` take of a part is declared by that part's
protocols (or, for the scheduler, its base class), read both from the source (attribute accesses on ``scheduler`` /
``verifier`` / ``proposer`` / ``acceptance``) and from a decode whose parts are wrapped to record each attribute they
are asked for.
"""

import ast
from pathlib import Path

import pytest
import torch
from infer_helpers import make_drafter

import dspark_lightning.infer as infer
from dspark_lightning import create, names
from dspark_lightning.checks import UsageError
from dspark_lightning.infer import (
    HardwareProfile,
    SamplingParams,
    Scheduler,
    SPSTable,
    StatelessProposer,
    build_scheduler,
    decode,
    make_proposer,
)
from dspark_lightning.infer.acceptance.accept import RejectionAcceptance
from dspark_lightning.infer.acceptance.coupled import CoupledAcceptance
from dspark_lightning.infer.protocols import (
    AcceptanceMode,
    KernelChoice,
    ModeConfidence,
    Proposer,
    ReducedVocabulary,
    Verifier,
    members,
)
from dspark_lightning.infer.schedule.draft_cost import DraftCost
from dspark_lightning.infer.schedule.schedulers import HOOKS, FunctionScheduler
from dspark_lightning.testing import check_scheduler

SPS = SPSTable.from_points({1: 30.0, 4: 28.0, 16: 20.0, 64: 8.0})
HARDWARE_AWARE = {"hardware_aware", "async_hardware_aware", "auto"}

# the part each name stands for in the engine's code -> the protocols that declare what may be taken of it
ROLES = {
    "scheduler": (Scheduler,),
    "verifier": (Verifier, KernelChoice),
    "proposer": (Proposer, ReducedVocabulary),
    "acceptance": (AcceptanceMode, ModeConfidence),
}
# the code that drives the parts
DRIVERS = ("engine.py", "decode.py", "build.py", "propose/backlog.py", "profiling/measure_hardware.py")


def scheduler_members() -> set[str]:
    """What the Scheduler base class declares: ``__call__``, its hooks and what they read."""
    return {n for n in vars(Scheduler) if not n.startswith("_")} | {"__call__"}


def declared(role: str) -> set[str]:
    if role == "scheduler":
        return scheduler_members()
    return set().union(*(members(p) for p in ROLES[role]))


@pytest.mark.parametrize("name", sorted(names("scheduler")))
def test_every_registered_scheduler_passes_the_conformance_check(name):
    assert isinstance(create("scheduler", name), Scheduler)
    check_scheduler(name)
    assert HARDWARE_AWARE <= set(names("scheduler"))


def test_a_hardware_aware_scheduler_asks_for_what_it_lacks():
    s = create("scheduler", "hardware_aware")
    assert s.needs_hardware() == {"sps", "draft_cost"}
    assert create("scheduler", "hardware_aware", sps=SPS).needs_hardware() == {"draft_cost"}
    assert create("scheduler", "hardware_aware", sps=SPS, draft_cost=0.01).needs_hardware() == frozenset()
    assert create("scheduler", "auto", timing="live").needs_hardware() == {"sps"}
    s.use_hardware(HardwareProfile(sps=SPS, draft_cost=DraftCost([1, 8], [0.01, 0.05])))
    assert s.needs_hardware() == frozenset() and s.sps is SPS
    assert create("scheduler", "static").needs_hardware() == frozenset()


class _TooLong(Scheduler):
    def __call__(self, conf):
        return torch.full((conf.shape[0],), conf.shape[1] + 1, dtype=torch.long)


class _Floats(Scheduler):
    def __call__(self, conf):
        return conf.sum(-1)


class _Peeking(Scheduler):
    """Lengths from a random draw: two fresh instances disagree."""

    def __call__(self, conf):
        return torch.randint(0, conf.shape[1] + 1, (conf.shape[0],))


class _NeedsTheMoon(Scheduler):
    reads_hardware = frozenset({"moon"})


@pytest.mark.parametrize(("broken", "says"), [(_TooLong, "outside [0"), (_Floats, "integers"),
                                              (_Peeking, "disagree"), (_NeedsTheMoon, "parts a profile")])  # fmt: skip
def test_the_conformance_check_catches_a_broken_scheduler(broken, says):
    with pytest.raises(AssertionError, match=says.replace("[", r"\[")):
        check_scheduler(broken)


def test_a_function_is_a_scheduler_and_a_hooked_object_must_subclass():
    wrapped = build_scheduler(lambda conf: torch.zeros(conf.shape[0], dtype=torch.long))
    assert isinstance(wrapped, FunctionScheduler) and wrapped.wants_draft(3)
    assert wrapped(torch.rand(2, 4)).tolist() == [0, 0]

    class DuckTyped:
        def __call__(self, conf):
            return torch.zeros(conf.shape[0], dtype=torch.long)

        def wants_draft(self, R):
            return False

    with pytest.raises(UsageError, match="wants_draft.*subclass"):
        build_scheduler(DuckTyped())
    assert set(HOOKS) <= scheduler_members()


def test_every_registered_verifier_is_a_verifier(varied_target):
    for name in names("verifier"):
        assert isinstance(create("verifier", name, varied_target), Verifier), name


def test_every_registered_proposer_is_a_proposer(varied_target):
    for name in names("drafter"):
        p = make_proposer(make_drafter(varied_target, name=name, block_size=3))
        assert isinstance(p, Proposer) and isinstance(p, ReducedVocabulary), name
    assert isinstance(type("Lookup", (StatelessProposer,), {"block_size": 3})(), Proposer)  # a third-party one


def test_every_registered_acceptance_mode_is_an_acceptance_mode():
    from dspark_lightning.registry import create, names

    for mode in (RejectionAcceptance(SamplingParams(1.0), torch.device("cpu")),
                 CoupledAcceptance(SamplingParams(1.0), torch.device("cpu"))):  # fmt: skip
        assert isinstance(mode, AcceptanceMode)
    for name in names("acceptance"):  # a plugin's too: the factory builds one at T = 0 and T = 1
        for T in (0.0, 1.0):
            assert isinstance(create("acceptance", name, SamplingParams(T), torch.device("cpu"), None), AcceptanceMode)


def test_the_protocols_are_public_and_name_their_members():
    assert infer.Verifier is Verifier and infer.Proposer is Proposer
    assert members(Verifier) == {"device", "batching", "prefill", "forward", "logits", "commit", "remove"}
    assert members(Proposer) == {"block_size", "add", "remove", "extend", "propose"}
    assert scheduler_members() == {"__call__", "reset", "reads_hardware", "needs_hardware", "use_hardware",
                                   "wants_draft", "observe_step", "observe_draft_time", "observe_rounds"}  # fmt: skip


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
    assert {"wants_draft", "observe_step", "observe_draft_time", "observe_rounds", "__call__"} <= seen["scheduler"]


def record_scheduler(scheduler: Scheduler, seen: set[str]) -> Scheduler:
    """``scheduler``, now an instance of a subclass of its class whose ``__call__`` and hooks record their names."""
    cls = type(scheduler)

    def recording(name: str):
        def method(self, *args, **kwargs):
            seen.add(name)
            return getattr(cls, name)(self, *args, **kwargs)

        return method

    names_ = (*HOOKS, "needs_hardware", "__call__")
    scheduler.__class__ = type(f"Recorded{cls.__name__}", (cls,), {n: recording(n) for n in names_})
    return scheduler


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
    import dspark_lightning.infer.profiling.measure_hardware as hardware

    seen: dict[str, set[str]] = {role: set() for role in ROLES}
    real = (build.make_proposer, engine.build_verifier, engine.acceptance_mode)
    monkeypatch.setattr(hardware, "load_or_profile_draft_cost", lambda *a, **k: DraftCost([1, 8], [0.01, 0.05]))
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
        scheduler = record_scheduler(create("scheduler", "hardware_aware", sps=SPS), seen["scheduler"])
        got = decode(varied_target, drafter, prompts, scheduler=scheduler, **kw)
    want = decode(
        varied_target, drafter, prompts, scheduler={"class_path": "hardware_aware", "init_args": {"sps": SPS}}, **kw
    )
    assert got.token_ids == want.token_ids and got.log.ell == want.log.ell  # the recorders change nothing
    for role, attrs in seen.items():
        assert attrs <= declared(role), f"decode() took {sorted(attrs - declared(role))} of its {role}"
    assert {"add", "extend", "propose", "remove", "block_size"} <= seen["proposer"]
    assert seen["verifier"] == members(Verifier) | members(KernelChoice)
    assert seen["acceptance"] == members(AcceptanceMode) | members(ModeConfidence)  # the optional one is asked for
    assert {"__call__", "needs_hardware", "use_hardware", "wants_draft", "observe_step"} <= seen["scheduler"]
