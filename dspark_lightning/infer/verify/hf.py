"""Step 4 of a round: one batched target forward over every request's [anchor + l_r drafts].

The same forward serves plain decoding (l_r = 0) and speculative rounds, so both share this code.
Prefill runs each prompt alone and inserts its K/V into the batch cache (no padding compute).
The target KV cache is a :class:`RaggedCache` over the HF ``DynamicCache``: rejected drafts are
released after acceptance, never recomputed.
"""

from __future__ import annotations

from typing import Any

import torch

from ...checks import UnsupportedError, UsageError
from ...registry import build, register
from ..protocols import SegmentOutput, Verifier
from .kernels import KernelTable
from .kvcache import RequestCache
from .lean import lean_unsupported

BATCHINGS = ("padded", "flat")


def attention_mask_4d(allowed: torch.Tensor, model, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, K) bool -> the 4D mask HF attention expects: bool for sdpa/flex, additive float otherwise."""
    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl in ("sdpa", "flex_attention"):
        return allowed[:, None]
    neg = torch.finfo(dtype).min
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, neg)[:, None]


@register("verifier", "hf")
class HFVerifier(RequestCache):
    """Verifies drafts with a frozen HF causal LM (:class:`~dspark_lightning.targets.Target`); a
    :class:`~.protocols.Verifier`.

    Args:
        target: the frozen target.
        batching: ``padded`` (one row per request) or ``flat`` (one strip, no padding compute).
    """

    def __init__(self, target, batching: str = "padded") -> None:
        if batching not in BATCHINGS:
            raise UsageError(f"batching must be one of {BATCHINGS}, got {batching!r}")
        self.target = target
        self.batching = batching
        self.device = next(target.model.parameters()).device
        self.dtype = next(target.model.parameters()).dtype
        self.cache = target.new_cache()
        layers = getattr(self.cache, "layers", None)
        if layers is None or any(getattr(layer, "is_sliding", False) for layer in layers):
            raise UnsupportedError(
                f"target {target.name!r}: its KV cache has sliding-window or non-standard layers; "
                "the verifier supports full-attention HF caches (DynamicCache with DynamicLayer)"
            )
        self.windows = target.windows
        if len(self.windows) > 1:
            self._check_mask_mapping(target)
        self._open_cache(layers, batching)  # ``held``: request id -> committed length
        self.pad_id = 0

    @staticmethod
    def _check_mask_mapping(target) -> None:
        """Sliding-window layers beside global ones get their own mask: the model's forward must take one mask per
        layer type (HF models with ``layer_types`` read ``attention_mask`` as a dict keyed by type), else one 4D mask
        would give every layer the same attention, a different function."""
        import inspect

        try:
            src = inspect.getsource(type(target.decoder).forward)
        except (OSError, TypeError):
            src = ""
        if "causal_mask_mapping" not in src:
            raise UnsupportedError(
                f"target {target.name!r}: sliding-window layers, and its forward takes no per-layer-type masks; "
                "the verifier cannot give those layers their window"
            )

    def _masks(self, allowed: torch.Tensor, q_owner, q_pos, S_old: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """The attention mask(s) of one forward: one 4D mask when every layer attends alike, else one per layer type;
        a sliding layer's keys are cut to its window (HF's rule: positions > q - window). Padding queries see
        themselves (no NaN)."""
        model, L = self.target.model, q_pos.shape[1]
        masks = {}
        for kind, window in self.windows.items():
            ok = allowed if window is None else self.kv.attend(q_owner, q_pos, window=window - 1)
            ok[:, torch.arange(L), S_old + torch.arange(L)] = True
            masks[kind] = attention_mask_4d(ok, model, self.dtype)
        return masks if len(masks) > 1 else next(iter(masks.values()))

    def remove(self, ids: list[int]) -> None:
        self._drop(ids)

    @torch.no_grad()
    def forward(
        self,
        ids: list[int],
        tokens: torch.Tensor,  # (R, W) tokens of each request, valid up to lengths[r]
        lengths: torch.Tensor,  # (R,) host data (CPU tensor or list)
        start: torch.Tensor,  # (R,) host data: position of each request's first token
    ) -> SegmentOutput:
        grid = self.kv.grid(ids, lengths)
        W = tokens.shape[1]
        start = torch.as_tensor(start, dtype=torch.long).to(self.device, non_blocking=True)
        pos = start[:, None] + torch.arange(W, device=self.device)  # (R, W)
        inp = grid.scatter(tokens, self.pad_id)  # (rows, L)
        q_pos = grid.scatter(pos, 0)
        q_owner = self._owners(grid, ids)
        S_old = self.kv.length
        self.kv.append(q_owner, q_pos)
        allowed = self.kv.attend(q_owner, q_pos)  # (rows, L, S_old + L)
        out = self.target(
            inp,
            attention_mask=self._masks(allowed, q_owner, q_pos, S_old),
            past_key_values=self.cache,
            position_ids=q_pos,
            use_cache=True,
        )
        return SegmentOutput(hidden=grid.gather(out.hidden), context=grid.gather(out.context))

    @torch.no_grad()
    def prefill(self, ids: list[int], prompts: list[list[int]]) -> SegmentOutput:
        """Prefill prompts grouped by length (no padding compute, no mask) and insert their K/V into the cache.

        Returns per-request outputs padded to the longest prompt, in the order of ``ids``.
        """
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(len(p), []).append(i)
        R, P_max = len(prompts), max(len(p) for p in prompts)
        hidden = context = None
        for P, idx in groups.items():
            tmp = self.target.new_cache()
            x = torch.as_tensor([prompts[i] for i in idx], dtype=torch.long, device=self.device)
            out = self.target(x, past_key_values=tmp, use_cache=True)
            self.held.update((ids[i], P) for i in idx)
            self.kv.insert(
                [ids[i] for i in idx],
                [(layer.keys, layer.values) for layer in tmp.layers],
                torch.arange(P, device=self.device),
            )
            if hidden is None:
                hidden = out.hidden.new_zeros((R, P_max, out.hidden.shape[-1]))
                context = out.context.new_zeros((R, P_max, out.context.shape[-1]))
            sel = torch.as_tensor(idx, device=self.device)
            hidden[sel, :P] = out.hidden
            context[sel, :P] = out.context
        return SegmentOutput(hidden=hidden, context=context)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target logits (..., V) exactly as the model's forward computes them (its LM head and post-processing)."""
        return self.target.logits(hidden)

    def commit(self, ids, keep_pos: torch.Tensor) -> None:
        """Roll request ids[i] back to positions <= keep_pos[i] (drops its rejected drafts' K/V); host data."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        keep = keep_pos.tolist() if isinstance(keep_pos, torch.Tensor) else list(keep_pos)
        self.held.update((rid, int(k) + 1) for rid, k in zip(ids, keep, strict=True))
        self.kv.release_after(ids, torch.as_tensor(keep, dtype=torch.long).to(self.device, non_blocking=True))
        self._compact()


def build_verifier(spec: Any, target, batching: str = "padded", kernels: KernelTable | None = None) -> Verifier:
    """The verifier ``spec`` names (a registered name or ``{class_path, init_args}``); ``auto`` is the lean forward
    where it supports the target and batching, else ``hf``. ``kernels``: the lean forward's kernel table (a
    :class:`~.hardware.HardwareProfile`'s; None: its own choice)."""
    if spec == "auto":
        spec = "lean" if lean_unsupported(target, batching) is None else "hf"
    if spec == "lean" and kernels is not None:
        return build("verifier", spec, target, batching=batching, kernels=kernels)
    return build("verifier", spec, target, batching=batching)
