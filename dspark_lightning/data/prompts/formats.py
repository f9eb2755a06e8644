"""Readers for the conversation files users have, turned into prompts (user turns, system prompt) for regeneration.

Containers: JSON (an array, or an object holding one; a file cut off mid-record is read up to its last whole record),
JSONL, parquet, and Hugging Face datasets (a ``save_to_disk`` folder, or a hub id already in the local cache, read
offline; ``streaming`` for large ones). Row formats, detected per row unless ``format`` names one:

- ``sharegpt``: ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}], "system"?: ...}``
- ``openai``: ``{"messages": [{"role": "system" | "user" | "assistant", "content": str | [{"type": "text", ...}]}]}``
- ``alpaca``: ``{"instruction": ..., "input"?: ..., "output"?: ..., "system"?: ...}``
- ``turns``: ``{"turns": ["q1", "q2"]}`` or ``{"turns": [{"role", "content"}, ...]}`` (this project's own)
- ``prompt``: ``{"prompt": "..."}`` (one user turn)

``fields`` maps a file's own column names onto these (``{"prompt": "question", "id": "uid"}``). Role names are
normalised (``human``/``USER`` -> user, ``gpt``/``chatgpt``/``model``/``bot`` -> assistant); a conversation's leading
assistant messages are dropped and consecutive user messages joined; assistant text is never used (the target writes
every response). A row that cannot be read is counted in a :class:`ReadReport` with its reason and the first few are
quoted; nothing is dropped without being counted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...checks import UsageError

FORMATS = ("auto", "sharegpt", "openai", "alpaca", "turns", "prompt")
ROLE_NAMES = {
    "user": ("user", "human", "humans", "prompter", "question", "customer", "you"),
    "assistant": ("assistant", "gpt", "chatgpt", "bard", "bing", "model", "bot", "ai", "gpt4", "gpt-4", "claude",
                  "answer", "response", "llm"),
    "system": ("system", "developer", "instruction"),
    "tool": ("tool", "function", "observation", "ipython", "function_call", "tool_call"),
}  # fmt: skip
_ROLE = {alias: role for role, names in ROLE_NAMES.items() for alias in names}
FIELDS = ("id", "conversations", "messages", "role", "content", "system", "instruction", "input", "prompt", "turns",
          "domain")  # fmt: skip


class FormatError(UsageError):
    """A row that is not a conversation in any format we read (its reason is the message)."""


@dataclass(frozen=True)
class Conversation:
    """What a row gives regeneration: the user turns in order and the system prompt (``None`` = none given)."""

    turns: list[str]
    system: str | None = None
    id: str | None = None
    domain: str | None = None


@dataclass
class ReadReport:
    """What a reader did with a file: rows read and kept, malformed rows by reason (first few quoted)."""

    source: str
    rows: int = 0
    kept: int = 0
    malformed: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    truncated_bytes: int = 0
    max_examples: int = 3

    def bad(self, where: str, reason: str) -> None:
        self.malformed[reason] += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(f"{where}: {reason}")

    @property
    def dropped(self) -> int:
        return sum(self.malformed.values())

    def summary(self) -> str:
        out = f"{self.source}: {self.kept} of {self.rows} rows kept"
        if self.dropped:
            reasons = ", ".join(f"{n} {r}" for r, n in self.malformed.most_common())
            out += f"; {self.dropped} malformed ({reasons}); e.g. " + " | ".join(self.examples)
        if self.truncated_bytes:
            out += f"; the file ends mid-record ({self.truncated_bytes} bytes after the last whole record unread)"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "kept": self.kept, "malformed": dict(self.malformed), "examples": self.examples,
                "truncated_bytes": self.truncated_bytes}  # fmt: skip


# --- containers ----------------------------------------------------------------------------------------------------
def iter_json_array(text: str, report: ReadReport) -> Iterator[Any]:
    """The elements of a JSON array (or of the one list inside a top-level object), read one by one so that a file
    cut off mid-record yields every whole record before the cut (the rest is counted in ``truncated_bytes``)."""
    dec = json.JSONDecoder()
    ws = re.compile(r"[\s,]*")
    start = ws.match(text, 0).end()
    if text.startswith("{", start):
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise FormatError(f"{report.source}: a JSON object that does not parse ({exc})") from None
        lists = [v for v in obj.values() if isinstance(v, list)] if "conversations" not in obj else []
        if len(lists) != 1:
            yield obj  # one record
            return
        yield from lists[0]
        return
    if not text.startswith("[", start):
        raise FormatError(f"{report.source}: not a JSON array or object (starts with {text[start : start + 20]!r})")
    pos = start + 1
    while True:
        pos = ws.match(text, pos).end()
        if pos >= len(text):
            return  # no closing bracket: the cut fell between records
        if text[pos] == "]":
            return
        try:
            item, pos = dec.raw_decode(text, pos)
        except ValueError:
            report.truncated_bytes = len(text[pos:].encode("utf-8", "replace"))
            return
        yield item


def _hf_rows(path: str, split: str, streaming: bool) -> Iterator[dict]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"reading {path!r} needs the datasets library: pip install datasets ({exc})") from None
    p = Path(path)
    if p.is_dir() and ((p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()
                       or (p / "state.json").is_file()):  # fmt: skip
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise FormatError(f"{path}: no split {split!r} in the saved dataset (it has {sorted(ds)})")
            ds = ds[split]
        if streaming:
            ds = ds.to_iterable_dataset()
    else:
        try:
            ds = datasets.load_dataset(path, split=split, streaming=streaming)
        except Exception as exc:  # noqa: BLE001 - datasets raises many types; one line names the path and the cause
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise FormatError(f"{path}: not a file, a saved dataset folder or a hub dataset in the local cache "
                              f"({type(exc).__name__}: {first})") from exc  # fmt: skip
    yield from ds


def iter_rows(path: str | Path, report: ReadReport, *, split: str = "train", streaming: bool = False) -> Iterator[Any]:
    """Raw rows of a JSON / JSONL / parquet file, or of a Hugging Face dataset (folder or cached hub id)."""
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    if p.is_file() and suffixes[-1:] == [".parquet"]:
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(p).iter_batches(batch_size=1024):
            yield from batch.to_pylist()
        return
    if p.is_file() and (suffixes[-1:] in ([".jsonl"], [".ndjson"]) or suffixes[-2:] == [".jsonl", ".gz"]):
        import gzip

        opener = gzip.open if suffixes[-1] == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    report.rows += 1
                    report.bad(f"line {lineno}", f"not JSON ({exc.msg})")
        return
    if p.is_file():
        if suffixes[-1:] != [".json"]:
            raise FormatError(f"{p}: unknown file type {p.suffix!r}; read are .json, .jsonl, .ndjson, .parquet, or a "
                              "Hugging Face dataset (a save_to_disk folder or a cached hub id)")  # fmt: skip
        yield from iter_json_array(p.read_text(encoding="utf-8"), report)
        return
    if p.exists() and not p.is_dir():
        raise FormatError(f"{p}: not a regular file")
    if not p.exists() and ("/" not in str(path) or str(path).startswith((".", "/"))):
        raise FileNotFoundError(f"{path}: no such file or dataset folder")
    yield from _hf_rows(str(path), split, streaming)


# --- row formats ---------------------------------------------------------------------------------------------------
def _text(content: Any) -> str:
    """A message's text: a string, or OpenAI content parts of type text (other parts are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise FormatError(f"a message has a {kind!r} content part (only text is read)")
        return "\n".join(parts)
    if content is None:
        return ""
    raise FormatError(f"a message's content is a {type(content).__name__}, not text")


def role_of(name: Any) -> str:
    role = _ROLE.get(str(name).strip().lower())
    if role is None:
        raise FormatError(f"unknown role {name!r}")
    return role


def _from_messages(msgs: Any, role_key: str, content_key: str) -> Conversation:
    if not isinstance(msgs, list) or not msgs:
        raise FormatError("an empty or non-list conversation")
    system, turns, last = None, [], None
    for m in msgs:
        if not isinstance(m, dict):
            raise FormatError(f"a message is a {type(m).__name__}, not an object")
        rk = role_key if role_key in m else next((k for k in ("role", "from", "speaker") if k in m), None)
        ck = content_key if content_key in m else next((k for k in ("content", "value", "text") if k in m), None)
        if rk is None or ck is None:
            raise FormatError(f"a message without a role or content field (keys {sorted(m)})")
        role, text = role_of(m[rk]), _text(m[ck]).strip()
        if role == "system":
            system = text if system is None and not turns else system  # a mid-conversation system message is ignored
        elif role == "user" and text:
            if last == "user":
                turns[-1] += "\n\n" + text  # consecutive user messages are one turn
            else:
                turns.append(text)
            last = "user"
        elif role == "assistant" and turns:
            last = "assistant"
    if not turns:
        raise FormatError("no non-empty user message")
    return Conversation(turns, system or None)


def detect(row: dict) -> str:
    for fmt, key in (("sharegpt", "conversations"), ("openai", "messages"), ("turns", "turns"),
                     ("alpaca", "instruction"), ("prompt", "prompt")):  # fmt: skip
        if key in row:
            return fmt
    if "conversation" in row:
        return "sharegpt"
    raise FormatError(f"no conversation field (keys {sorted(row)[:8]}); name the format or map fields with `fields`")


def parse_row(row: Any, fmt: str = "auto", fields: dict[str, str] | None = None) -> Conversation:
    """One row -> :class:`Conversation`; :class:`FormatError` says why a row is not one."""
    if not isinstance(row, dict):
        raise FormatError(f"a row is a {type(row).__name__}, not an object")
    if fields:
        row = {**row, **{ours: row[theirs] for ours, theirs in fields.items() if theirs in row}}
    kind = detect(row) if fmt == "auto" else fmt
    f = fields or {}
    system = row.get("system") if isinstance(row.get("system"), str) else None
    if kind == "sharegpt":
        conv = _from_messages(row.get("conversations", row.get("conversation")), f.get("role", "from"),
                              f.get("content", "value"))  # fmt: skip
    elif kind == "openai":
        conv = _from_messages(row.get("messages"), f.get("role", "role"), f.get("content", "content"))
    elif kind == "turns":
        turns = row.get("turns")
        if isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns):
            conv = Conversation([t.strip() for t in turns if t.strip()] or _raise("no non-empty user turn"))
        else:
            conv = _from_messages(turns, "role", "content")
    elif kind == "alpaca":
        inst, extra = _text(row.get("instruction")).strip(), _text(row.get("input")).strip()
        if not inst:
            raise FormatError("an empty instruction")
        conv = Conversation([f"{inst}\n\n{extra}" if extra else inst])
    elif kind == "prompt":
        text = _text(row.get("prompt")).strip()
        if not text:
            raise FormatError("an empty prompt")
        conv = Conversation([text])
    else:
        raise FormatError(f"unknown format {kind!r}; one of {FORMATS}")
    rid = row.get("id")
    domain = row.get("domain") if isinstance(row.get("domain"), str) else None
    return Conversation(conv.turns, (system or conv.system or "").strip() or None,
                        None if rid is None else str(rid), domain)  # fmt: skip


def _raise(msg: str):
    raise FormatError(msg)


def read_conversations(
    path: str | Path,
    report: ReadReport,
    *,
    fmt: str = "auto",
    fields: dict[str, str] | None = None,
    split: str = "train",
    streaming: bool = False,
) -> Iterator[Conversation]:
    """Every readable conversation of ``path`` in order; unreadable rows are counted in ``report``."""
    if fmt not in FORMATS:
        raise UsageError(f"format must be one of {FORMATS}, got {fmt!r}")
    bad_fields = sorted(set(fields or {}) - set(FIELDS))
    if bad_fields:
        raise UsageError(f"fields: unknown field names {bad_fields}; map onto {FIELDS}")
    for n, row in enumerate(iter_rows(path, report, split=split, streaming=streaming)):
        report.rows += 1
        try:
            conv = parse_row(row, fmt, fields)
        except FormatError as exc:
            report.bad(f"row {n}", str(exc))
            continue
        report.kept += 1
        yield conv


def content_id(conv: Conversation) -> str:
    """16 hex digits of the conversation's text (system prompt and user turns)."""
    return hashlib.sha256(json.dumps([conv.system, conv.turns], ensure_ascii=False).encode()).hexdigest()[:16]
