"""The front door and the reference pages name only things that exist.

README.md, CONTRIBUTING.md and docs/*.md: every markdown link resolves (relative to its page), every repository path
they name (``docs/...``, ``benchmarks/...``, ``recipes/...``, ``scripts/...``, ``tests/...``, ``plugins/...``,
``dspark_lightning/...``, in prose, inline code or code blocks) exists, and every ``make <target>`` in their code
exists in the Makefile or in benchmarks/Makefile (which the Makefile includes). A reference page stays a reference
page: no docs/*.md is longer than 450 lines (the experiment logs live in benchmarks/results/). The experiment logs,
CHANGELOG.md and benchmarks/README.md name outputs of runs not made yet, so only their links are checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONT = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "benchmarks" / "results"
LOGS = [ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md", *sorted(RESULTS.glob("*.md"))]
MAX_LINES = 450

LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
# a repository path: one of the top-level folders, not inside a longer path or a URL; it ends on a word char or "/"
TOP = "benchmarks|docs|recipes|scripts|tests|plugins|dspark_lightning|\\.ci"
PATH = re.compile(rf"(?<![\w./$~-])((?:{TOP})/[\w./-]*[\w/])")
PLACEHOLDER = re.compile(r"\.?[*{<$\[]|\.\.\.")  # right after a path: a glob, brace list, <placeholder> or $VAR
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"`([^`]+)`")  # a span may wrap onto the next line of its paragraph
MAKE = re.compile(r"(?<![\w/.-])make[ \t]+([^\n`]*)")
TARGET = re.compile(r"[a-z][a-z0-9-]*")
RULE = re.compile(r"^([A-Za-z0-9][\w.-]*(?:[ \t]+[A-Za-z0-9][\w.-]*)*)[ \t]*:(?!=)", re.M)


def make_targets(root: Path = ROOT) -> set[str]:
    """The rules of the Makefile and of benchmarks/Makefile (the Makefile includes it)."""
    targets: set[str] = set()
    for makefile in (root / "Makefile", root / "benchmarks" / "Makefile"):
        for m in RULE.finditer(makefile.read_text()):
            targets.update(name for name in m.group(1).split() if not name.startswith("."))
    return targets


def code_text(text: str) -> str:
    """Inline code spans, fenced blocks and indented (4+ spaces) code lines of a markdown text."""
    fenced = FENCE.findall(text)
    lines = FENCE.sub("", text).splitlines()
    indented = [line for line in lines if line.startswith(("    ", "\t"))]
    prose = "\n".join(line for line in lines if not line.startswith(("    ", "\t")))
    return "\n".join([*fenced, *indented, *SPAN.findall(prose)])


def link_problems(page: Path) -> list[str]:
    problems = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # http(s), mailto, an anchor here
            continue
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            problems.append(f"{page.name}: link ({target}) does not resolve")
    return problems


def path_problems(page: Path, root: Path = ROOT) -> list[str]:
    text = page.read_text()
    problems = []
    for m in PATH.finditer(text):
        if PLACEHOLDER.match(text, m.end()):
            continue
        if not (root / m.group(1)).exists():
            problems.append(f"{page.name}: {m.group(1)} does not exist")
    return problems


def make_problems(page: Path, targets: set[str]) -> list[str]:
    problems = []
    for m in MAKE.finditer(code_text(page.read_text())):
        for token in m.group(1).split():
            if token.startswith("-") or "=" in token:  # flags (make -n TARGET) and variables (LONG=DIR)
                continue
            if not TARGET.fullmatch(token):  # a comment, a placeholder, the end of the command
                break
            if token not in targets:
                problems.append(f"{page.name}: make {token}: no such target")
    return problems


def test_the_makefile_includes_the_benchmarks():
    assert "include benchmarks/Makefile" in (ROOT / "Makefile").read_text()
    assert {"run", "test", "setup", "cpu-speed", "llamacpp"} <= make_targets()


@pytest.mark.parametrize("page", FRONT, ids=lambda p: str(p.relative_to(ROOT)))
def test_front_pages_name_only_paths_and_targets_that_exist(page):
    targets = make_targets()
    assert not link_problems(page) + path_problems(page) + make_problems(page, targets)


@pytest.mark.parametrize("page", LOGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_logs_and_changelog_links_resolve(page):
    assert not link_problems(page)


def test_docs_pages_stay_short():
    long_pages = {p.name: n for p in (ROOT / "docs").glob("*.md") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long_pages


def test_docs_keep_reference_pages_and_one_results_page():
    names = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert "results.md" in names and not names & {"matrix.md", "benchmarks.md", "changelog.md"}
    assert not (ROOT / "docs" / "data").exists() and not (ROOT / "docs" / "img").exists()
    assert (ROOT / "CHANGELOG.md").is_file() and (RESULTS / "results_log.md").is_file()


def test_the_checks_find_what_is_missing(tmp_path):
    """The checks can fail: a page naming a missing file, link and make target is reported on each count."""
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text(
        "See [there](there.md), [gone](gone.md#part), [web](https://example.org/docs/x.md) and [here](#top).\n"
        "The data is in `benchmarks/results/data/no_such_experiment/`, made by `benchmarks/no_such_script.py`;\n"
        "the recipe recipes/smollm2_dspark.yaml exists, `recipes/compare/*.yaml` and `docs/<page>.md` are patterns.\n"
        "Run `make run`, `make -n cpu-speed`, `make acceptance LONG=DIR` and `make no-such-target`;\n"
        "make sure prose is not a command.\n\n"
        "    make compare eval-compare missing-too   # the comparison\n"
    )
    assert link_problems(page) == ["page.md: link (gone.md#part) does not resolve"]
    assert path_problems(page) == [
        "page.md: benchmarks/results/data/no_such_experiment/ does not exist",
        "page.md: benchmarks/no_such_script.py does not exist",
    ]
    assert sorted(make_problems(page, make_targets())) == [
        "page.md: make missing-too: no such target",
        "page.md: make no-such-target: no such target",
    ]
