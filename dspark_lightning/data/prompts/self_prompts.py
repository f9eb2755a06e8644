"""Chat prompts the target writes itself (benchmarks/results/matrix.md, "Chat prompts the target writes").

No offline corpus of real user questions ships in a registry package, and the chat sources we have are FastChat's
500 dummy conversations and the 80 MT-Bench questions. A drafter learns the *target's answers*, so what it needs is
many varied questions, not good ones: the target is asked, at T = 1, to write the message a user would send about a
topic with a task (``TOPICS`` x ``TASKS``, our own words; T = 0.8), and each usable reply becomes a chat prompt
that ``prepare`` then has the target answer like any other.

    dspark-lightning write-prompts --n 1200 --out prompts.jsonl          # SmolLM2 by default, resumable
    data: {sources: [self_chat]}                                            # the ones shipped in the package
    data: {sources: [{class_path: jsonl, init_args: {path: prompts.jsonl}}]} # a file written for another target

Written rows are kept in ``<out>.raw.jsonl`` (regeneration's durable, resumable appends), so a killed run or a full
disk continues where it stopped; the final file is rewritten from them atomically, and the command holds the output
folder's lock (a second writer is refused, naming the holder).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ... import checks, locks
from ...atomic import atomic_write
from ...infer.generation import SamplingParams  # the data layer's seam into infer
from ..regen.regenerate import load_conversations, regenerate
from .sources import PromptRecord, _unit_interval

TOPICS = (
    "cooking pasta", "baking bread", "a vegetarian diet", "coffee", "wine pairing", "houseplants", "vegetable gardens",
    "composting", "dog training", "caring for a cat", "aquariums", "bird watching", "hiking safety", "camping",
    "running a marathon", "strength training", "yoga", "sleep", "stress at work", "meditation", "time management",
    "learning a new language", "public speaking", "job interviews", "writing a resume", "negotiating a salary",
    "starting a small business", "marketing on social media", "personal budgeting", "saving for retirement",
    "buying a first home", "renting an apartment", "credit scores", "inflation", "the stock market",
    "cryptocurrency", "climate change", "renewable energy", "electric cars", "recycling", "ocean pollution",
    "volcanoes", "earthquakes", "black holes", "the solar system", "Mars exploration", "the moon landing",
    "photosynthesis", "the human immune system", "vaccines", "DNA", "evolution", "dinosaurs", "antibiotics",
    "the common cold", "nutrition for children", "the Roman Empire", "ancient Egypt", "the French Revolution",
    "the Industrial Revolution", "World War I", "the Renaissance", "the printing press", "the Silk Road",
    "the history of the internet", "democracy", "the United Nations", "free speech", "urban planning",
    "public transport", "traffic congestion", "smartphones", "social media and teenagers", "video games",
    "artificial intelligence", "privacy online", "passwords and security", "cloud computing", "robots",
    "3D printing", "virtual reality", "spreadsheets", "email etiquette", "remote work", "team meetings",
    "conflict with a coworker", "friendship", "planning a wedding", "a birthday party", "moving to a new city",
    "travel to Japan", "travel to Italy", "a road trip", "packing for a flight", "jet lag", "learning to swim",
    "playing the guitar", "jazz music", "classical music", "painting with watercolors", "photography",
    "writing poetry", "reading more books", "Shakespeare", "science fiction novels", "a movie review",
    "chess strategy", "board games", "soccer", "basketball", "the Olympic Games", "mountains", "rainforests",
    "deserts", "the weather", "rainbows", "the water cycle", "bees", "elephants", "penguins", "time zones",
    "the metric system", "probability", "prime numbers", "geometry", "logic puzzles", "a riddle",
    "philosophy of happiness", "ethics of lying", "the meaning of art", "volunteering", "parenting a toddler",
    "teaching kids to read", "homework habits", "college applications", "choosing a career", "retirement hobbies",
)  # fmt: skip
TASKS = (
    "ask for a clear explanation of",
    "ask for practical advice about",
    "ask for a short poem about",
    "ask for a short story about",
    "ask for a polite email about",
    "ask to compare two options related to",
    "ask for a step-by-step plan involving",
    "ask for a list of tips about",
    "ask for the pros and cons of something related to",
    "ask the assistant to play the role of an expert on",
    "ask for a short history of",
    "ask a tricky reasoning question about",
    "ask for a persuasive paragraph about",
    "ask for a summary of the key facts about",
)
META = (
    "Give an example of a message a user might send to an AI assistant to {task} {topic}. "
    "Reply with the message only, in one or two sentences."
)
_LABEL = re.compile(r"^\s*(\*\*)?(user('s)? message|user|message|question|request|prompt)(\*\*)?\s*[:\-]\s*", re.I)
_ASSISTANT = re.compile(r"^(as an? (helpful )?ai|sure|certainly|here('s| is))\b", re.I)
_REFUSAL = re.compile(r"\b(as an ai|i'm sorry|i am sorry|i cannot|i can't)\b", re.I)


def meta_records(n: int, seed: int = 0) -> list[PromptRecord]:
    """``n`` requests to write a user message, each a (topic, task) drawn deterministically from ``seed``; the same
    (n, seed) always gives the same records, and a larger ``n`` keeps the smaller one's as its prefix."""
    checks.at_least("write-prompts: n", n, 1)
    out = []
    for i in range(n):
        topic = TOPICS[int(_unit_interval("topic", seed, i) * len(TOPICS))]
        task = TASKS[int(_unit_interval("task", seed, i) * len(TASKS))]
        text = META.format(task=task, topic=topic)
        out.append(PromptRecord(f"self_chat/s{seed}/{i}", "chat", "self_chat", [text], {"topic": topic, "task": task}))
    return out


def clean_question(text: str, min_words: int = 4, max_words: int = 120) -> str | None:
    """The user message in a written reply, or None when the reply holds none. A small target often wraps it
    ("Here's an example: \"...\""): the first double-quoted passage is taken (to the end if the quote is left open),
    else the reply itself; a leading label (``User:``) is removed; refusals, replies that speak as the assistant,
    and ones too short or too long are dropped."""
    t = text.strip()
    q = t.find('"')
    if 0 <= q < len(t) - 1:
        end = t.find('"', q + 1)
        t = t[q + 1 : end if end > q else len(t)]
    t = _LABEL.sub("", t.strip()).strip()
    cut = re.search(r"\n\s*(\*\*)?(assistant|ai|answer|response)(\*\*)?\s*:", t, re.I)
    if cut:
        t = t[: cut.start()].strip()
    words = t.split()
    if not (min_words <= len(words) <= max_words) or _REFUSAL.search(t) or _ASSISTANT.match(t):
        return None
    return t


def written_prompts(rows: list[dict]) -> list[dict[str, Any]]:
    """Prompt lines from written rows: the cleaned reply as the one user turn, duplicates (case-insensitive) kept
    once, in row order; ``meta`` keeps the topic and task that asked for it."""
    seen: set[str] = set()
    out = []
    for row in rows:
        reply = next((m["content"] for m in row["turns"] if m["role"] == "assistant"), "")
        q = clean_question(reply)
        if q is None or q.lower() in seen:
            continue
        seen.add(q.lower())
        out.append({"id": row["id"], "domain": "chat", "turns": [q], "meta": row.get("meta", {})})
    return out


def write_prompts(
    target: Any,
    out: str | Path,
    *,
    n: int,
    seed: int = 0,
    temperature: float = 0.8,
    top_p: float = 0.95,
    max_new_tokens: int = 60,
    concurrency: int = 32,
    progress: bool = True,
) -> dict[str, Any]:
    """Have ``target`` write ``n`` user messages (some are dropped by :func:`clean_question`) and save the usable
    ones to ``out`` as prompt lines the ``jsonl`` source reads. Resumable through ``<out>.raw.jsonl``."""
    out = Path(out)
    raw = out.with_name(out.name + ".raw.jsonl")
    asks = meta_records(n, seed)
    st = regenerate(target, asks, raw, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                    seed=seed, max_turns=1, concurrency=concurrency, progress=progress)  # fmt: skip
    wanted = {r.id for r in asks}
    lines = written_prompts([r for r in load_conversations(raw) if r["id"] in wanted])
    atomic_write(out, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    return {**st, "asked": n, "kept": len(lines)}


def run_write_prompts(out: str, *, target: str, n: int, seed: int, temperature: float, top_p: float,
                      max_new_tokens: int, concurrency: int, dtype: str) -> None:  # fmt: skip
    """``dspark-lightning write-prompts`` (cli/tools.py): checks the values, writes the file, says what it wrote."""
    import time

    from ...targets import load_target_checked

    checks.at_least("--n", n, 1)
    checks.at_least("--concurrency", concurrency, 1)
    checks.at_least("--max_new_tokens", max_new_tokens, 1)
    SamplingParams(temperature, top_p=top_p)  # the sampling law checks its own arguments
    checks.output_file("--out", out)
    dtype = _dtype(dtype)
    t0 = time.perf_counter()
    with locks.folder_lock(Path(out).parent, "write-prompts"):  # one writer of <out> and <out>.raw.jsonl
        model = load_target_checked(target, dtype=dtype)
        st = write_prompts(model, out, n=n, seed=seed, temperature=temperature, top_p=top_p,
                           max_new_tokens=max_new_tokens, concurrency=concurrency)  # fmt: skip
    print(f"write-prompts: {st['kept']} of {st['asked']} replies kept as prompts -> {out} "
          f"({st['tokens']} tokens written now at {st['tokens_per_s']:.0f} tok/s, {time.perf_counter() - t0:.0f} s, "
          f"target in {dtype})")  # fmt: skip


def _dtype(name: str) -> str:
    if name != "auto":
        return {"fp32": "float32", "bf16": "bfloat16"}[name]
    from ...devices import decode_bf16_faster
    from ...targets import cache_root

    return "bfloat16" if decode_bf16_faster("cpu", cache=cache_root() / "kernels") else "float32"
