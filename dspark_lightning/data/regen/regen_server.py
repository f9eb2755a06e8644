"""Response regeneration through an OpenAI-compatible chat server (``data.regen.backend: {class_path: openai,
init_args: {base_url: ..., model: ...}}``).

vLLM, SGLang and llama.cpp's ``llama-server`` all serve ``POST {base_url}/chat/completions``. Each conversation is
one worker's: its user turns are sent in order with the server's own earlier answers as history, so up to
``concurrency`` conversations are in flight. A request that fails to connect, times out or gets a 5xx / 429 answer is
retried ``retries`` times with exponential back-off; a 4xx answer fails at once with the server's message, except a
conversation longer than the server's context, which is dropped and counted like one longer than the target's.

The server must serve the target with its chat template; its answers may still differ from the target's own greedy
text where two tokens are near-tied (another kernel, another precision). That changes only which responses the drafter
trains on: the labels are always the target's own distributions over these responses (feature extraction runs the
target itself), so training stays consistent with what the target will verify.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ... import checks
from ...checks import UsageError
from ...registry import register
from ..prompts.sources import PromptRecord
from .backend import RegenBackend


class ServerError(RuntimeError):
    """The server refused a request or stayed unreachable after every retry (the message says which and why)."""


class PromptTooLong(ServerError):
    """The server refused a request because the conversation does not fit its context (that conversation only)."""


# how vLLM, SGLang and llama-server word a request longer than their context
_TOO_LONG = re.compile(r"context (size|length|window)|maximum context|too long|exceeds? the", re.I)


@dataclass
class ServerConfig:
    base_url: str
    model: str
    timeout_s: float = 300.0
    retries: int = 3
    api_key_env: str = "OPENAI_API_KEY"

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise UsageError(f"regen_backend openai: base_url must be an http(s) URL such as "
                             f"http://127.0.0.1:8000/v1, got {self.base_url!r}")  # fmt: skip
        if not self.model or not isinstance(self.model, str):
            raise UsageError("regen_backend openai: model, the name the server serves the target under, is required")
        checks.at_least("regen_backend openai: retries", self.retries, 0)
        if not self.timeout_s > 0:
            raise UsageError(f"regen_backend openai: timeout_s must be > 0, got {self.timeout_s}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


def chat_completion(server: ServerConfig, body: dict[str, Any]) -> dict[str, Any]:
    """One ``/chat/completions`` call with retries (see the module docstring)."""
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(server.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode()
    last = ""
    for attempt in range(server.retries + 1):
        if attempt:
            time.sleep(min(30.0, 0.5 * 2 ** (attempt - 1)))
        req = urllib.request.Request(server.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=server.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace").strip()
            last = f"HTTP {exc.code}: {detail}"
            if exc.code == 400 and _TOO_LONG.search(detail):
                raise PromptTooLong(f"{server.url}: {last}") from None
            if exc.code < 500 and exc.code != 429:
                raise ServerError(f"{server.url} refused the request ({last})") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    raise ServerError(f"{server.url}: no answer after {server.retries + 1} attempts (last: {last})")


@register("regen_backend", "openai")
class ServerRegenerator(RegenBackend):
    """Regenerates conversations through a server, ``concurrency`` conversations at a time."""

    transient = ("timeout_s", "retries", "api_key_env")

    def __init__(self, base_url: str, model: str, timeout_s: float = 300.0, retries: int = 3,
                 api_key_env: str = "OPENAI_API_KEY") -> None:  # fmt: skip
        """``base_url``: the server's API root, e.g. ``http://127.0.0.1:8000/v1``; ``model``: the name it serves the
        target under (with its chat template); ``timeout_s``: seconds one request may take; ``retries`` of a request
        that fails to connect, times out or gets a 5xx / 429 answer; ``api_key_env``: the environment variable whose
        value, when set, is sent as a bearer token."""
        self.server = ServerConfig(base_url, model, timeout_s, retries, api_key_env)
        self.base_url, self.model, self.timeout_s, self.retries = base_url, model, timeout_s, retries
        self.api_key_env = api_key_env
        self.lock = threading.Lock()

    def _body(self, messages: list[dict[str, str]], budget: int, seed: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.server.model,
            "messages": messages,
            "max_tokens": budget,
            "temperature": self.settings["temperature"],
            "top_p": self.settings["top_p"],
            "seed": seed % 2**31,
            "stream": False,
        }
        if self.settings["top_k"] is not None:
            body["top_k"] = self.settings["top_k"]  # vLLM, SGLang and llama.cpp read this extension
        return body

    def _conversation(self, conv: Any, i: int) -> int:
        """Answer every turn of conversation ``i`` in order; returns the tokens generated."""
        tokens = 0
        for t in range(len(conv.turns[i])):
            with self.lock:  # the bookkeeping is shared; the HTTP call is not
                prompt, seed = conv.ask(self.target, i, t)
                budget = conv.budget(i, prompt)
                messages = self.target.chat.messages(conv.history[i])
            if not budget:
                return tokens
            try:
                out = chat_completion(self.server, self._body(messages, budget, seed))
            except PromptTooLong:  # this conversation does not fit the server's context: dropped and counted
                with self.lock:
                    conv.too_long += 1
                    conv.alive.discard(i)
                return tokens
            try:
                choice = out["choices"][0]
                text = (choice["message"].get("content") or "").strip()
            except (KeyError, IndexError, TypeError, AttributeError):
                got = str(out)[:200]
                raise ServerError(f"{self.server.url}: an answer without choices[0].message ({got})") from None
            stopped = choice.get("finish_reason") == "stop"
            n = (out.get("usage") or {}).get("completion_tokens")
            if n is None:
                n = len(self.target.tokenizer(text, add_special_tokens=False)["input_ids"]) + stopped
            tokens += n
            with self.lock:
                if not conv.answer(i, text, int(n), stopped):
                    return tokens
        return tokens

    def answer(self, recs: list[PromptRecord]) -> tuple[list[dict], int, int]:
        conv = self.conversations(recs)
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="regen") as pool:
            list(pool.map(lambda i: self._conversation(conv, i), range(len(conv.recs))))
        self.prompt_tokens += conv.prompt_tokens
        return conv.result()
