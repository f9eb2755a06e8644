"""Bad arguments at the Python API, by class: every argument of ``decode()``, the schedulers, the SPS table,
``regenerate()`` and the recipe checks, given values of the wrong type or out of range (a seeded draw of each
argument's bad values, all of them with ``DSPARK_FUZZ_N=0``), raise one-line ``ValueError``s before any work
starts (no prefill), never another exception, a hang or a silent result. ``api_cases()`` is also run by
``scripts/fuzz_report.py --classes``."""

from __future__ import annotations

import math
import os
import random

import pytest

SEED = int(os.environ.get("DSPARK_FUZZ_SEED", "20"))
PER_CLASS = int(os.environ.get("DSPARK_FUZZ_N", "3"))
NAN, INF = math.nan, math.inf

DECODE_BAD = {  # decode() keyword -> values it must refuse
    "max_new_tokens": [0, -1, 1.5, "4", True, NAN, None, 10**9],
    "temperature": [-1, NAN, INF, "0", True, [0.5], None],
    "top_k": [0, -1, 1.5, True, "3"],
    "top_p": [0, 1.5, NAN, "0.5", True, -INF],
    "batch_size": [0, -1, 2.5, True, "2"],
    "seed": [1.5, "0", None, True, [1]],
    "seeds": [[1.5], ["a"], [True], [0, 1], 3],
    "stop": [3, [3], [""], "", [None], {"a": 1}],
    "stop_token_ids": [3, [-1], [10**9], [1.5], "x", [True]],
    "batching": ["nope", 3, None],
    "verifier": ["nope", 3],
    "acceptance": ["nope", 3],
    "scheduler": [
        "nope",
        3,
        {"class_path": "threshold", "init_args": {"threshold": 2.0}},
        {"class_path": "static", "init_args": {"gamma": -1}},
        {"class_path": "static", "init_args": {"gamma": 1.5}},
        {"class_path": "threshold", "init_args": {"threshold": NAN}},
        {"class_path": "threshold", "init_args": {"threshold": None}},
        {"class_path": "static", "init_args": {"gama": 3}},
        {},
    ],  # fmt: skip
    "device": ["nope", 3],
    "dtype": ["nope"],
}
PROMPTS_BAD = [3.5, None, [], [1.5], [True], [-1], [10**9], [{"role": 1, "content": "x"}], [{"content": "x"}],
               [{"role": "user", "content": None}], [{"role": "user", "content": 3}], "\ud800", ["ok", 3],
               b"bytes", {"a": 1}, "z" * 9000]  # fmt: skip
SCHEDULER_BAD = {"static": {"gamma": [-1, 1.5, True, "3"]},  # threshold=None: see decode's scheduler specs
                 "threshold": {"threshold": [NAN, 2.0, -1.0, "0.5", INF], "mode": ["nope", 3]}}  # fmt: skip
SPS_BAD = [([], []), ([1, 2], [1.0]), ([0], [1.0]), ([-1], [1.0]), ([1.5], [1.0]), ([True], [1.0]), ([2, 1], [1, 1]),
           ([1], [0.0]), ([1], [-3.0]), ([1], [NAN]), ([1], [INF]), ("1", [1.0]), ([1, 1], [1.0, 1.0])]  # fmt: skip
REGEN_BAD = {"max_new_tokens": [0, -3, 2048, 10**6, None, 2.5], "batch_size": [0, -1, None],
             "temperature": [-1.0, None], "top_p": [0.0, 1.5, None, NAN], "top_k": [0, 1.5], "backend": ["nope"],
             "concurrency": [0, None], "max_turns": [0, "2"]}  # fmt: skip


def api_cases(seed: int = SEED) -> list[tuple[str, str, dict]]:
    """(class, id, spec) of every API case; spec: {"call": ..., "kw"/"args": ...}."""
    out = [("api-decode", f"decode-{k}={v!r:.90}", {"call": "decode", "kw": {k: v}}) for k, vs in DECODE_BAD.items()
           for v in vs]  # fmt: skip
    out += [("api-decode", f"decode-prompt={p!r:.40}", {"call": "decode", "prompts": p}) for p in PROMPTS_BAD]
    out += [("api-scheduler", f"{n}-{k}={v!r:.30}", {"call": "scheduler", "name": n, "kw": {k: v}})
            for n, kws in SCHEDULER_BAD.items() for k, vs in kws.items() for v in vs]  # fmt: skip
    out += [("api-sps", f"sps-{t!r:.20}-{s!r:.20}", {"call": "sps", "args": (t, s)}) for t, s in SPS_BAD]
    out += [("api-regenerate", f"regenerate-{k}={v!r:.30}", {"call": "regenerate", "kw": {k: v}})
            for k, vs in REGEN_BAD.items() for v in vs]  # fmt: skip
    return out


class NoWork(AssertionError):
    pass


def run_api_case(spec: dict, target, tmp_path) -> BaseException | None:
    """Call the API as ``spec`` says with a prefill that fails the case (no work may start); return what it
    raised (None: it returned)."""
    from dspark_lightning import create
    from dspark_lightning.data.prompts.sources import PromptRecord
    from dspark_lightning.data.regen.regenerate import regenerate
    from dspark_lightning.infer import SPSTable, decode
    from dspark_lightning.infer.engine import Engine

    real_add = Engine.add
    Engine.add = lambda *a, **k: (_ for _ in ()).throw(NoWork("the engine started before the input was checked"))
    try:
        call = spec["call"]
        if call == "decode":
            decode(target, None, spec.get("prompts", "hi"), **{"max_new_tokens": 2, **spec.get("kw", {})})
        elif call == "scheduler":
            create("scheduler", spec["name"], **spec["kw"])
        elif call == "sps":
            SPSTable(*spec["args"])
        elif call == "regenerate":
            rec = PromptRecord("p/1", "chat", "t", ["hi"])
            regenerate(target, [rec], tmp_path / "r.jsonl", progress=False, **spec["kw"])
    except BaseException as exc:  # noqa: BLE001 - what it raised is the result
        return exc
    finally:
        Engine.add = real_add
    return None


def api_outcome(exc: BaseException | None) -> str:
    """``clean``: a one-line ValueError (a RegistryError, the project's KeyError for an unknown name that lists the
    registered ones, counts too); ``silent``: no error; ``unclear``: refused only once work had started; else
    ``traceback`` (an internal exception leaks)."""
    from dspark_lightning.registry import RegistryError

    if exc is None:
        return "silent"
    if isinstance(exc, NoWork):
        return "unclear"
    if isinstance(exc, ValueError | RegistryError) and "\n" not in str(exc) and str(exc).strip():
        return "clean"
    return "traceback"


def _sample() -> list[tuple[str, str, dict]]:
    cases, rng = api_cases(), random.Random(SEED + 2)
    if PER_CLASS <= 0:
        return cases
    by: dict[str, list] = {}
    for c in cases:
        by.setdefault(c[0], []).append(c)
    return [c for group in by.values() for c in rng.sample(group, min(len(group), 3 * PER_CLASS))]


SAMPLE = _sample()


@pytest.mark.parametrize("case", SAMPLE, ids=[c[1] for c in SAMPLE])
def test_the_api_refuses_in_one_line_before_work(case, tiny_target, tmp_path):
    exc = run_api_case(case[2], tiny_target, tmp_path)
    assert api_outcome(exc) == "clean", f"{case[1]}: {type(exc).__name__}: {exc}"
    assert not (tmp_path / "r.jsonl").exists()


def test_the_api_case_ids_are_unique():
    cases = api_cases()
    assert len({c[1] for c in cases}) == len(cases)


def test_recipe_checks_refuse_every_bad_trainer_value():
    """recipe_checks.trainer_args: each bad value of each option alone, the good ones of a recipe accepted."""
    from dspark_lightning.lightning import recipe_checks

    from .test_fuzz_classes import TRAINER

    good = {"max_steps": 8, "val_check_interval": 4, "check_val_every_n_epoch": None, "log_every_n_steps": 2,
            "devices": 1, "accumulate_grad_batches": 1, "max_epochs": -1, "limit_val_batches": 0.5}  # fmt: skip
    recipe_checks.trainer_args(good)
    recipe_checks.trainer_args({"devices": "auto", "val_check_interval": 1.0, "max_steps": -1})
    import yaml

    for key, values in TRAINER.items():
        for raw in values:
            with pytest.raises(ValueError, match=f"trainer.{key}") as e:
                recipe_checks.trainer_args({**good, key: yaml.safe_load(raw)})
            assert "\n" not in str(e.value)


def test_yaml_structure_is_bounded_in_time_and_depth():
    """A recursive alias, an alias bomb and deep nesting are refused from the event stream in well under a second;
    a tree-shaped recipe with shared aliases passes."""
    import time

    from dspark_lightning import checks
    from dspark_lightning.cli.main import yaml_structure

    from .test_fuzz_classes import _recipes

    rng = random.Random(SEED)
    for label, text in _recipes(rng).items():
        t0 = time.perf_counter()
        with pytest.raises(checks.UsageError):
            yaml_structure(label, text)
        assert time.perf_counter() - t0 < 2.0, label
    yaml_structure("ok", "a: &x {lr: 1}\nb: *x\nc: [*x, *x]\n")
    yaml_structure("not yaml", "a: [unclosed\n")  # left to the real parser, which names the line
