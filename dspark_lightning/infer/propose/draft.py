"""Step 2 of a round: the drafter proposes a block for every active request.

:class:`BlockProposer` runs a parallel-backbone :class:`~dspark_lightning.drafters.Drafter`
(DSpark, DFlash): one backbone forward over [cached context K/V; block], then the sequential
head left to right (docs/algorithm.md §3.5 "Inference"): z_k = U_k + B_k(x_{k-1}), q_k = softmax(z_k / T) in
fp32 once, c_k from the confidence head (before x_k exists), x_k ~ q_k from that same tensor.

The drafter context cache holds the K/V of the fused target features of every committed
position; after each round :meth:`BlockProposer.extend` appends the anchor and accepted drafts'
features taken from the target's verification pass (docs/algorithm.md §3.7), so nothing is recomputed.

Other drafter families plug in on this (runtime) side through the one registry: ``@register("proposer", name)`` on a
factory ``(drafter, batching, confidence) -> proposer``, and ``proposer_name = name`` on the drafter class. A
proposer is a :class:`~.protocols.Proposer`: ``block_size`` and the ``add / remove / extend / propose`` methods (as the
chain drafters' :class:`~.chain.ChainProposer` has them); ``extend`` also receives ``hidden=``
(the target's final hidden states) and ``propose`` receives ``requests=`` (prompt and output token lists) for proposers
that need them. :class:`~.proposer.ProposerBase` holds what the proposers with a drafter context cache share (its
per-request bookkeeping, the draft-vocabulary mapping), :class:`~.proposer.StatelessProposer` is the base of one
without a cache. The model layer (``drafters/``) never imports the runtime: it names its proposer. A third-party drafter
may instead carry a ``make_proposer(batching, confidence)`` method (``confidence``: the drafter's calibrated
:class:`~dspark_lightning.checkpoint.calibration.ConfidenceMap` for this serving temperature, or None).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ...checkpoint.calibration import ConfidenceMap
from ...checks import UsageError
from ...drafters.backbones import per_layer_masks
from ...registry import create, register
from ..acceptance.sampling import SamplingParams, probs, sample
from ..verify import kernels as kernel_tables
from ..verify.kernels import Linear
from ..verify.kvcache import KVLayer
from .proposer import ProposerBase, draft_confidence


@dataclass
class Proposal:
    tokens: torch.Tensor  # (R, γ) draft tokens x_1..x_γ
    q: torch.Tensor  # (R, γ, V) fp32 laws the tokens were sampled from
    conf: torch.Tensor  # (R, γ) conditional confidences ĉ_k in [0, 1], each computed before x_k was sampled
    logits: torch.Tensor  # (R, γ, V) final draft logits z_k
    conf_logits: torch.Tensor | None = None  # (R, γ) raw confidence-head logits (before calibration), with a head
    margins: torch.Tensor | None = None  # (R, γ) top-2 margins of the draft logits z_k (known before x_k is drawn)


class Stopwatch:
    """Per-component wall time of a proposer (``timing`` dict, seconds), off unless ``enable()`` was called."""

    def __init__(self) -> None:
        self.timing: dict[str, float] | None = None
        self._t = 0.0

    def enable(self) -> dict[str, float]:
        self.timing = {}
        return self.timing

    def start(self) -> None:
        if self.timing is not None:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.timing is not None:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # profiling only: on a GPU a lap must include the launched work
            now = time.perf_counter()
            self.timing[name] = self.timing.get(name, 0.0) + now - self._t
            self._t = now


def _head_product(drafter, weight: torch.Tensor) -> Linear | None:
    """The draft LM head through this CPU's fastest kernel for its shape (:mod:`.kernels`); None (``draft_logits``'
    ``F.linear``) on a GPU or for a head with a bias."""
    if weight.device.type != "cpu" or getattr(drafter.lm_head, "bias", None) is not None:
        return None
    key = kernel_tables.shape_key(weight)
    table = kernel_tables.for_weights({key}, lambda: {key: [(weight, None)]}, weight.device, weight.dtype)
    return None if table is None else Linear(weight, None, table)


def make_proposer(drafter, batching: str = "padded", confidence=None):
    """The inference-side proposer of ``drafter``: the registered proposer its class names (``proposer_name``), else
    its own ``make_proposer`` method (third-party drafters)."""
    name = getattr(drafter, "proposer_name", None)
    if name is not None:
        return create("proposer", name, drafter, batching=batching, confidence=confidence)
    if hasattr(drafter, "make_proposer"):
        return drafter.make_proposer(batching=batching, confidence=confidence)
    raise TypeError(f"{type(drafter).__name__} is not a drafter decode() can run (no proposer registered for it)")


class BlockProposer(ProposerBase):
    """Proposes γ tokens per request with a parallel backbone plus optional sequential/confidence heads.

    Args:
        drafter: the composed drafter (eval mode, frozen).
        batching: ``padded`` or ``flat``: how requests share the drafter's forward (see :mod:`.kvcache`).
        confidence: a :class:`~dspark_lightning.checkpoint.calibration.ConfidenceMap` of ``block_size`` positions
            (ĉ_k from the head's logit and the draft's top-2 margin); None = the raw head (or, without a head, the
            draft's own top probability).
    """

    def __init__(self, drafter, batching: str = "padded", confidence: ConfidenceMap | None = None) -> None:
        bb = drafter.backbone
        super().__init__(drafter, [KVLayer() for _ in bb.layers], batching)
        if confidence is not None:
            if len(confidence) != self.block_size:
                raise UsageError(f"a confidence map of {len(confidence)} positions for a block of {self.block_size}")
            if confidence.reads_head and drafter.conf_head is None:
                raise UsageError("the confidence map reads a confidence head this drafter does not have")
        self.confidence = confidence
        self.head = _head_product(drafter, self.head_w)
        self.state: dict[int, torch.Tensor] | None = {} if getattr(bb, "context_state", False) else None
        self.clock = Stopwatch()  # clock.enable() -> per-component times (benchmarks/profile_breakdown.py draft)

    def forget(self, ids: list[int]) -> None:
        if self.state is not None:
            for i in ids:
                self.state.pop(i, None)

    @torch.no_grad()
    def extend(self, ids: list[int], context: torch.Tensor, start: torch.Tensor, lengths: torch.Tensor, hidden=None):
        """Append the target features (R, W, n*d) of positions start..start+lengths-1 to the context cache (and,
        for a ``context_state`` backbone, keep each request's last final hidden state (R, d) for its next block).
        ``start`` and ``lengths`` are best given on the host (CPU tensors): shapes are read from them."""
        self.clock.start()
        n = lengths.tolist()
        for rid, s0, k in zip(ids, start.tolist(), n, strict=True):
            self.held[rid] = max(self.held.get(rid, 0), s0 + k)
        lengths = lengths.to(self.device, non_blocking=True)
        if self.state is not None:
            if hidden is None:
                raise UsageError("this drafter's backbone reads the target's final hidden states (context_state)")
            rows = torch.arange(len(ids), device=hidden.device)
            last = hidden[rows, lengths.to(hidden.device) - 1].to(self.device, self.dtype)  # (R, d)
            self.state.update(zip(ids, last.unbind(0), strict=True))
        bb = self.drafter.backbone
        grid = self.kv.grid(ids, n)
        W = max(n, default=0)
        pos = start.to(self.device, non_blocking=True)[:, None] + torch.arange(W, device=self.device)
        fused = grid.scatter(bb.fuse(context[:, :W].to(self.dtype)), 0.0)  # (rows, L, d)
        q_pos = grid.scatter(pos, 0)
        self._commit(bb.context_kv(fused, q_pos), self._owners(grid, ids), q_pos)
        self.clock.lap("extend")

    @torch.no_grad()
    def propose(
        self,
        ids: list[int],
        anchors: torch.Tensor,  # (R,) x_0
        anchor_pos: torch.Tensor,  # (R,) P
        params: SamplingParams,
        generator: torch.Generator | None = None,
        teacher_tokens: torch.Tensor | None = None,  # (R, γ) force x_1..x_γ (train/infer parity tests)
        requests=None,  # the engine's Request objects (token histories), for proposers that need them
    ) -> Proposal:
        d, g = self.drafter, self.block_size
        R = len(ids)
        self.clock.start()
        grid = self.kv.grid(ids, [g] * R)
        blk = torch.full((R, g), d.mask_token_id, dtype=torch.long, device=self.device)
        blk[:, 0] = anchors  # [x_0, M x (γ-1)] at P..P+γ-1 (shifted convention)
        pos = anchor_pos[:, None] + torch.arange(g, device=self.device)  # (R, γ)
        q_owner = self._owners(grid, ids)  # (rows, L)
        q_anchor = grid.scatter(anchor_pos[:, None].expand(R, g), 0)
        blk_ok = (q_owner[:, :, None] == q_owner[:, None, :]) & (q_owner[:, :, None] >= 0)  # own block only

        def mask(window):  # context strictly before the anchor (and within the layer's window), own block
            return torch.cat([self.kv.attend(q_owner, q_anchor, strict=True, window=window), blk_ok], dim=-1)

        x = d.embed(blk).to(self.dtype)  # (R, γ, d)
        if self.state is not None:
            x = d.backbone.inject_state(x, torch.stack([self.state[i] for i in ids]))
        x = grid.scatter(x, 0.0)  # (rows, L, d)
        # preallocated layers (KVLayer): each layer's block keys are written past its context, nothing is copied
        ctx_kv = [layer if hasattr(layer, "lookahead") else (layer.keys, layer.values) for layer in self.kv.layers]
        h = d.backbone(x, grid.scatter(pos, 0), ctx_kv, per_layer_masks(d.backbone, mask))
        h = grid.gather(h)  # (R, γ, d)
        self.clock.lap("backbone")
        base = self.head(h) if self.head is not None else d.draft_logits(h, self.head_w)  # (R, γ, N) U_k
        self.clock.lap("lm_head")
        return self._sequential(h, base, anchors, params, generator, teacher_tokens)

    def _sequential(self, h, base, anchors, params, generator, teacher_tokens) -> Proposal:
        d, g = self.drafter, self.block_size
        sh, ch = d.seq_head, d.conf_head
        R = h.shape[0]
        prev = anchors
        state = sh.init_state(R, h) if sh is not None else None
        toks, qs, confs, zs, raw, margins = [], [], [], [], [], []
        reads_logits = bool(getattr(ch, "draft_features", ()))
        clock = self.clock
        for k in range(g):
            z, feat = base[:, k], None
            if sh is not None:
                bias, feat, state = sh.step(h[:, k], prev, state)
                z = z + bias
                clock.lap("sequential")
            logit = None
            if ch is not None:
                logit = (ch(h[:, k], feat, z) if reads_logits else ch(h[:, k], feat)).float()
                raw.append(logit)
            top2 = z.float().topk(2, dim=-1).values
            margin = top2[:, 0] - top2[:, 1]
            margins.append(margin)
            if self.confidence is not None:
                c = torch.sigmoid(self.confidence.logit(k, logit, margin))
            elif logit is not None:
                c = torch.sigmoid(logit)
            clock.lap("confidence")
            q = probs(z, params)  # (R, N) fp32: sampled from and tested against
            if ch is None and self.confidence is None:
                c = draft_confidence(q, z, params)
            x = self._target_ids(sample(q, params, generator))
            clock.lap("sampling")
            if teacher_tokens is not None:
                x = teacher_tokens[:, k]
            toks.append(x)
            qs.append(q)
            confs.append(c)
            zs.append(z)
            prev = x
        q, z = self._target_laws(torch.stack(qs, 1), torch.stack(zs, 1))
        clock.lap("sampling")
        return Proposal(
            tokens=torch.stack(toks, 1),
            q=q,
            conf=torch.stack(confs, 1),
            logits=z,
            conf_logits=torch.stack(raw, 1) if raw else None,
            margins=torch.stack(margins, 1),
        )


@register("proposer", "block")
def block_proposer(drafter, batching: str = "padded", confidence: ConfidenceMap | None = None) -> BlockProposer:
    """The proposer of every :class:`~dspark_lightning.drafters.Drafter` (``proposer_name = "block"``)."""
    return BlockProposer(drafter, batching=batching, confidence=confidence)
