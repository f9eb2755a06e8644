"""One shared chat-format config for regeneration, feature extraction, training and evaluation.

SPEC §4 / pitfall 5: the system prompt, template and thinking flag MUST be identical in every
stage. :class:`ChatFormat` is that single source; it is stored in feature caches and exported
drafters, and compared on load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ChatFormat:
    """How conversations are rendered into target tokens.

    Args:
        system_prompt: a system message prepended to every conversation; ``None`` keeps the
            template's own default behaviour (SmolLM2's template adds its default system prompt).
        use_chat_template: ``False`` renders raw concatenated turns (for base models without a template).
    """

    system_prompt: str | None = None
    use_chat_template: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def messages(self, turns: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.system_prompt is not None and (not turns or turns[0]["role"] != "system"):
            return [{"role": "system", "content": self.system_prompt}, *turns]
        return list(turns)


def _ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool, fmt: ChatFormat) -> list[int]:
    if not fmt.use_chat_template or tokenizer.chat_template is None:
        text = "".join(m["content"] for m in messages)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return list(out)


def render_prompt(tokenizer: Any, turns: list[dict[str, str]], fmt: ChatFormat) -> list[int]:
    """Token ids of a conversation ending with a user turn, followed by the assistant header."""
    return _ids(tokenizer, fmt.messages(turns), True, fmt)


def encode_conversation(
    tokenizer: Any, turns: list[dict[str, str]], fmt: ChatFormat, end_of_turn_id: int
) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and its loss mask.

    The mask is 1 on every assistant span, including its end-of-turn token, and 0 elsewhere
    (system, user, assistant headers, and template glue after the end-of-turn token).
    """
    msgs = fmt.messages(turns)
    ids = _ids(tokenizer, msgs, False, fmt)
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prefix = _ids(tokenizer, msgs[:i], True, fmt)
        upto = _ids(tokenizer, msgs[: i + 1], False, fmt)
        if ids[: len(upto)] != upto or upto[: len(prefix)] != prefix:
            raise ValueError(
                "the chat template is not prefix-stable (a shorter conversation does not render to a prefix of the "
                "longer one); cannot locate assistant spans for the loss mask"
            )
        span_end = len(upto)
        for j in range(len(prefix), len(upto)):
            if upto[j] == end_of_turn_id:
                span_end = j + 1
                break
        for j in range(len(prefix), span_end):
            mask[j] = 1
    return ids, mask
