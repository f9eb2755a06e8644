"""One decoding request as the engine tracks it: its tokens, its position and its own random streams."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def stream_seed(*key: object) -> int:
    """A 63-bit seed from a key such as (decode seed, prompt index, "draft"): independent streams per request."""
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class Request:
    index: int  # position in the caller's prompt list
    rid: int  # engine-wide request id (cache owner)
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    anchor: int = -1  # x_0: last committed token, not yet processed by the target
    pos: int = 0  # position of the anchor
    finish_reason: str | None = None  # "stop" (stop token), "stop_string", "length"
    t_added: float = 0.0
    t_first: float = 0.0  # first token (after prefill)
    t_done: float = 0.0
    key: int = 0  # own acceptance/sampling stream (first token, acceptance, residual): a counter-based Streams key
    draws: int = 0  # numbers drawn from it so far
    draft_key: int = 0  # own drafting stream (draft tokens)
    draft_draws: int = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None
