"""Frozen target language models (any HF causal LM) and the embedded offline defaults."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch

from ..checks import UsageError, regular_entries
from .chat import ChatFormat, encode_conversation, render_prompt
from .embedded import MASK_TOKENS, cache_root, embedded_names, embedded_path
from .target import Target, TargetGeometry, TargetOutput, check_layer_ids, default_layer_ids

__all__ = [
    "ChatFormat",
    "Target",
    "TargetGeometry",
    "TargetOutput",
    "cache_root",
    "check_layer_ids",
    "default_layer_ids",
    "default_mask_token_id",
    "embedded_names",
    "encode_conversation",
    "load_target",
    "load_target_checked",
    "render_prompt",
    "resolve_target_path",
]

_CACHE: dict[tuple, Target] = {}
_LOADING = threading.Lock()  # threads asking for one target at once load it once


def resolve_target_path(name_or_path: str) -> Path | str:
    """An embedded name, a local HF directory, or a hub id already in the offline HF cache."""
    if name_or_path in embedded_names():
        return embedded_path(name_or_path)
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"target directory {p} has no config.json (not a Hugging Face model directory)")
        return p
    looks_like_hub_id = name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/", "~"))
    if looks_like_hub_id:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
            return name_or_path
    raise FileNotFoundError(
        f"target {name_or_path!r} not found: it is neither an embedded target ({', '.join(embedded_names())}) "
        "nor a local Hugging Face model directory nor a model in the offline HF cache"
    )


def load_target(
    target: str | os.PathLike | Any,
    layer_ids: list[int] | None = None,
    chat: ChatFormat | None = None,
    dtype: torch.dtype | str | None = torch.float32,
    tokenizer: Any = None,
    device: torch.device | str | None = "cpu",
) -> Target:
    """Load a frozen :class:`Target`.

    ``target`` is an embedded name (``smollm2-135m-instruct``, ``tiny-debug``), a local HF model
    directory, a hub id present in the offline cache, an already-loaded HF causal LM (pass its
    ``tokenizer``), or a :class:`Target` (returned as is). Loads are memoised per process.
    ``layer_ids``: the decoder layers whose outputs the target returns (default: :func:`default_layer_ids`); a loaded
    target can be re-tapped (:meth:`Target.tap`), as ``load_drafter`` and ``decode()`` do for a drafter of other taps.
    ``dtype`` and ``device`` follow :mod:`dspark_lightning.devices` (``"auto"``: bf16 on CUDA, fp32 on CPU).
    """
    from ..devices import resolve_device, resolve_dtype

    if isinstance(target, Target):
        return target
    if layer_ids is not None and (
        not isinstance(layer_ids, list | tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in layer_ids)
    ):
        raise UsageError(f"layer_ids must be a list of layer numbers (integers), got {layer_ids!r}")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    chat = chat or ChatFormat()
    if isinstance(target, torch.nn.Module):
        name = getattr(target.config, "name_or_path", "") or "model"
        if tokenizer is None:
            tokenizer = _tokenizer_next_to(name)
        return Target(target, tokenizer, name, layer_ids, chat)
    name = str(target)
    key = (name, tuple(layer_ids) if layer_ids is not None else None, chat, dtype, str(device))
    with _LOADING:
        if key not in _CACHE:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            path = resolve_target_path(name)
            kw = {"local_files_only": True}
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw).to(device)
            tok = tokenizer or AutoTokenizer.from_pretrained(path, **kw)
            _CACHE[key] = Target(model, tok, name, layer_ids, chat)
        loaded = _CACHE[key]
        # a memoised target that met a drafter of other taps since (Target.tap) taps what this call asks for again
        return loaded.tap(layer_ids if layer_ids is not None else default_layer_ids(loaded.geometry.num_layers))


def load_target_checked(name: str, **kwargs: Any) -> Any:
    """:func:`load_target` whose failure (an unknown name, a directory without a model, a
    truncated weights file) is one error naming the target."""
    if os.path.isdir(name):
        regular_entries("target", name)
    try:
        return load_target(name, **kwargs)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever HF raises for a bad model directory, the cause is the input
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"target {name!r} cannot be loaded ({type(exc).__name__}: {msg[:300]})") from None


def _tokenizer_next_to(name_or_path: str) -> Any:
    """The tokenizer saved with an already-loaded model (its ``name_or_path``), offline."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"load_target(model): no tokenizer found for {name_or_path!r}; pass tokenizer=... ({exc})"
        ) from exc


MASK_NAMES = ("<mask>", "[MASK]", "<|mask|>")  # a tokenizer's own mask token, where it has one
RESERVED_NAMES = ("<unused0>", "<|reserved_special_token_0|>", "<|reserved_0|>")  # never-trained reserved tokens


def default_mask_token_id(target: Target) -> int:
    """A token id that never occurs in templated data (docs/algorithm.md §3.1), for any target: the embedded
    target's known token; else the tokenizer's own mask token (Gemma's ``<mask>``); else the first padded embedding
    row past the tokenizer (Qwen3's choice: a row no text encodes to); else a reserved unused token; else the last
    additional special token that is not BOS / EOS / PAD; else the last row."""
    tok = target.tokenizer
    token = MASK_TOKENS.get(target.name)
    if token is not None:
        return int(tok.convert_tokens_to_ids(token))
    V = target.geometry.vocab_size
    unk = getattr(tok, "unk_token_id", None)
    vocab = tok.get_vocab()

    def known(name: str | None) -> int | None:
        tid = vocab.get(name) if name else None
        return int(tid) if tid is not None and tid != unk and 0 <= tid < V else None

    for name in (getattr(tok, "mask_token", None), *MASK_NAMES):
        if (tid := known(name)) is not None:
            return tid
    if len(tok) < V:
        return len(tok)
    for name in RESERVED_NAMES:
        if (tid := known(name)) is not None:
            return tid
    used = {tok.eos_token_id, tok.bos_token_id, tok.pad_token_id}
    for t in reversed(getattr(tok, "additional_special_tokens", None) or []):
        tid = tok.convert_tokens_to_ids(t)
        if tid not in used:
            return int(tid)
    return int(V - 1)
