"""check_prompt_source: the built-in prompt sources pass it, and it names what a broken source gets wrong."""

from __future__ import annotations

import itertools
import json

import pytest

from dspark_lightning.data.prompts.sources import PromptRecord, PromptSource
from dspark_lightning.registry import get, names
from dspark_lightning.testing import check_prompt_source

BUILTIN = sorted(
    n for n in names("prompt_source") if get("prompt_source", n).__module__.startswith("dspark_lightning.")
)
FILE_SOURCES = ("jsonl", "conversations")  # sources over a user's file: built with path=


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_sources_pass(name, tmp_path):
    kwargs = {}
    if name in FILE_SOURCES:
        path = tmp_path / "prompts.jsonl"
        path.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("hello", "what is 2+2?", "bye now")))
        kwargs["path"] = path
    check_prompt_source(name, **kwargs)


class _Drifting(PromptSource):
    """Ids from a process-wide counter: a second build yields other ids."""

    counter = itertools.count()

    def records(self):
        while True:
            yield PromptRecord(f"drifting/{next(self.counter)}", "chat", self.name, ["hello"])


class _Repeating(PromptSource):
    def records(self):
        for _ in range(3):
            yield PromptRecord("repeating/0", "chat", self.name, ["hello"])


class _Unlimited(PromptSource):
    def __iter__(self):  # ignores limit
        return iter([PromptRecord(f"unlimited/{i}", "chat", self.name, ["hello"]) for i in range(10)])


class _NotASource:
    def __init__(self, *, limit=None):
        self.limit = limit

    def __iter__(self):
        return iter([PromptRecord("plain/0", "chat", "plain", ["hello"])])


@pytest.mark.parametrize(
    "cls, match",
    [
        (_Drifting, "a second build yields other prompts"),
        (_Repeating, "duplicate ids"),
        (_Unlimited, "10 prompts with limit=4"),
        (_NotASource, "subclasses"),
    ],
)
def test_broken_sources_fail_naming_the_fault(cls, match):
    with pytest.raises(AssertionError, match=match):
        check_prompt_source(cls)
