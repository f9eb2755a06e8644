"""One shared chat-format config for regeneration, feature extraction, training and evaluation.

docs/algorithm.md §4 / pitfall 5: the system prompt, template and thinking flag MUST be identical in every
stage. :class:`ChatFormat` is that single source; it is stored in feature caches and exported
drafters, and compared on load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..checks import UsageError


@dataclass(frozen=True)
class ChatFormat:
    """How conversations are rendered into target tokens.

    Args:
        system_prompt: a system message prepended to every conversation; ``None`` keeps the
            template's own default behaviour (SmolLM2's template adds its default system prompt).
        use_chat_template: ``False`` renders raw concatenated turns.
        template: a Jinja chat template used in place of the tokenizer's, for a base model that has none (without
            one, its turns are concatenated as raw text inside the tokenizer's own BOS / EOS framing, no separator):
            ``recipes/gemma3_270m_dspark.yaml``.
    """

    system_prompt: str | None = None
    use_chat_template: bool = True
    template: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["template"] is None:  # formats recorded before the key existed compare equal
            del d["template"]
        return d

    def messages(self, turns: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.system_prompt is not None and (not turns or turns[0]["role"] != "system"):
            return [{"role": "system", "content": self.system_prompt}, *turns]
        return list(turns)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids of content text: special-token strings in it (``<|im_end|>``, ``</s>``, ...) stay text, so user text never
    becomes control tokens."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def _specials(tokenizer: Any) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    found = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    found |= {getattr(t, "content", str(t)) for t in added.values() if getattr(t, "special", True)}
    return [t for t in found if t]


def _has_special(tokenizer: Any, messages: list[dict[str, str]]) -> bool:
    specials = _specials(tokenizer)
    return any(sp in m["content"] for m in messages for sp in specials)


def framing(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts around ``text`` on its own (its BOS / EOS rules): (head, tail)."""
    full = list(tokenizer(text)["input_ids"])
    bare = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    for at in range(len(full) - len(bare) + 1):
        if full[at : at + len(bare)] == bare:
            return full[:at], full[at + len(bare) :]
    return [], []


def raw_ids(tokenizer: Any, text: str, tail: bool = True) -> list[int]:
    """Content text in the tokenizer's own framing: ``tokenizer(text)``'s BOS (and EOS with ``tail``, where the
    tokenizer adds one) around the text's ids, whose special-token strings stay text (:func:`text_ids`). For text
    without special-token strings this is exactly ``tokenizer(text)["input_ids"]``."""
    head, end = framing(tokenizer, text)
    return head + text_ids(tokenizer, text) + (end if tail else [])


def has_template(tokenizer: Any, fmt: ChatFormat) -> bool:
    """Whether ``fmt`` renders turns through a chat template (the recorded one, else the tokenizer's)."""
    return fmt.use_chat_template and (fmt.template or getattr(tokenizer, "chat_template", None)) is not None


def _ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool, fmt: ChatFormat,
         tail: bool = True) -> list[int]:  # fmt: skip
    if not has_template(tokenizer, fmt):
        return raw_ids(tokenizer, "".join(m["content"] for m in messages), tail)
    template = fmt.template or tokenizer.chat_template
    if _has_special(tokenizer, messages):
        return _ids_with_literal_content(tokenizer, messages, add_generation_prompt, template)
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                        chat_template=template)  # fmt: skip
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return list(out)


def _ids_with_literal_content(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool,
                              template: str):  # fmt: skip
    """The template's text, its own pieces tokenized as usual (its control tokens) and each message's content as
    text (:func:`text_ids`): the content is located in the rendered text in order (as written, else stripped, for
    templates that trim it)."""
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             chat_template=template)  # fmt: skip
    ids, cursor = [], 0
    for m in messages:
        content = m["content"]
        at = rendered.find(content, cursor) if content else -1
        if at < 0 and content.strip():
            content = content.strip()
            at = rendered.find(content, cursor)
        if at < 0:
            if _specials_in(tokenizer, m["content"]):
                raise UsageError("the chat template rewrites message content that holds special-token text; pass "
                                 "pre-formatted text with chat=False to tokenize it as written")  # fmt: skip
            continue
        ids += list(tokenizer(rendered[cursor:at], add_special_tokens=False)["input_ids"]) + text_ids(
            tokenizer, content
        )
        cursor = at + len(content)
    return ids + list(tokenizer(rendered[cursor:], add_special_tokens=False)["input_ids"])


def _specials_in(tokenizer: Any, text: str) -> bool:
    return any(sp in text for sp in _specials(tokenizer))


def render_prompt(tokenizer: Any, turns: list[dict[str, str]], fmt: ChatFormat) -> list[int]:
    """Token ids of a conversation ending with a user turn, followed by the assistant header
    (``apply_chat_template(..., add_generation_prompt=True)``); without a template, the turns' text in the
    tokenizer's own framing (:func:`raw_ids`)."""
    return _ids(tokenizer, fmt.messages(turns), True, fmt)


def encode_conversation(
    tokenizer: Any, turns: list[dict[str, str]], fmt: ChatFormat, end_of_turn_id: int
) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and its loss mask.

    The mask is 1 on every assistant span, including its end-of-turn token, and 0 elsewhere
    (system, user, assistant headers, and template glue after the end-of-turn token).
    """
    msgs = fmt.messages(turns)
    ids = _ids(tokenizer, msgs, False, fmt, tail=False)
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prefix = _ids(tokenizer, msgs[:i], True, fmt, tail=False)
        upto = _ids(tokenizer, msgs[: i + 1], False, fmt, tail=False)
        if ids[: len(upto)] != upto or upto[: len(prefix)] != prefix:
            raise UsageError(
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
