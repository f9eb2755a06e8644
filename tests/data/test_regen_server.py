"""Regeneration through an OpenAI-compatible server (``data.regen.backend: openai``), against a real HTTP server on the
loopback that serves the tiny target: greedy answers equal our own regeneration's, multi-turn history, resume, retries
and one-line errors. (llama.cpp's llama-server is exercised by `make regen-server`, benchmarks/regen_server.py.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dspark_lightning.checks import UsageError
from dspark_lightning.data.prompts.sources import PromptRecord
from dspark_lightning.data.regen import regen_hf
from dspark_lightning.data.regen.config import RegenConfig
from dspark_lightning.data.regen.regen_server import ServerError
from dspark_lightning.data.regen.regenerate import regenerate
from dspark_lightning.registry import RegistryError

PROMPTS = [PromptRecord(f"s/{i}", "chat", "test", ["hello there", "and then?"][: 1 + i % 2]) for i in range(6)]
PROMPTS.append(PromptRecord("s/sys", "chat", "test", ["who are you?"], system="You are a pirate."))


class _Server:
    """Serves ``target`` greedily at /v1/chat/completions; ``fail_first`` requests get a 503, a wrong model a 404."""

    def __init__(self, target, fail_first: int = 0) -> None:
        self.target, self.fail_first, self.requests, self.lock = target, fail_first, [], threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    fail = len(server.requests) <= server.fail_first
                if fail:
                    return self._send(503, {"error": "busy"})
                if "LONG" in body["messages"][-1]["content"]:  # llama-server's wording
                    return self._send(400, {"error": {"message": "request (9000 tokens) exceeds the available "
                                                                 "context size (4096 tokens)"}})  # fmt: skip
                if body["model"] != "tiny":
                    return self._send(404, {"error": {"message": f"model {body['model']} not found"}})
                ids = server.target.encode_prompt(body["messages"])
                cfg = {"temperature": 0.0, "top_p": 1.0, "top_k": None}
                with server.lock:  # one forward at a time on the shared target
                    text, n, stopped = regen_hf._sample(server.target, [ids], [0], cfg, [body["max_tokens"]])[0]
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop" if stopped else "length"}],
                                 "usage": {"completion_tokens": n}})  # fmt: skip

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server(target):
    s = _Server(target)
    yield s
    s.close()


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_server_answers_equal_our_greedy_regeneration_and_resume(target, server, tmp_path):
    kw = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 8, "progress": False}
    ours, theirs = tmp_path / "hf.jsonl", tmp_path / "srv.jsonl"
    regenerate(target, PROMPTS, ours, backend="hf", batch_size=1, **kw)
    srv = openai(server.url, "tiny", timeout_s=30, retries=0)
    stats = regenerate(target, PROMPTS, theirs, backend=srv, concurrency=3, **kw)
    assert stats["written"] == len(PROMPTS) and stats["tokens"] > 0
    a, b = _rows(ours), _rows(theirs)
    assert [r["turns"] for r in a] == [r["turns"] for r in b]  # every turn, history included
    assert [r["gen"]["new_tokens"] for r in a] == [r["gen"]["new_tokens"] for r in b]
    assert b[-1]["turns"][0] == {"role": "system", "content": "You are a pirate."}
    assert (b[0]["gen"]["base_url"], b[0]["gen"]["model"]) == (server.url, "tiny") and "timeout_s" not in b[0]["gen"]
    sent = [r for r in server.requests if r["messages"][-1]["content"] == "and then?"]
    assert sent and all(len(r["messages"]) == 3 and r["messages"][1]["role"] == "assistant" for r in sent)
    assert all(r["max_tokens"] == 8 and r["temperature"] == 0.0 for r in server.requests)
    n = len(server.requests)
    again = regenerate(target, PROMPTS, theirs, backend=srv, **kw)
    assert again["skipped"] == len(PROMPTS) and len(server.requests) == n  # resumed: nothing asked again
    other = openai(server.url, "tiny-v2", timeout_s=30, retries=0)
    with pytest.raises(ValueError, match="different settings"):
        regenerate(target, PROMPTS, theirs, backend=other, **kw)


def test_retries_then_one_line_errors(target, tmp_path):
    flaky = _Server(target, fail_first=2)
    try:
        kw = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 4, "progress": False}
        srv = openai(flaky.url, "tiny", timeout_s=30, retries=2)
        stats = regenerate(target, PROMPTS[:1], tmp_path / "a.jsonl", backend=srv, **kw)
        assert stats["written"] == 1 and len(flaky.requests) == 3  # two 503s, then the answer
        long = [*PROMPTS[:2], PromptRecord("s/long", "chat", "test", ["LONG " * 50])]
        stats = regenerate(target, long, tmp_path / "long.jsonl", backend=srv, **kw)
        assert stats["written"] == 2 and stats["dropped_empty"] == 1  # that conversation only: counted, not fatal
        with pytest.raises(ServerError, match=r"refused the request \(HTTP 404: .*model nope not found"):
            regenerate(target, PROMPTS[:1], tmp_path / "b.jsonl", backend=openai(flaky.url, "nope", retries=3), **kw)
        port = flaky.httpd.server_address[1]
    finally:
        flaky.close()
    dead = openai(f"http://127.0.0.1:{port}/v1", "tiny", timeout_s=2, retries=1)
    with pytest.raises(ServerError, match="no answer after 2 attempts"):
        regenerate(target, PROMPTS[:1], tmp_path / "c.jsonl", backend=dead, **kw)


def openai(base_url, model, **kw):
    """The openai backend as a recipe spells it."""
    return {"class_path": "openai", "init_args": {"base_url": base_url, "model": model, **kw}}


def test_regen_config_checks_the_server_options_up_front():
    with pytest.raises(UsageError, match="base_url must be an http"):
        RegenConfig(backend=openai("localhost:8000", "m"))
    with pytest.raises(UsageError, match="model, the name the server serves"):
        RegenConfig(backend=openai("http://127.0.0.1:8000/v1", ""))
    with pytest.raises(UsageError, match="openai.*model"):  # a missing setting: the backend's own signature says
        RegenConfig(backend={"class_path": "openai", "init_args": {"base_url": "http://127.0.0.1:8000/v1"}})
    with pytest.raises(UsageError, match="dspark.*base_url"):  # a setting the backend does not take
        RegenConfig(backend={"class_path": "dspark", "init_args": {"base_url": "http://127.0.0.1:8000/v1"}})
    with pytest.raises(RegistryError, match="unknown regen_backend 'vllm2'; available: .*openai"):
        RegenConfig(backend="vllm2")
    cfg = RegenConfig(backend=openai("http://h:1/v1", "m", timeout_s=9))
    assert cfg.identity()["base_url"] == "http://h:1/v1" and "timeout_s" not in cfg.identity()
    assert cfg.identity()["backend"] == "openai" and "base_url" not in RegenConfig().identity()
