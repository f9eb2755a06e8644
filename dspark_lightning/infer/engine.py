"""The decoding engine: requests in, one round per :meth:`Engine.step` for every active request.

A round, one method each:

    1. gate      whether the drafter runs this step at all (a scheduler's draft gate, from earlier steps only)
    2. draft     the proposer drafts a block per request (tokens, fp32 laws q, confidences ĉ)
    3. schedule  the scheduler picks each request's verification length l_r from ĉ alone
    4. verify    one target forward over every request's [anchor + l_r drafts]
    5. accept    the acceptance mode accepts m_r drafts and draws the recovered or bonus token
    6. commit    outputs, stop tokens and the round log; both caches keep the committed positions only

With no drafter, or on a step the gate skips, every round verifies the anchor only (l_r = 0): plain decoding,
same code. Requests can be added at any time (continuous batching) and finish independently. The parts the engine
drives are declared in :mod:`.protocols` and, for the scheduler, by its base class :class:`~.schedulers.Scheduler`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..checks import UsageError, short
from ..registry import build, resolve
from .acceptance.accept import Acceptance
from .acceptance.sampling import SamplingParams, target_law
from .hardware import HardwareProfile
from .propose.backlog import ContextBacklog
from .propose.draft import Proposal
from .protocols import AcceptanceMode, KernelChoice, Proposer, ReducedVocabulary, SegmentOutput
from .request import Request, stream_seed
from .schedule.clock import RoundClock
from .schedule.schedulers import FunctionScheduler, build_scheduler, overrides, survival
from .stats import RoundLog
from .verify.hf import build_verifier


def acceptance_mode(spec: Any, params: SamplingParams, device: torch.device,
                    proposer: Proposer | None = None) -> AcceptanceMode:  # fmt: skip
    """The acceptance mode ``spec`` names (built-in: ``rejection``, ``coupled``; a plugin's, with its settings as
    ``{class_path, init_args}``)."""
    return build("acceptance", spec, params, device, proposer if isinstance(proposer, ReducedVocabulary) else None)


@dataclass
class _Batch:
    """The requests of one round and their anchors x_0 at positions P."""

    requests: list[Request]
    ids: list[int]  # their engine-wide ids
    anchors: torch.Tensor  # (R,) on the device
    anchor_pos: torch.Tensor  # (R,) on the device
    anchor_pos_h: torch.Tensor  # (R,) on the host: what shapes and cache bookkeeping read


def scheduler_name(sched: Any) -> str:
    """How an error names a scheduler: its registered name, a plain function's name (the one a
    :class:`FunctionScheduler` wraps; only this message reads it), or its class."""
    if isinstance(sched, FunctionScheduler):
        fn = getattr(sched, "fn", None)
        return f"function {getattr(fn, '__qualname__', type(fn).__name__)}"
    name = type(sched).__dict__.get("registry_name")
    return repr(name) if name else type(sched).__name__


def _whole(lengths: torch.Tensor) -> bool:
    """Integer lengths, or floating ones that are finite whole numbers."""
    if lengths.dtype == torch.bool or lengths.is_complex():
        return False
    if lengths.is_floating_point():
        return bool(torch.isfinite(lengths).all()) and bool((lengths == lengths.round()).all())
    return True


class Engine:
    """Holds the target's verifier, the drafter's proposer, the scheduler, the acceptance mode and the round logs.
    ``batching``: ``padded`` or ``flat``; ``confidence_mode``: the acceptance mode whose rounds the proposer's
    confidences were calibrated on (a mode accepting otherwise than that maps them with its ``confidence``)."""

    def __init__(
        self,
        target,
        proposer: Proposer | None = None,
        *,
        params: SamplingParams,
        scheduler=None,
        stop_token_ids: list[int],
        stop_strings: list[str] | None = None,
        seed: int = 0,
        batching: str = "padded",
        verifier: Any = "auto",
        acceptance: Any = "rejection",
        hardware: HardwareProfile | None = None,
        confidence_mode: str = "rejection",
    ) -> None:
        resolve("acceptance", acceptance)  # an unknown mode or argument: one line, before anything is built
        self.target = target
        self.params = params
        self.verifier = build_verifier(verifier, target, batching, kernels=hardware.kernels if hardware else None)
        self.proposer = proposer
        self.scheduler = build_scheduler(scheduler if scheduler is not None else "static")
        self.scheduler.reset()
        self._gated = overrides(self.scheduler, "wants_draft")
        self._observes_steps = overrides(self.scheduler, "observe_step")
        self._observes_draft_time = overrides(self.scheduler, "observe_draft_time")
        self._observes_rounds = overrides(self.scheduler, "observe_rounds")
        kernels = self.verifier.kernels if isinstance(self.verifier, KernelChoice) else None
        self.padded = self.verifier.batching == "padded"
        self.use_hardware(hardware if hardware is not None else HardwareProfile(kernels=kernels))
        self.stop_ids = {int(t) for t in stop_token_ids}
        self.stop_strings = [s for s in (stop_strings or []) if s]
        dev = self.verifier.device
        self.device = dev
        self.acceptance = acceptance_mode(acceptance, params, dev, proposer)
        self.acceptance_spec = acceptance  # as given (the drafting-cost profile runs the same mode)
        # confidences fitted on rejection-sampling rounds, read by a mode that accepts otherwise: the mode's map
        mapped = confidence_mode == "rejection"
        self._mode_confidence = getattr(self.acceptance, "confidence", None) if mapped else None
        self.seed = seed
        self.requests: list[Request] = []
        self.log = RoundLog()
        self.time_s = {"prefill": 0.0, "draft": 0.0, "schedule": 0.0, "verify": 0.0, "accept": 0.0}
        self._next_rid = 0
        self._extend_s = 0.0  # last round's drafter-cache update time (part of the drafting cost)
        self.backlog = ContextBacklog()  # features of skipped steps, extended when drafting resumes
        self.clock = RoundClock(dev)  # device-timeline intervals, read after the round's own synchronisations
        self.trace = None  # an optional FeatureTrace (infer.generation): the target features of committed positions

    def use_hardware(self, profile: HardwareProfile) -> None:
        """Hand the machine's profile, with how this engine batches a verification, to the scheduler (before the
        first step: nothing in the loop measures it)."""
        profile = profile.with_parts(padded=self.padded)
        self.hardware = profile
        self.scheduler.use_hardware(profile)

    @property
    def block_size(self) -> int:
        return self.proposer.block_size if self.proposer is not None else 0

    @property
    def active(self) -> list[Request]:
        return [r for r in self.requests if not r.done]

    def _tensor(self, values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.long, device=self.device)

    # --- prefill ---------------------------------------------------------------------------
    @torch.no_grad()
    def add(
        self, prompts: list[list[int]], max_new_tokens: int, first_index: int = 0, seeds: list[int] | None = None
    ) -> list[Request]:
        """Prefill new requests and sample their first token (not a round).

        Every request draws from its own two random streams (drafting; first token + acceptance + residual),
        seeded from ``seeds[i]`` when given, else from (engine seed, prompt index), so what it draws never depends
        on which other requests share its batch (docs/algorithm.md §10; response regeneration relies on it too).
        """
        if max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompts:
            return []
        t0 = time.perf_counter()
        new = []
        if seeds is not None and len(seeds) != len(prompts):
            raise UsageError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        for i, p in enumerate(prompts):
            key = ("seed", int(seeds[i])) if seeds is not None else ("decode", self.seed, first_index + i)
            r = Request(first_index + i, self._next_rid, list(p), max_new_tokens, t_added=t0,
                        key=stream_seed(*key, "accept"), draft_key=stream_seed(*key, "draft"))  # fmt: skip
            new.append(r)
            self._next_rid += 1
        ids = [r.rid for r in new]
        lengths_h = torch.tensor([len(r.prompt) for r in new])  # host: the proposer reads shapes from it
        lengths = lengths_h.to(self.device, non_blocking=True)
        out = self.verifier.prefill(ids, [r.prompt for r in new])
        rows = torch.arange(len(new), device=self.device)
        p = target_law(self.verifier.logits(out.hidden[rows, lengths - 1]), self.params)  # (R, V)
        first = self.acceptance.first_tokens(new, p).tolist()
        if self.proposer is not None:
            self.proposer.add(ids)
            self.proposer.extend(ids, out.context, torch.zeros_like(lengths_h), lengths_h, hidden=out.hidden)
        if self.trace is not None:
            self.trace.extend(ids, out.context, out.hidden, lengths_h)
        now = time.perf_counter()
        for r, tok in zip(new, first, strict=True):
            r.anchor, r.pos, r.t_first = tok, len(r.prompt), now
            self._append_tokens(r, [tok], stopped=tok in self.stop_ids)
        self.requests.extend(new)
        self._retire([r for r in new if r.done])
        self.time_s["prefill"] += time.perf_counter() - t0
        return new

    # --- one round -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[tuple[Request, list[int]]]:
        """One round for every active request: gate, draft, schedule, verify, accept, commit. Returns (request,
        newly committed tokens) pairs."""
        batch = self._batch()
        if batch is None:
            return []
        clock = self.clock  # t_*: marks on the device's timeline (see RoundClock)
        t_start = clock.mark()
        drafting = self._gate(batch)
        if drafting:
            proposal = self._draft(batch)
            lengths, survivals = self._schedule(proposal, drafted=(t_start, clock.mark()))
            t_verify = clock.mark()
        else:
            proposal, survivals, t_verify = None, None, t_start
            lengths = torch.zeros(len(batch.requests), dtype=torch.long)  # host: l_r sets tensor shapes
        out, p = self._verify(batch, proposal, lengths)
        t_verified = clock.mark()
        clock.span(t_verify, t_verified, self._adder("verify"))
        result = self._accept(batch, proposal, p, lengths, survivals)
        if drafting and self._observes_rounds:
            self.scheduler.observe_rounds(self._conf_h, lengths, result.accepted)
        committed = self._commit(batch, result, lengths)
        if self.trace is not None:  # the anchor and the accepted drafts: the positions this round committed
            self.trace.extend(batch.ids, out.context, out.hidden, torch.tensor(result.accepted) + 1)
        t_committed = clock.mark()
        clock.span(t_verified, t_committed, self._adder("accept"))
        if self.proposer is not None:
            self._extend_drafter(batch, out, result.accepted, drafting)
            clock.span(t_committed, clock.mark(), self._extended if drafting else self._held)
        if self._observes_steps:
            self._observe_step(batch, drafting, committed, t_start)
        return committed

    def _batch(self) -> _Batch | None:
        """The active requests and their anchors (None when no request is active)."""
        act = self.active
        if not act:
            return None
        anchors = self._tensor([r.anchor for r in act])
        anchor_pos_h = torch.tensor([r.pos for r in act])
        return _Batch(act, [r.rid for r in act], anchors, anchor_pos_h.to(self.device, non_blocking=True),
                      anchor_pos_h)  # fmt: skip

    def _gate(self, batch: _Batch) -> bool:
        """1. Whether the drafter runs this step: always, unless the scheduler's draft gate skips it (a
        non-anticipating l_r = 0 for every request, decided from earlier steps only)."""
        if self.proposer is None:
            return False
        if self._gated and not self.scheduler.wants_draft(len(batch.requests)):
            self.log.skipped_steps += 1
            return False
        return True

    def _draft(self, batch: _Batch) -> Proposal:
        """2. Catch the drafter up on the steps the gate skipped (timed as drafting), then draft a block per request
        with the acceptance mode's drafting randomness."""
        self.backlog.flush(self.proposer, batch.ids)
        with self.acceptance.drafting(batch.requests) as randomness:
            return self.proposer.propose(batch.ids, batch.anchors, batch.anchor_pos, self.params, randomness,
                                         requests=batch.requests)  # fmt: skip

    def _schedule(self, proposal: Proposal, drafted: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """3. Each request's verification length l_r (host) and the survivals of the drafter's confidences (the
        round log's).

        The scheduler runs on the host over R*γ numbers: the round's first synchronisation moves the confidences
        there. Once it has, the drafting has finished on the device, so the ``drafted`` interval (two clock marks)
        is handed over before the scheduler reads it. An acceptance mode that accepts otherwise than rejection
        sampling (which the confidences predict) maps them to its own chances first (its optional ``confidence``)."""
        conf = proposal.conf.detach().float().cpu()
        if self._mode_confidence is not None:
            conf = self._mode_confidence(conf)
        self._conf_h = conf  # what the scheduler saw, for its observe_rounds
        self.clock.span(*drafted, self._drafted)
        t0 = time.perf_counter()
        lengths = self._lengths(self.scheduler(conf), conf.shape).clamp(0, self.block_size)
        survivals = survival(proposal.conf)
        self.time_s["schedule"] += time.perf_counter() - t0
        return lengths, survivals

    def _lengths(self, out: Any, shape: torch.Size) -> torch.Tensor:
        """The scheduler's answer as host lengths (R,), checked where the engine receives it: one length per request,
        whole numbers. Anything else (a scalar, (R, 1), a list of another length, NaN) is one error naming the
        scheduler and what it returned, not a failure deep in the verifier."""
        R, g = shape
        try:
            lengths = out.detach().cpu() if isinstance(out, torch.Tensor) else torch.as_tensor(out)
        except (TypeError, ValueError, RuntimeError):
            lengths = None
        if lengths is None or tuple(lengths.shape) != (R,) or not _whole(lengths):
            if lengths is None:
                got = f"{type(out).__name__} {short(out)}"
            else:
                got = f"lengths of shape {tuple(lengths.shape)}, dtype {str(lengths.dtype).removeprefix('torch.')}"
            raise UsageError(
                f"scheduler {scheduler_name(self.scheduler)} returned {got} for confidences of shape "
                f"({R}, {g}); a scheduler returns one whole length in [0, {g}] per request: shape ({R},)"
            )
        return lengths.long()

    def _verify(self, batch: _Batch, proposal: Proposal | None,
                lengths: torch.Tensor) -> tuple[SegmentOutput, torch.Tensor]:  # fmt: skip
        """4. One target forward over every request's [anchor + l_r drafts]; the target laws p_t,1..p_t,W
        (R, W, V) (greedy: the logits)."""
        W = int(lengths.max()) + 1
        anchors = batch.anchors[:, None]
        inputs = anchors if proposal is None else torch.cat([anchors, proposal.tokens[:, : W - 1]], 1)
        out = self.verifier.forward(batch.ids, inputs, lengths + 1, batch.anchor_pos_h)
        return out, target_law(self.verifier.logits(out.hidden), self.params)

    def _accept(self, batch: _Batch, proposal: Proposal | None, p: torch.Tensor, lengths: torch.Tensor,
                survivals: torch.Tensor | None) -> _HostRound:  # fmt: skip
        """5. Accept a prefix of each block and draw the recovered or bonus token; the results come to the host in
        the round's second (and last) synchronisation."""
        drafts = proposal.tokens if proposal is not None else batch.anchors[:, None][:, :0]
        q = proposal.q if proposal is not None else p[:, :0]
        res = self.acceptance.accept(batch.requests, drafts, q, p, lengths)
        result = _to_host(
            res,
            drafts,
            survivals,
            None if proposal is None else proposal.conf_logits,
            None if proposal is None else proposal.margins,
        )
        self.clock.settle()  # every interval marked so far has finished
        return result

    def _commit(self, batch: _Batch, result: _HostRound, lengths: torch.Tensor) -> list[tuple[Request, list[int]]]:
        """6. Append each request's accepted drafts and its next token (an accepted stop token ends the round
        there: no bonus, later drafts dropped), log the round, roll the target cache back to the committed
        positions and retire the finished requests."""
        ell = lengths.tolist()
        self.log.step_tokens.append(int((lengths + 1).sum()))
        self.log.step_requests.append(len(batch.requests))
        committed = []
        for i, r in enumerate(batch.requests):
            m, y = result.accepted[i], result.next_token[i]
            drafts = result.drafts[i][:m]
            hit = [j for j, t in enumerate(drafts) if t in self.stop_ids]
            if hit:
                new, ell_eff, m_eff, stopped = drafts[: hit[0] + 1], hit[0] + 1, hit[0] + 1, True
            else:
                new, ell_eff, m_eff, stopped = [*drafts, y], ell[i], m, y in self.stop_ids
            survivals = None if result.survival is None else result.survival[i]
            z = None if result.conf_logits is None else result.conf_logits[i]
            mu = None if result.margins is None else result.margins[i]
            self.log.add(r.index, ell_eff, m_eff, len(new), survivals, z, mu)
            before = len(r.output)
            self._append_tokens(r, new, stopped)
            committed.append((r, r.output[before:]))
            r.anchor, r.pos = y, r.pos + m + 1
        self.verifier.commit(batch.ids, batch.anchor_pos_h + torch.tensor(result.accepted))
        self._retire([r for r in batch.requests if r.done])
        return committed

    def _extend_drafter(self, batch: _Batch, out: SegmentOutput, accepted: list[int], drafting: bool) -> None:
        """The drafter's context cache takes the target features of each live request's committed positions (its
        anchor and its ``accepted[r]`` accepted drafts). A skipped step's single position is held in the backlog
        until the drafter runs again (or the backlog is full)."""
        alive = [i for i, r in enumerate(batch.requests) if not r.done]
        if not alive:
            return
        rows_h = torch.tensor(alive)
        rows = rows_h.to(self.device, non_blocking=True)
        ids, start = [batch.ids[i] for i in alive], batch.anchor_pos_h[rows_h]
        context, hidden = out.context[rows], out.hidden[rows]
        if drafting:
            self.proposer.extend(ids, context, start, torch.tensor(accepted)[rows_h] + 1, hidden=hidden)
        else:
            self.backlog.push(ids, context, hidden, start)
            if self.backlog.full():
                self.backlog.flush(self.proposer, [r.rid for r in self.active])

    def _observe_step(self, batch: _Batch, drafting: bool, committed: list, t_start) -> None:
        """The scheduler's view of this step (on a GPU: once its work has finished): drafted or not, batch size,
        committed tokens, time and verified tokens B."""
        R, verified = len(batch.requests), self.log.step_tokens[-1]
        n_committed = sum(len(new) for _, new in committed)

        def observe(seconds: float) -> None:
            self.scheduler.observe_step(drafting, R, n_committed, seconds, verified=verified)

        self.clock.span(t_start, self.clock.mark(), observe)

    # --- timing ----------------------------------------------------------------------------
    def _adder(self, key: str):
        def add(seconds: float) -> None:
            self.time_s[key] += seconds

        return add

    def _drafted(self, seconds: float) -> None:
        """A drafting interval: into the totals, and (with the last cache update) to a scheduler that weighs it."""
        self.time_s["draft"] += seconds
        if self._observes_draft_time:
            self.scheduler.observe_draft_time(seconds + self._extend_s)

    def _extended(self, seconds: float) -> None:
        self.time_s["draft"] += seconds
        self._extend_s = seconds

    def _held(self, seconds: float) -> None:  # a skipped step's backlog push: the next draft pays the catch-up
        self.time_s["draft"] += seconds
        self._extend_s = 0.0

    def settle_timings(self) -> None:
        """Wait for and account every interval still running on the device (the end of a decode)."""
        self.clock.settle(wait=True)

    # --- bookkeeping -----------------------------------------------------------------------
    def _append_tokens(self, r: Request, new: list[int], stopped: bool) -> None:
        """Extend ``r``'s output and set why it finished, if it did: a stop token, its length, a stop string."""
        r.output.extend(new)
        if stopped:
            r.finish_reason = "stop"
        if len(r.output) >= r.max_new_tokens:
            if len(r.output) > r.max_new_tokens or not stopped:
                r.finish_reason = "length"
            del r.output[r.max_new_tokens :]
        if self.stop_strings:
            cut = self._stop_string_cut(r.output)
            if cut is not None:
                del r.output[cut:]
                r.finish_reason = "stop_string"
        if r.done:
            r.t_done = time.perf_counter()

    def _stop_string_cut(self, out: list[int]) -> int | None:
        """Length of the shortest prefix of ``out`` whose text contains a stop string (None if none)."""
        tok = self.target.tokenizer
        if not any(s in tok.decode(out) for s in self.stop_strings):
            return None
        n = len(out)
        while n > 0 and any(s in tok.decode(out[: n - 1]) for s in self.stop_strings):
            n -= 1
        return n

    def _retire(self, finished: list[Request]) -> None:
        ids = [r.rid for r in finished]
        if ids:
            self.verifier.remove(ids)
            if self.proposer is not None:
                self.proposer.remove(ids)


@dataclass
class _HostRound:
    """One round's per-request results on the host, fetched in a single device -> host transfer."""

    accepted: list[int]  # m_r
    next_token: list[int]  # y_r, the recovered or bonus token
    drafts: list[list[int]]
    survival: torch.Tensor | None  # (R, γ) float32, for the round log
    conf_logits: torch.Tensor | None  # (R, γ) float32
    margins: torch.Tensor | None = None  # (R, γ) float32


def _to_host(res: Acceptance, drafts: torch.Tensor, a: torch.Tensor | None, z: torch.Tensor | None,
             margins: torch.Tensor | None = None) -> _HostRound:  # fmt: skip
    """Pack m, y, the drafts, the survivals, the confidence logits and the draft margins into one float64 tensor
    (token ids are exact in float64) and move it once: on an accelerator every ``.tolist()`` / ``.cpu()`` is a
    synchronisation."""
    R, g = drafts.shape
    extra = (a, z, margins)
    parts = [res.accepted[:, None], res.next_token[:, None], drafts, *(t for t in extra if t is not None)]
    packed = torch.cat([t.double() for t in parts], 1).cpu()
    ints = packed[:, : 2 + g].long()
    floats, host = packed[:, 2 + g :].float(), []
    for t in extra:
        host.append(None if t is None else floats[:, :g])
        floats = floats if t is None else floats[:, g:]
    return _HostRound(ints[:, 0].tolist(), ints[:, 1].tolist(), ints[:, 2:].tolist(), *host)
