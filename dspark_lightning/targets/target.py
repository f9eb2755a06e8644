"""Frozen target LM adapter: any Hugging Face causal LM as a DSpark target.

Exposes what the drafter needs (docs/algorithm.md §3.1-3.2, pitfall 3):
- raw outputs of the tapped decoder layers (forward hooks; never the last layer),
- the final-norm hidden state, and logits exactly as the model's own forward computes them (its LM head, then
  its logit post-processing: scales, soft caps; see :data:`HEAD_STEPS`),
- the embedding and lm_head modules that the drafter shares (frozen),
- tokenizer, chat format, and a KV cache for decoding.

One target can serve several threads at once: the tapped outputs of a forward are collected per call.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..checks import UsageError
from .chat import ChatFormat, encode_conversation, has_template, render_prompt


def default_layer_ids(num_layers: int, n: int = 5) -> list[int]:
    """DFlash layer rule (docs/algorithm.md §3.2): n ids evenly spaced on [1, L-3], Python's round (half to even).

    A target under 8 layers has fewer than n distinct layers there: each is tapped once (4 layers: [1]; 6: [1, 2, 3])
    rather than the same layer's output concatenated several times."""
    if num_layers < 4:
        raise UsageError(f"the default layer rule needs a target with at least 4 layers, got {num_layers}")
    if n == 1:
        return [1]
    return list(dict.fromkeys(round(1 + i * (num_layers - 4) / (n - 1)) for i in range(n)))


def check_layer_ids(layer_ids: list[int], num_layers: int) -> list[int]:
    ids = [int(x) for x in layer_ids]
    if not ids:
        raise UsageError("layer_ids must name at least one target layer")
    bad = [x for x in ids if not 0 <= x < num_layers - 1]
    if bad:
        raise UsageError(
            f"layer_ids {bad} out of range: tap layers 0..{num_layers - 2} of this {num_layers}-layer target "
            "(the last layer is excluded: its output feeds the final norm directly)"
        )
    return ids


@dataclass(frozen=True)
class TargetGeometry:
    """Shapes the drafter copies from the target (docs/algorithm.md §3.1). Hashable, JSON-friendly."""

    hidden_size: int
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    layer_ids: tuple[int, ...] = field(default_factory=tuple)
    draft_vocab_size: int | None = None  # a drafter's reduced output vocabulary (None: the whole vocabulary)

    @property
    def n_tapped(self) -> int:
        return len(self.layer_ids)

    @property
    def out_vocab(self) -> int:
        """Width of a drafter's output layers: the draft vocabulary if reduced, else the target vocabulary."""
        return self.draft_vocab_size or self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_ids"] = list(self.layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetGeometry:
        return cls(**{**d, "layer_ids": tuple(d["layer_ids"])})

    @classmethod
    def from_config(cls, cfg: Any, layer_ids: list[int]) -> TargetGeometry:
        heads = cfg.num_attention_heads
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope = rope.get("full_attention", rope)  # per layer type (Gemma 3): the drafter's layers attend fully
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        return cls(
            hidden_size=cfg.hidden_size,
            vocab_size=cfg.vocab_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            intermediate_size=cfg.intermediate_size,
            rope_theta=float(theta),
            rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
            layer_ids=tuple(layer_ids),
        )


def _softcap(z: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(z / cap) * cap


def _softcap_fp32(z: torch.Tensor, cap: float) -> torch.Tensor:
    return _softcap(z.float(), cap)


# What HF causal LMs do to the LM head's output before returning it (transformers' ``*ForCausalLM.forward``),
# keyed by the config attribute that holds the constant; None (or no such attribute) switches the step off.
# The target's sampling law is softmax of the result (docs/algorithm.md §1, losslessness (ii)); the load-time probe
# (:meth:`Target.check_head`) refuses any model whose forward does something else.
HEAD_STEPS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "logits_scaling": lambda z, s: z / s,  # Granite family (µP)
    "logit_scale": lambda z, s: z * s,  # Cohere family
    "lm_head_multiplier": lambda z, s: z * s,  # Falcon-H1
    "final_logit_softcapping": _softcap,  # Gemma 2-4, VaultGemma, NanoChat
    "logits_soft_cap": _softcap,  # RecurrentGemma
}
# Model types whose forward uses one of those attributes differently.
HEAD_STEP_OVERRIDES: dict[tuple[str, str], Callable[[torch.Tensor, float], torch.Tensor]] = {
    ("hyperclovax", "logits_scaling"): lambda z, s: z * s,  # multiplies where Granite divides
    ("beam", "final_logit_softcapping"): _softcap_fp32,  # these soft-cap in float32
    ("inkling2", "final_logit_softcapping"): _softcap_fp32,
    ("inkling2_loop", "final_logit_softcapping"): _softcap_fp32,
}
PROBE_TOKENS = 8  # tokens of the load-time check of the logit law


def head_steps(cfg: Any) -> list[tuple[Callable[[torch.Tensor, float], torch.Tensor], float]]:
    """The (operation, constant) steps this config's forward applies after its LM head, in order."""
    kind = getattr(cfg, "model_type", "")
    steps = []
    for attr, op in HEAD_STEPS.items():
        value = getattr(cfg, attr, None)
        if value is not None:
            steps.append((HEAD_STEP_OVERRIDES.get((kind, attr), op), float(value)))
    return steps


# The tapped layers' outputs of the target forward running in this thread (or task), or None outside one: per
# call, not on the module, so that threads sharing a target never read each other's layers.
_CAPTURE: ContextVar[dict[int, torch.Tensor] | None] = ContextVar("dspark_target_capture", default=None)


@dataclass
class TargetOutput:
    context: torch.Tensor  # (B, S, n*d) raw tapped-layer outputs, concatenated in layer_ids order
    hidden: torch.Tensor  # (B, S, d) final-norm hidden state
    past_key_values: Any = None


def _capture_hook(lid: int):
    """A forward hook storing decoder layer ``lid``'s raw output into the calling forward's capture (if any)."""

    def hook(_module: nn.Module, _inp: Any, out: Any) -> None:
        captured = _CAPTURE.get()
        if captured is not None:
            captured[lid] = out[0] if isinstance(out, tuple) else out

    return hook


class Target(nn.Module):
    """A frozen HF causal LM with tapped layers. Build it with :func:`dspark_lightning.load_target`."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        name: str,
        layer_ids: list[int] | None = None,
        chat: ChatFormat | None = None,
    ) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        cfg = model.config
        ids = check_layer_ids(
            layer_ids if layer_ids is not None else default_layer_ids(cfg.num_hidden_layers), cfg.num_hidden_layers
        )
        self.geometry = TargetGeometry.from_config(cfg, ids)
        self.chat = chat or ChatFormat()
        self._said_untemplated = False
        self._head_steps = head_steps(cfg)
        self._tap_hooks = self._hook_layers(ids)
        self.check_head()

    # --- taps ------------------------------------------------------------------------------
    def _hook_layers(self, ids: list[int]) -> list[Any]:
        """A capture hook on each distinct tapped layer; returns the hook handles."""
        layers = self.decoder_layers
        return [layers[lid].register_forward_hook(_capture_hook(lid)) for lid in sorted(set(ids))]

    def tap(self, layer_ids: Sequence[int]) -> Target:
        """Tap ``layer_ids`` from now on: which decoder layers' outputs :meth:`forward` returns as ``context``
        (``geometry.layer_ids``). Taps are not weights, so one loaded model serves a drafter trained on any taps;
        ``load_drafter``, ``decode()`` and ``checkpoint.load_target_and_drafters`` re-tap a target to the layers its
        drafter reads. The ids are checked (:func:`check_layer_ids`) before anything changes.

        The target then serves drafters of those taps only: an engine built earlier keeps the taps it was built with
        (``decode()`` builds one per call), and threads sharing the target must share its taps (re-tapping while
        another thread runs a forward of it is not supported).
        """
        if not isinstance(layer_ids, list | tuple) or any(isinstance(i, bool) or not isinstance(i, int)
                                                         for i in layer_ids):  # fmt: skip
            raise UsageError(f"layer_ids must be a list of layer numbers (integers), got {layer_ids!r}")
        ids = check_layer_ids(list(layer_ids), self.geometry.num_layers)
        if tuple(ids) == self.geometry.layer_ids:
            return self
        for handle in self._tap_hooks:
            handle.remove()
        self._tap_hooks = self._hook_layers(ids)
        self.geometry = replace(self.geometry, layer_ids=tuple(ids))
        return self

    # --- structure -------------------------------------------------------------------------
    @property
    def decoder(self) -> nn.Module:
        """The base decoder stack (HF ``model.model``), without the LM head."""
        return self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.decoder.layers

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def stop_token_ids(self) -> list[int]:
        ids = {self.eos_token_id}
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(eos)
        return sorted(ids)

    def train(self, mode: bool = True) -> Target:  # the target is always frozen and in eval mode
        return super().train(False)

    # --- compute ---------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # (B, S)
        attention_mask: torch.Tensor | None = None,  # (B, S) 1 = real token
        past_key_values: Any = None,
        position_ids: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> TargetOutput:
        captured: dict[int, torch.Tensor] = {}
        token = _CAPTURE.set(captured)
        try:
            out = self.decoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=past_key_values,  # transformers >= 5.20 names it `cache`
                use_cache=use_cache,
            )
        finally:
            _CAPTURE.reset(token)
        context = torch.cat([captured[lid] for lid in self.geometry.layer_ids], dim=-1)  # (B, S, n*d)
        return TargetOutput(context=context, hidden=out.last_hidden_state, past_key_values=out.cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits exactly as its own forward computes them: (..., d) -> (..., V).

        The one function every target law goes through: verification, the SPS profile and the training labels.
        """
        return self.finish_logits(self.lm_head(hidden))

    def finish_logits(self, z: torch.Tensor) -> torch.Tensor:
        """The model's post-processing of its LM head's output (scales, soft caps; :data:`HEAD_STEPS`), for
        callers that compute the LM head product themselves (the lean verifier)."""
        for op, value in self._head_steps:
            z = op(z, value)
        return z

    @torch.no_grad()
    def check_head(self) -> None:
        """Refuse a model whose forward turns hidden states into logits in a way :meth:`logits` does not reproduce.

        Compares the log-laws of :meth:`logits` and of the model's own ``forward().logits`` on a few tokens (two
        tiny forwards at load time). Both run the same operations, so they agree to rounding; a missed scale or
        soft cap moves them by far more than the tolerance.
        """
        V = self.geometry.vocab_size
        dev = self.embed_tokens.weight.device
        ids = (torch.arange(1, PROBE_TOKENS + 1, device=dev) * 7919 % V)[None]  # (1, S) spread over the vocabulary
        ours = self.logits(self.forward(ids).hidden).float()
        theirs = self.model(input_ids=ids, use_cache=False).logits.float()
        kind = getattr(self.model.config, "model_type", "?")
        if ours.shape != theirs.shape:
            raise UsageError(
                f"target {self.name!r} ({kind}): its forward returns logits of shape {tuple(theirs.shape)}, its LM "
                f"head {tuple(ours.shape)}; dspark-lightning cannot reproduce this model's sampling law"
            )
        scale = theirs.nan_to_num(0.0, 0.0, 0.0).abs().max().item()  # rounding is relative to the logits' size
        tol = max(1e-5, 8 * torch.finfo(self.dtype).eps * (1 + scale))
        ours, theirs = ours.log_softmax(-1), theirs.log_softmax(-1)
        if not torch.isclose(ours, theirs, rtol=0, atol=tol, equal_nan=True).all():
            diff = (ours - theirs).abs().nan_to_num(0.0).max().item()
            raise UsageError(
                f"target {self.name!r} ({kind}): its forward post-processes the LM head's logits in a way "
                f"dspark-lightning cannot reproduce (log-probabilities differ by {diff:.3g} on a probe; known steps: "
                f"{', '.join(HEAD_STEPS)}), so speculative sampling from it would not be lossless"
            )

    @property
    def windows(self) -> dict[str, int | None]:
        """Attention window of each layer type the model uses (``full_attention``: None); HF's sliding rule: a query
        at position q sees keys at positions > q - window."""
        cfg = self.model.config
        window = getattr(cfg, "sliding_window", None)
        types = getattr(cfg, "layer_types", None)
        if not types:  # one kind for every layer (Mistral: sliding wherever a window is set)
            sliding = window is not None and getattr(cfg, "use_sliding_window", True)
            types = ["sliding_attention" if sliding else "full_attention"]
        return {t: (window if t == "sliding_attention" else None) for t in set(types)}

    def new_cache(self) -> Any:
        """An HF cache that keeps every position of every layer (sliding-window layers included): rolling back a
        rejected draft needs the keys a sliding cache would have dropped; the window is a mask (the verifier's)."""
        import copy

        from transformers import DynamicCache

        cfg = self.model.config
        if any(w is not None for w in self.windows.values()):
            cfg = copy.copy(cfg)
            cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
        return DynamicCache(config=cfg)

    # --- text ------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[dict[str, str]], chat: bool = True) -> list[int]:
        """The ids of a prompt, the one rule every stage uses (docs/inference.md, "Prompts"):

        - ``chat`` and a chat template (the chat format's recorded one, else the tokenizer's): the template's ids,
          ``apply_chat_template(turns, add_generation_prompt=True)`` (a string is one user turn; special-token
          strings in the turns stay text);
        - no template, or ``chat=False``: the text as the tokenizer encodes it on its own, ``tokenizer(text)`` with
          its BOS / EOS rules (turns are their contents joined). A target asked for chat that has no template says
          so once, in one line.
        """
        if not chat:
            text = prompt if isinstance(prompt, str) else "".join(t["content"] for t in prompt)
            return list(self.tokenizer(text)["input_ids"])
        turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.chat.use_chat_template and not has_template(self.tokenizer, self.chat) and not self._said_untemplated:
            self._said_untemplated = True
            msg = (f"target {self.name!r} has no chat template: prompts are encoded as its tokenizer encodes plain "
                   "text (pass chat=False to say so, or give the recipe a chat_template)")  # fmt: skip
            warnings.warn(msg, stacklevel=2)
        return render_prompt(self.tokenizer, turns, self.chat)

    def encode_conversation(self, turns: list[dict[str, str]]) -> tuple[list[int], list[int]]:
        return encode_conversation(self.tokenizer, turns, self.chat, self.eos_token_id)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "geometry": self.geometry.to_dict(), "chat": self.chat.to_dict()}
