"""Fixed-text sources (benchmarks/results/matrix.md, "fixed text"): prompts that carry their own responses.

A record with ``responses`` is not regenerated; at feature extraction the target *scores* the text, and its
logits on it are the labels (the L1/KL and argmax-CE terms; the CE on the data tokens should be off, since the
text is not the target's). Scoring costs one prefill (≈ 600 tok/s on two CPU cores) where regeneration costs a
decode step per token (≈ 130 tok/s), and the text can be as varied as the corpus it comes from.

Built in (see each class), all offline and deterministic for a given Python (no import of the modules they read):
``python_source`` (code; about 3600 stdlib functions on CPython 3.11), ``python_docs`` and ``package_docs`` (chat).

``limit`` takes a prefix of a fixed pseudo-random order (sha256 of the id and ``seed``), so a small limit is a varied
sample, not the first modules alphabetically.
"""

from __future__ import annotations

import ast
import functools
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dspark_lightning.registry import register

from ...checks import UsageError
from .sources import LICENSES, HumanEval, PromptRecord, PromptSource, _unit_interval

LICENSES.update(
    {
        "python_source": "the running Python's standard library source (PSF License), quoted verbatim.",
        "python_docs": "the running Python's pydoc_data.topics and module docstrings (PSF License), quoted.",
        "package_docs": "the installed distributions' own descriptions (each under its package's licence), quoted.",
    }
)
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "dist-packages"}


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts))


def _module_name(path: Path) -> str:
    rel = path.relative_to(Path(sysconfig.get_paths()["stdlib"])).with_suffix("")
    parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
    return ".".join(parts)


def _parse(path: Path) -> tuple[str, ast.Module] | None:
    try:
        text = path.read_text(encoding="utf-8")
        return text, ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


class _Shuffled(PromptSource):
    """A source whose records are ordered by sha256(seed, id), so ``limit`` takes a varied, stable prefix."""

    def all_records(self) -> Iterator[PromptRecord]:
        raise NotImplementedError

    def records(self) -> Iterator[PromptRecord]:
        recs = list(self.all_records())
        yield from sorted(recs, key=lambda r: _unit_interval(self.name, self.seed, r.id))


_MARKUP = re.compile(r"^\s*(\.\. (image|figure|raw)::|:(target|alt|width|height|align):|\[!\[|<(img|p|a|div|h\d)\b|</)")


_RULE = re.compile(r"^\s*[=\-~^*#]{3,}\s*$")  # a heading's underline or a rule: the paragraph is markup


def _prose(text: str) -> str:
    """Docs text as an answer reads: hard-wrapped paragraphs joined into lines (indented blocks, grammar and tables
    kept as they are), badge/image/HTML markup lines dropped."""
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        lines = [ln for ln in para.splitlines() if not _MARKUP.match(ln)]
        if not lines:
            continue
        verbatim = any(ln[:1] in " \t|+" or "::=" in ln or _RULE.match(ln) or ln[:2] in ("- ", "* ") for ln in lines)
        out.append("\n".join(lines) if verbatim else " ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


def _chunks(text: str, max_chars: int, min_chars: int) -> list[str]:
    """Paragraph-aligned pieces of at most ``max_chars`` (a longer paragraph is its own piece, cut), each at least
    ``min_chars``."""
    out, cur = [], ""
    for para in re.split(r"\n\s*\n", text.strip()):
        para = para.strip("\n")
        if cur and len(cur) + len(para) + 2 > max_chars:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para[:max_chars]
    if cur:
        out.append(cur)
    return [c.strip() for c in out if len(c.strip()) >= min_chars]


@register("prompt_source", "python_source")
class PythonSource(_Shuffled):
    """Real stdlib functions (``min_lines``..``max_lines`` lines, with a docstring, public name) as HumanEval-form
    requests answered by their own source; ids ``python_source/<module>.<qualname>``."""

    domain = "code"
    license = LICENSES["python_source"]

    def __init__(
        self, *, min_lines: int = 4, max_lines: int = 40, limit: int | None = None, seed: int = 42, **options: Any
    ) -> None:
        if not 1 <= min_lines <= max_lines:
            raise UsageError(f"python_source: need 1 <= min_lines <= max_lines, got {min_lines}, {max_lines}")
        super().__init__(limit=limit, seed=seed, **options)
        self.min_lines, self.max_lines = min_lines, max_lines

    def all_records(self) -> Iterator[PromptRecord]:
        for rid, header, body in _stdlib_functions(self.min_lines, self.max_lines):
            turn = f"{HumanEval.instruction}\n\n```python\n{header}\n```"
            yield PromptRecord(rid, "code", self.name, [turn], responses=(f"```python\n{body}\n```",))


@functools.lru_cache(maxsize=4)
def _stdlib_functions(min_lines: int, max_lines: int) -> tuple[tuple[str, str, str], ...]:
    """(id, header with docstring, whole source) of every documented public stdlib function of that length (parsed
    once per process: parsing the standard library is slow)."""
    out, seen = [], set()
    for path in _stdlib_files():
        parsed = _parse(path)
        if parsed is None:
            continue
        text, tree = parsed
        lines = text.splitlines()
        mod = _module_name(path)
        for qual, node in _functions(tree):
            rid = f"python_source/{mod}.{qual}"
            if rid in seen or not min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
                continue
            header = _dedent(lines[node.lineno - 1 : node.body[0].end_lineno])
            body = _dedent(lines[node.lineno - 1 : node.end_lineno])
            if len(body) > len(header) + 10:  # not just a docstring and `pass`
                seen.add(rid)
                out.append((rid, header, body))
    return tuple(out)


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of the public module-level functions and public methods of public classes that have
    a docstring."""

    def documented(node: ast.AST) -> bool:
        return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and bool(ast.get_docstring(node))

    for node in tree.body:
        if documented(node) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for sub in node.body:
                if documented(sub) and not sub.name.startswith("_"):
                    yield f"{node.name}.{sub.name}", sub


def _dedent(lines: list[str]) -> str:
    import textwrap

    return textwrap.dedent("\n".join(lines)).rstrip()


EXPLAIN = (
    "Explain {what}.",
    "What should I know about {what}? Give a clear explanation.",
    "Can you describe {what} in detail?",
)


class _ProseAnswers(_Shuffled):
    """A chat source of prose pieces of at most ``max_chars`` characters (the class's ``default_max_chars``)."""

    domain = "chat"
    default_max_chars = 1500

    def __init__(
        self, *, max_chars: int | None = None, limit: int | None = None, seed: int = 42, **options: Any
    ) -> None:
        max_chars = self.default_max_chars if max_chars is None else max_chars
        if max_chars < 200:
            raise UsageError(f"{self.name}: max_chars must be >= 200, got {max_chars}")
        super().__init__(limit=limit, seed=seed, **options)
        self.max_chars = max_chars


@register("prompt_source", "python_docs")
class PythonDocs(_ProseAnswers):
    """The Python reference topics and stdlib module docstrings as answers: one record per paragraph-aligned piece
    of ≤ ``max_chars``; ids ``python_docs/topic/<name>/<k>`` and ``python_docs/module/<name>/<k>``."""

    license = LICENSES["python_docs"]

    def all_records(self) -> Iterator[PromptRecord]:
        pieces = _doc_pieces()
        for stem, what, text in pieces:
            for k, chunk in enumerate(_chunks(_prose(text), self.max_chars, min_chars=200)):
                rid = f"python_docs/{stem}/{k}"
                ask = EXPLAIN[int(_unit_interval("explain", rid) * len(EXPLAIN))].format(what=what)
                if k:
                    ask += f" (part {k + 1})"
                yield PromptRecord(rid, "chat", self.name, [ask], responses=(chunk,))


@functools.lru_cache(maxsize=1)
def _doc_pieces() -> tuple[tuple[str, str, str], ...]:
    """(id stem, what it is, text) of every reference topic and documented public stdlib module."""
    from pydoc_data.topics import topics

    pieces = [(f"topic/{name}", f"the Python language topic '{name}'", topics[name]) for name in sorted(topics)]
    for path in _stdlib_files():
        parsed = _parse(path)
        mod = _module_name(path)
        doc = ast.get_docstring(parsed[1]) if parsed else None
        if doc and not mod.split(".")[-1].startswith("_"):
            pieces.append((f"module/{mod}", f"the Python module `{mod}`", doc))
    return tuple(pieces)


@register("prompt_source", "package_docs")
class PackageDocs(_ProseAnswers):
    """The installed distributions' descriptions (their README), first ``max_chars`` paragraph-aligned characters,
    as answers to "tell me about the package"; ids ``package_docs/<distribution>``."""

    license = LICENSES["package_docs"]
    default_max_chars = 1800

    def all_records(self) -> Iterator[PromptRecord]:
        from importlib import metadata

        seen: set[str] = set()
        for dist in sorted(metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
            name = (dist.metadata["Name"] or "").strip()
            body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
            key = name.lower()
            if not name or key in seen:
                continue
            chunks = _chunks(_prose(body), self.max_chars, min_chars=300)
            if not chunks:
                continue
            seen.add(key)
            summary = (dist.metadata["Summary"] or "").strip()
            ask = f"Tell me about the Python package `{name}`" + (f" ({summary})." if summary else ".")
            yield PromptRecord(f"package_docs/{key}", "chat", self.name, [ask], responses=(chunks[0],))
