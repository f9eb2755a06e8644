"""The Python API checks what the CLI checks: each class of bad input is refused up front in one line, and the
forms that mean one thing (a stop string) are taken for what they mean."""

import json
import math

import pytest
import torch
from infer_helpers import make_drafter

from dspark_lightning.infer import SPSTable, decode
from dspark_lightning.registry import build

PROMPT = [5, 17, 33, 9]


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


def test_a_stop_string_is_one_stop_string_not_its_characters(tiny_target):
    whole = decode(tiny_target, None, ["hello"], max_new_tokens=12)
    text = whole.texts[0]
    assert len(text) > 3
    cut = text[2:4]  # a two-character string that occurs in the output
    res = decode(tiny_target, None, ["hello"], max_new_tokens=12, stop=cut)
    assert res.texts[0] == text[: text.index(cut)]
    assert res.texts == decode(tiny_target, None, ["hello"], max_new_tokens=12, stop=[cut]).texts


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"stop": [""]}, "must not be empty"),
        ({"stop": [3]}, "stop must be a string or a list"),
        ({"stop_token_ids": 7}, "stop_token_ids must be a list"),
        ({"stop_token_ids": [10**9]}, "outside the vocabulary"),
        ({"stop_token_ids": [True]}, "outside the vocabulary"),
        ({"seeds": [1.5]}, "seeds must be ints"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 2.0}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_decode_refuses_each_class_in_one_line(varied_target, kwargs, match):
    with pytest.raises(ValueError, match=match) as exc:
        decode(varied_target, None, [PROMPT], max_new_tokens=kwargs.pop("max_new_tokens", 4), **kwargs)
    one_line(exc)


@pytest.mark.parametrize(
    "prompt", [[5.0, 17.0], [True, 3], torch.tensor([1.0, 2.0]), torch.tensor([True, False]), [10**9]]
)
def test_token_id_prompts_must_be_ints_in_the_vocabulary(varied_target, prompt):
    with pytest.raises(ValueError) as exc:
        decode(varied_target, None, [prompt], max_new_tokens=2)
    one_line(exc)


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"class_path": "threshold", "init_args": {"threshold": 5}}, "threshold"),
        ({"class_path": "threshold", "init_args": {"threshold": -2}}, "threshold"),
        ({"class_path": "threshold", "init_args": {"threshold": math.nan}}, "threshold"),
        ({"class_path": "static", "init_args": {"gamma": -1}}, "gamma"),
        ({"class_path": "static", "init_args": {"gamma": 2.5}}, "gamma"),
        ({"class_path": "static", "init_args": {"gamma": True}}, "gamma"),
    ],
)
def test_scheduler_arguments_are_checked_at_the_api(spec, match):
    with pytest.raises(ValueError, match=match) as exc:
        build("scheduler", spec)
    one_line(exc)


@pytest.mark.parametrize(
    "tokens, sps",
    [
        ([1, 2], [10.0, -1.0]),
        ([1, 2], [10.0, math.nan]),
        ([1, 2], [10.0, math.inf]),
        ([1, 2], [10.0, 0.0]),
        ([1, 2.5], [10.0, 9.0]),
        ([True, 2], [10.0, 9.0]),
        ([2, 1], [10.0, 9.0]),
        ([0, 1], [10.0, 9.0]),
        ([1, 2], [10.0, "9"]),
    ],
)
def test_sps_tables_must_be_positive_finite_and_sorted(tmp_path, tokens, sps):
    with pytest.raises(ValueError) as exc:
        SPSTable(tokens=tokens, sps=sps)
    one_line(exc)
    path = tmp_path / "sps.json"
    path.write_text(json.dumps({"tokens": tokens, "sps": sps}))
    with pytest.raises(ValueError):
        SPSTable.load(path)


def test_sps_files_that_are_not_tables_are_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    wrong = tmp_path / "list.json"
    wrong.write_text("[1, 2]")
    for path in (deep, wrong, tmp_path):
        with pytest.raises(ValueError) as exc:
            SPSTable.load(path)
        one_line(exc)


def test_a_drafter_object_for_other_tapped_layers_is_refused(varied_target):
    import dataclasses

    from dspark_lightning.testing import random_target

    drafter = make_drafter(varied_target, block_size=3)
    drafter.geometry = dataclasses.replace(drafter.geometry, layer_ids=(1, 2, 3))  # trained on other taps
    with pytest.raises(ValueError, match="layers") as exc:
        decode(varied_target, drafter, [PROMPT], max_new_tokens=2)
    one_line(exc)
    wide = make_drafter(random_target(vocab=300, hidden=64, layers=4, init=0.3, seed=0), block_size=3)
    with pytest.raises(ValueError, match="vocab_size"):
        decode(varied_target, wide, [PROMPT], max_new_tokens=2)


@pytest.mark.parametrize(
    "prompt",
    [
        "bad \ud800 surrogate",
        [{"role": "user", "content": None}],
        [{"role": "user", "content": 5}],
        [{"content": "no role"}],
        [{"role": "user", "content": "ok"}, "not a turn"],
    ],
)
def test_malformed_text_and_turns_are_refused(tiny_target, prompt):
    with pytest.raises(ValueError) as exc:
        decode(tiny_target, None, [prompt], max_new_tokens=2)
    one_line(exc)
