"""The drafter: composition of a backbone, an optional sequential head and an optional confidence head.

    Drafter(backbone=DenseBackbone(g, num_layers=2), seq_head=VanillaMarkovHead(g), conf_head=ConfidenceHead(g, 256),
            geometry=g, embed=target.embed_tokens, lm_head=target.lm_head, block_size=7, mask_token_id=16)

The token embedding and LM head are the target's own modules, shared and frozen: they are held
by reference (not registered as sub-modules), so they are neither trained, nor saved, nor
counted in the drafter's parameters. With no sequential and no confidence head the same class
is the DFlash baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..checks import UsageError, at_least
from ..layers import block_attention_mask
from ..registry import name_of
from ..targets import TargetGeometry
from .backbones import per_layer_masks

# The block's slots (docs/algorithm.md §3.3): the anchor slot is the first prediction; γ inputs give γ drafts.
CONVENTION = "shifted"


@dataclass
class DraftOutput:
    logits: torch.Tensor  # (B, A, γ, V) final draft logits z_k = U_k + B_k (-inf outside a reduced draft vocabulary)
    conf_logits: torch.Tensor | None  # (B, A, γ) raw confidence logits, or None without a confidence head
    hidden: torch.Tensor  # (B, A, γ, d) backbone outputs h_k


class SharesTargetParts:
    """The target's token embedding and LM head, held by reference in ``self._shared`` (never trained or saved),
    and the optional reduced draft vocabulary (FR-Spec / EAGLE-3): ``draft_vocab`` (N,) sorted target token ids,
    a persistent buffer (saved, hash-checked). The drafter's LM head is then the N rows of the target's, its
    sequential head's W2 has N outputs, and its law q is exactly zero outside the subset (so acceptance stays
    lossless: a draft is always a token with q > 0 and the residual max(0, p_t - q) covers the rest).
    """

    _shared: tuple[nn.Embedding, nn.Linear]
    draft_vocab: torch.Tensor | None

    @property
    def embed(self) -> nn.Embedding:
        return self._shared[0]

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared[1]

    def _init_draft_vocab(self, geometry: TargetGeometry) -> None:
        n = geometry.draft_vocab_size
        if n is not None and not 0 < n <= geometry.vocab_size:
            raise UsageError(f"draft_vocab_size must be in [1, {geometry.vocab_size}], got {n}")
        # -1 = not chosen yet: training picks the most frequent tokens of its data (set_draft_vocab)
        self.register_buffer("draft_vocab", None if n is None else torch.full((n,), -1, dtype=torch.long))

    @property
    def vocab_ready(self) -> bool:
        return self.draft_vocab is None or bool((self.draft_vocab >= 0).all())

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        """Fix the draft vocabulary: N distinct target token ids (sorted here)."""
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().unique()  # sorted, distinct
        check_draft_vocab(
            ids, self.draft_vocab.numel() if self.draft_vocab is not None else -1, self.embed.num_embeddings
        )
        self.draft_vocab.copy_(ids.to(self.draft_vocab.device))

    def vocab_index(self) -> torch.Tensor:
        """(V,) target token id -> its index in the draft vocabulary, -1 outside it (identity without one)."""
        V = self.embed.num_embeddings
        dev = self.embed.weight.device
        if self.draft_vocab is None:
            return torch.arange(V, device=dev)
        inv = torch.full((V,), -1, dtype=torch.long, device=self.draft_vocab.device)
        return inv.index_copy_(0, self.draft_vocab, torch.arange(self.draft_vocab.numel(), device=inv.device))

    def draft_head_weight(self) -> torch.Tensor:
        """(N or V, d): the rows of the target LM head the drafter projects onto."""
        w = self.lm_head.weight
        if self.draft_vocab is None:
            return w
        if not self.vocab_ready:
            raise RuntimeError("the draft vocabulary is not set: call set_draft_vocab(ids) (fit does it from its data)")
        return w.index_select(0, self.draft_vocab)

    def draft_logits(self, h: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Base logits over the draft vocabulary (..., N or V); ``weight`` = a cached :meth:`draft_head_weight`."""
        w = self.draft_head_weight() if weight is None else weight
        b = getattr(self.lm_head, "bias", None)
        if b is not None and self.draft_vocab is not None:
            b = b.index_select(0, self.draft_vocab)
        if w.dtype != h.dtype:  # the frozen target may run in another precision than the drafter
            w, b = w.to(h.dtype), None if b is None else b.to(h.dtype)
        return torch.nn.functional.linear(h, w, b)

    def full_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (..., N) -> target-vocabulary logits (..., V), -inf outside the subset."""
        if self.draft_vocab is None:
            return z
        out = z.new_full((*z.shape[:-1], self.embed.num_embeddings), float("-inf"))
        return out.index_copy(-1, self.draft_vocab, z)


def check_draft_vocab(ids: torch.Tensor, size: int, vocab_size: int) -> None:
    """A draft vocabulary must be ``size`` distinct, sorted ids in [0, vocab_size)."""
    if size < 0:
        raise UsageError("this drafter was built without a reduced draft vocabulary (draft_vocab_size)")
    if ids.numel() != size:
        raise UsageError(f"the draft vocabulary needs {size} distinct token ids, got {ids.numel()}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise UsageError(f"draft vocabulary ids must lie in [0, {vocab_size})")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise UsageError("draft vocabulary ids must be sorted and distinct")


class Drafter(SharesTargetParts, nn.Module):
    proposer_name = "block"  # the runtime's proposer for it (registry kind "proposer", infer/propose/draft.py)

    def __init__(
        self,
        backbone: nn.Module,
        seq_head: nn.Module | None = None,
        conf_head: nn.Module | None = None,
        *,
        geometry: TargetGeometry,
        embed: nn.Embedding,
        lm_head: nn.Linear,
        block_size: int = 7,
        mask_token_id: int,
    ) -> None:
        super().__init__()
        at_least("block_size", block_size, 1)  # an int: a string or a float is named here, not compared below
        if conf_head is not None and getattr(conf_head, "token_dim", 0) not in (0, getattr(seq_head, "token_dim", 0)):
            raise UsageError("conf_head.token_dim must be 0 or the sequential head's token_dim")
        for name, mod in (("embedding", embed), ("lm_head", lm_head)):
            shape = tuple(mod.weight.shape)
            if shape != (geometry.vocab_size, geometry.hidden_size):
                raise UsageError(
                    f"target {name} has shape {shape}, expected (vocab, hidden) = "
                    f"({geometry.vocab_size}, {geometry.hidden_size})"
                )
        self.backbone, self.seq_head, self.conf_head = backbone, seq_head, conf_head
        self.geometry = geometry
        self.block_size = block_size
        self.mask_token_id = int(mask_token_id)
        self.convention = CONVENTION
        self._shared = (embed, lm_head)  # a tuple attribute is not a registered sub-module
        self._init_draft_vocab(geometry)

    def config(self) -> dict[str, Any]:
        """Everything needed to rebuild this drafter from the registry (see export.py)."""

        def part(m: nn.Module | None) -> dict[str, Any] | None:
            return None if m is None else {"class_path": name_of(m), "init_args": dict(getattr(m, "hparams", {}))}

        return {
            "convention": self.convention,
            "block_size": self.block_size,
            "mask_token_id": self.mask_token_id,
            "geometry": self.geometry.to_dict(),  # draft_vocab_size: the reduced vocabulary's size (None = full)
            "backbone": part(self.backbone),
            "seq_head": part(self.seq_head),
            "conf_head": part(self.conf_head),
        }

    # --- training forward ------------------------------------------------------------------
    def forward(
        self,
        context: torch.Tensor,  # (B, S, n*d) raw tapped target features
        input_ids: torch.Tensor,  # (B, S)
        anchors: torch.Tensor,  # (B, A) anchor positions (sorted; dummies anywhere valid)
        valid: torch.Tensor,  # (B, A) bool
        hidden: torch.Tensor | None = None,  # (B, S, d) target final hidden states (the context state, chain drafters)
        block_size: int | None = None,  # a shorter training block (a curriculum's early phase); None = γ
        full_vocab: bool = True,  # False: logits over the draft vocabulary only (N columns), for the subset loss
    ) -> DraftOutput:
        """Teacher-forced forward over A packed anchor blocks per sequence (docs/algorithm.md §3.4-3.5)."""
        B, S = input_ids.shape
        A, g = anchors.shape[1], block_size or self.block_size
        if not 1 <= g <= self.block_size:
            raise UsageError(f"a training block must have 1..{self.block_size} slots, got {g}")
        device = input_ids.device
        offs = torch.arange(g, device=device)
        # Block inputs [x_a, M x (γ-1)] and teacher-forced previous tokens [x_a, x_{a+1} .. x_{a+γ-1}].
        gather = (anchors[:, :, None] + offs).clamp(max=S - 1)  # (B, A, γ)
        prev = torch.gather(input_ids, 1, gather.view(B, -1)).view(B, A, g)  # (B, A, γ)
        blk_ids = torch.full_like(prev, self.mask_token_id)
        blk_ids[:, :, 0] = prev[:, :, 0]
        x = self.embed(blk_ids).view(B, A * g, -1)  # (B, A*γ, d)
        if getattr(self.backbone, "context_state", False):
            if hidden is None:
                raise UsageError("a backbone with context_state needs the target's final hidden states")
            idx = (anchors - 1).clamp(min=0)  # h^T_{a-1}: the target state that produced the anchor
            state = torch.gather(hidden, 1, idx[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, A, d)
            x = self.backbone.inject_state(x.view(B, A, g, -1), state.to(x.dtype)).view(B, A * g, -1)
        positions = (anchors[:, :, None] + offs).view(B, A * g)  # (B, A*γ)
        fused = self.backbone.fuse(context)  # (B, S, d)
        ctx_pos = torch.arange(S, device=device).expand(B, S)
        ctx_kv = self.backbone.context_kv(fused, ctx_pos)
        mask = per_layer_masks(self.backbone, lambda w: block_attention_mask(anchors, valid, S, g, w))
        h = self.backbone(x, positions, ctx_kv, mask).view(B * A, g, -1)  # (B*A, γ, d)
        logits = self.draft_logits(h)  # (B*A, γ, N) base logits U_k over the draft vocabulary
        prev = prev.view(B * A, g)
        feat = None
        if self.seq_head is not None:
            bias, feat = self.seq_head.teacher_forced(h, prev)
            logits = logits + bias
        conf = None
        if self.conf_head is not None:  # a head that reads the draft logits says so (draft_features)
            extra = (logits,) if getattr(self.conf_head, "draft_features", ()) else ()
            conf = self.conf_head(h, feat, *extra).view(B, A, g)
        if full_vocab:
            logits = self.full_logits(logits)  # (B*A, γ, V), -inf outside a reduced draft vocabulary
        return DraftOutput(logits=logits.view(B, A, g, -1), conf_logits=conf, hidden=h.view(B, A, g, -1))
