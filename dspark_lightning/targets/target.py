"""Frozen target LM adapter: any Hugging Face causal LM as a DSpark target.

Exposes what the drafter needs (SPEC §3.1-3.2, pitfall 3):
- raw outputs of the tapped decoder layers (forward hooks; never the last layer),
- the final-norm hidden state and logits through the target's own lm_head,
- the embedding and lm_head modules that the drafter shares (frozen),
- tokenizer, chat format, and a KV cache for decoding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from .chat import ChatFormat, encode_conversation, render_prompt


def default_layer_ids(num_layers: int, n: int = 5) -> list[int]:
    """DFlash layer rule (SPEC §3.2): n ids evenly spaced on [1, L-3], Python's round (half to even)."""
    if num_layers < 4:
        raise ValueError(f"the default layer rule needs a target with at least 4 layers, got {num_layers}")
    if n == 1:
        return [1]
    return [round(1 + i * (num_layers - 4) / (n - 1)) for i in range(n)]


def check_layer_ids(layer_ids: list[int], num_layers: int) -> list[int]:
    ids = [int(x) for x in layer_ids]
    if not ids:
        raise ValueError("layer_ids must name at least one target layer")
    bad = [x for x in ids if not 0 <= x < num_layers - 1]
    if bad:
        raise ValueError(
            f"layer_ids {bad} out of range: tap layers 0..{num_layers - 2} of this {num_layers}-layer target "
            "(the last layer is excluded: its output feeds the final norm directly)"
        )
    return ids


@dataclass(frozen=True)
class TargetGeometry:
    """Shapes the drafter copies from the target (SPEC §3.1). Hashable, JSON-friendly."""

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


@dataclass
class TargetOutput:
    context: torch.Tensor  # (B, S, n*d) raw tapped-layer outputs, concatenated in layer_ids order
    hidden: torch.Tensor  # (B, S, d) final-norm hidden state
    past_key_values: Any = None


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
        self._captured: dict[int, torch.Tensor] = {}
        layers = self.decoder_layers
        for lid in sorted(set(ids)):
            layers[lid].register_forward_hook(self._make_hook(lid))

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

    def _make_hook(self, lid: int):
        def hook(_module: nn.Module, _inp: Any, out: Any) -> None:
            self._captured[lid] = out[0] if isinstance(out, tuple) else out

        return hook

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
        self._captured.clear()
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=past_key_values,  # transformers >= 5.20 names it `cache`
            use_cache=use_cache,
        )
        context = torch.cat([self._captured[lid] for lid in self.geometry.layer_ids], dim=-1)  # (B, S, n*d)
        self._captured.clear()
        return TargetOutput(context=context, hidden=out.last_hidden_state, past_key_values=out.cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target logits through its own lm_head: (..., d) -> (..., V)."""
        return self.lm_head(hidden)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    # --- text ------------------------------------------------------------------------------
    def render_prompt(self, turns: list[dict[str, str]]) -> list[int]:
        return render_prompt(self.tokenizer, turns, self.chat)

    def encode_conversation(self, turns: list[dict[str, str]]) -> tuple[list[int], list[int]]:
        return encode_conversation(self.tokenizer, turns, self.chat, self.eos_token_id)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "geometry": self.geometry.to_dict(), "chat": self.chat.to_dict()}
