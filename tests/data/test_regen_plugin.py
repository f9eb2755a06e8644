"""A regeneration backend a plugin adds with settings of its own: registered from this test without touching the
package, then set the same way from Python, a recipe and the command line (``{class_path: name, init_args: {...}}``),
its settings checked by its constructor, recorded in every row and in the data fingerprint."""

from __future__ import annotations

import json

import pytest
import yaml
from test_prepare import DATA, TINY, cli

from dspark_lightning.checks import UsageError
from dspark_lightning.data.prepare import DataPaths
from dspark_lightning.data.prompts.sources import PromptRecord
from dspark_lightning.data.regen.backend import TurnByTurnBackend
from dspark_lightning.data.regen.regenerate import load_conversations, regenerate
from dspark_lightning.testing import check_regen_backend, random_target


class Echo(TurnByTurnBackend):
    """Answers ``word`` ``repeat`` times and the turn's seed (deterministic per conversation and turn)."""

    transient = ("patience",)

    def __init__(self, word: str = "echo", repeat: int = 1, patience: float = 1.0) -> None:
        if repeat < 1:
            raise UsageError(f"regen_backend echo: repeat must be >= 1, got {repeat}")
        self.word, self.repeat, self.patience = word, repeat, patience

    def sample(self, prompts, seeds, budgets):
        return [(" ".join([self.word] * self.repeat) + f" {s % 1000}", 3, True) for s in seeds]


def echo(**init_args):
    return {"class_path": "echo", "init_args": init_args}


def answers(path):
    return [m["content"] for row in load_conversations(path) for m in row["turns"] if m["role"] == "assistant"]


def test_python_sets_a_plugin_backends_settings(registered, tmp_path):
    registered("regen_backend", "echo")(Echo)
    check_regen_backend(echo(word="hey"))
    out = tmp_path / "r.jsonl"
    recs = [PromptRecord("a", "chat", "t", ["hi", "again"])]
    regenerate(random_target(), recs, out, backend=echo(word="hey", repeat=2), progress=False, max_new_tokens=4)
    (row,) = load_conversations(out)
    assert [a.split()[:2] for a in answers(out)] == [["hey", "hey"]] * 2
    assert (row["gen"]["backend"], row["gen"]["word"], row["gen"]["repeat"]) == ("echo", "hey", 2)
    assert "patience" not in row["gen"]  # transient: never changes the answers
    with pytest.raises(ValueError, match="different settings"):  # a resume with another word refuses
        regenerate(random_target(), recs, out, backend=echo(word="ho"), progress=False, max_new_tokens=4)
    for bad, fact in ((echo(repeat=0), "repeat must be >= 1"), (echo(colour=1), "takes no argument 'colour'"),
                      (echo(repeat="two"), "repeat must be an int")):  # fmt: skip
        with pytest.raises(UsageError, match=fact):
            regenerate(random_target(), recs, tmp_path / "bad.jsonl", backend=bad, progress=False)


def test_a_recipe_and_the_command_line_set_it_the_same_way(registered, tmp_path, capsys):
    registered("regen_backend", "echo")(Echo)
    recipe = yaml.safe_load(open(TINY))
    recipe["data"]["regen"] = {"backend": echo(word="yo", repeat=2), "max_new_tokens": 12, "max_turns": 1}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    regen = [a for a in DATA if not a.startswith("--data.regen=")]
    runs = {
        "recipe": ["--config", str(path), *regen],
        "cli": ["--config", TINY, *DATA, "--data.regen.backend={class_path: echo, init_args: {word: cli}}"],
    }
    prints = {}
    for name, args in runs.items():
        work = tmp_path / name
        code, _, err = cli(["prepare", *args, f"--data.work_dir={work}"], capsys)
        assert code == 0, err[-2000:]
        prints[name] = json.loads(DataPaths(work).prepared.read_text())["fingerprint"]
        said = answers(work / "responses_train.jsonl")
        assert said and all(a.startswith("yo yo " if name == "recipe" else "cli ") for a in said), said[:2]
    assert prints["recipe"] != prints["cli"]  # the backend's settings are part of what the data depends on
    code, _, err = cli(["prepare", "--config", TINY, *DATA, f"--data.work_dir={tmp_path / 'bad'}",
                        "--data.regen.backend={class_path: echo, init_args: {repeat: 0}}"], capsys)  # fmt: skip
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code == 2 and "repeat must be >= 1" in lines[-1], err[-2000:]
