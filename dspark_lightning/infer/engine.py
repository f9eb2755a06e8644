"""The decoding engine: requests in, one round per :meth:`Engine.step` for every active request.

    1. draft     the proposer drafts a block per request (tokens, fp32 laws q, confidences ĉ)
    2. schedule  the scheduler picks l_r from ĉ alone
    3. verify    one target forward over every request's [anchor + l_r drafts]
    4. accept    greedy / rejection sampling; recovered or bonus token; roll both caches back

With no drafter every round verifies the anchor only (l_r = 0): plain decoding, same code.
Requests can be added at any time (continuous batching) and finish independently.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import torch

from .accept import accept
from .backlog import ContextBacklog
from .clock import RoundClock
from .coupled import CoupledNoise, accept_coupled
from .sampling import SamplingParams, Streams, sample, target_law
from .schedulers import build_scheduler, survival
from .stats import RoundLog
from .verify import build_verifier

ACCEPTANCE = ("rejection", "coupled")


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


class Engine:
    """Holds the target verifier, the drafter's proposer, the scheduler, RNG streams and round logs."""

    def __init__(
        self,
        target,
        proposer=None,
        *,
        params: SamplingParams,
        scheduler=None,
        stop_token_ids: list[int],
        stop_strings: list[str] | None = None,
        seed: int = 0,
        layout: str = "padded",
        verifier: str = "auto",
        acceptance: str = "rejection",
    ) -> None:
        if acceptance not in ACCEPTANCE:
            raise ValueError(f"acceptance must be one of {ACCEPTANCE}, got {acceptance!r}")
        self.target = target
        self.params = params
        self.coupled = acceptance == "coupled" and not params.greedy  # greedy is already drafter-invariant
        self.verifier = build_verifier(verifier, target, layout)
        self.proposer = proposer
        self.scheduler = build_scheduler(scheduler if scheduler is not None else "static")
        if hasattr(self.scheduler, "reset"):
            self.scheduler.reset()
        self.stop_ids = {int(t) for t in stop_token_ids}
        self.stop_strings = [s for s in (stop_strings or []) if s]
        dev = self.verifier.device
        self.device = dev
        self.seed = seed
        self.requests: list[Request] = []
        self.log = RoundLog()
        self.time_s = {"prefill": 0.0, "draft": 0.0, "schedule": 0.0, "verify": 0.0, "accept": 0.0}
        self._next_rid = 0
        self._extend_s = 0.0  # last round's drafter-cache update time (part of the drafting cost)
        self.backlog = ContextBacklog()  # features of skipped steps, extended when drafting resumes
        self.clock = RoundClock(dev)  # device-timeline intervals, read after the round's own synchronisations

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
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompts:
            return []
        t0 = time.perf_counter()
        new = []
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
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
        if self.coupled:  # the first generated token sits at position len(prompt)
            first = sample(p, self.params, self._noise(new, [len(r.prompt) for r in new], draft=False)).tolist()
        else:
            streams = self._streams(new)
            first = sample(p, self.params, streams).tolist()
            self._advance(new, streams)
        if self.proposer is not None:
            self.proposer.add(ids)
            self.proposer.extend(ids, out.context, torch.zeros_like(lengths_h), lengths_h, hidden=out.hidden)
        now = time.perf_counter()
        for r, tok in zip(new, first, strict=True):
            r.anchor, r.pos, r.t_first = tok, len(r.prompt), now
            self._commit(r, [tok], stopped=tok in self.stop_ids)
        self.requests.extend(new)
        self._retire([r for r in new if r.done])
        self.time_s["prefill"] += time.perf_counter() - t0
        return new

    # --- one round -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[tuple[Request, list[int]]]:
        """One round for every active request. Returns (request, newly committed tokens) pairs."""
        act = self.active
        if not act:
            return []
        ids = [r.rid for r in act]
        R, g = len(act), self.block_size
        anchors = self._tensor([r.anchor for r in act])
        apos_h = torch.tensor([r.pos for r in act])  # host copies of what shapes and cache bookkeeping read
        apos = apos_h.to(self.device, non_blocking=True)

        clk = self.clock
        t_step = t0 = clk.mark()
        prop, a = None, None
        ell = torch.zeros(R, dtype=torch.long)  # host: l_r sets tensor shapes
        gate = getattr(self.scheduler, "wants_draft", None)
        drafting = self.proposer is not None and (gate is None or gate(R))  # decided from earlier steps only
        if drafting:
            self.backlog.flush(self.proposer, ids)  # catch up on the steps the gate skipped (timed as drafting)
            if self.coupled:  # x_k at P + k from the noise the target will use there
                prop = self.proposer.propose(ids, anchors, apos, self.params, self._noise(act, None, draft=True),
                                             requests=act)  # fmt: skip
            else:
                draft_streams = self._streams(act, draft=True)  # row r draws from request r's own stream
                prop = self.proposer.propose(ids, anchors, apos, self.params, draft_streams, requests=act)
                self._advance(act, draft_streams, draft=True)
            t1 = clk.mark()
            # schedulers run on the host over R*γ numbers: one transfer of the confidences per round (after it the
            # drafting has finished on the device, so its interval is known before the scheduler reads it)
            conf_h = prop.conf.detach().float().cpu()
            clk.span(t0, t1, self._drafted)
            h0 = time.perf_counter()
            ell = self.scheduler(conf_h).cpu().clamp(0, g)
            a = survival(prop.conf)
            self.time_s["schedule"] += time.perf_counter() - h0
            t0 = clk.mark()
        elif self.proposer is not None:
            self.log.skipped_steps += 1

        W = int(ell.max()) + 1
        tokens = anchors[:, None] if prop is None else torch.cat([anchors[:, None], prop.tokens[:, : W - 1]], 1)
        out = self.verifier.forward(ids, tokens, ell + 1, apos_h)
        p = target_law(self.verifier.logits(out.hidden), self.params)  # (R, W, V) p_t,1..p_t,W (greedy: logits)
        t1 = clk.mark()
        clk.span(t0, t1, self._adder("verify"))

        drafts = prop.tokens if prop is not None else tokens[:, :0]
        q = prop.q if prop is not None else p[:, :0]
        if self.coupled:
            res = accept_coupled(drafts, p, ell, self._noise(act, None, draft=False))
        else:
            streams = self._streams(act)
            res = accept(drafts, q, p, ell, self.params, streams)
            self._advance(act, streams)
        host = _to_host(res, drafts, a, None if prop is None else prop.conf_logits)  # the round's only result sync
        clk.settle()  # every interval marked so far has finished
        ell_l = ell.tolist()
        self.log.step_tokens.append(int((ell + 1).sum()))
        self.log.step_requests.append(R)
        committed = []
        for i, r in enumerate(act):
            m, y = host.accepted[i], host.next_token[i]
            acc = host.drafts[i][:m]
            hit = [j for j, t in enumerate(acc) if t in self.stop_ids]
            if hit:  # an accepted stop token ends the round there: no bonus, later drafts dropped
                new, ell_eff, m_eff, stopped = acc[: hit[0] + 1], hit[0] + 1, hit[0] + 1, True
            else:
                new, ell_eff, m_eff, stopped = [*acc, y], ell_l[i], m, y in self.stop_ids
            z = None if host.conf_logits is None else host.conf_logits[i]
            self.log.add(r.index, ell_eff, m_eff, len(new), None if host.survival is None else host.survival[i], z)
            keep = len(r.output)
            self._commit(r, new, stopped)
            committed.append((r, r.output[keep:]))
            r.anchor, r.pos = y, r.pos + m + 1
        accepted_h = torch.tensor(host.accepted)
        self.verifier.commit(ids, apos_h + accepted_h)
        finished = [r for r in act if r.done]
        self._retire(finished)
        t0 = clk.mark()
        clk.span(t1, t0, self._adder("accept"))
        if self.proposer is not None:
            alive = [i for i, r in enumerate(act) if not r.done]
            if alive:
                sel_h = torch.tensor(alive)
                sel = sel_h.to(self.device, non_blocking=True)
                ext_ids, ext_len = [ids[i] for i in alive], accepted_h[sel_h] + 1
                ctx, hid = out.context[sel], out.hidden[sel]
                if drafting:
                    self.proposer.extend(ext_ids, ctx, apos_h[sel_h], ext_len, hidden=hid)
                else:  # one committed position each: held until the drafter runs again
                    self.backlog.push(ext_ids, ctx, hid, apos_h[sel_h])
                    if self.backlog.full():
                        self.backlog.flush(self.proposer, [r.rid for r in self.active])
            clk.span(t0, clk.mark(), self._extended if drafting else self._held)
        observe_step = getattr(self.scheduler, "observe_step", None)
        if observe_step is not None:  # the gate's view of this step (on a GPU: once its work has finished)
            tokens, B = sum(len(new) for _, new in committed), self.log.step_tokens[-1]
            clk.span(t_step, clk.mark(), lambda s: observe_step(drafting, R, tokens, s, verified=B))
        return committed

    # --- timing ----------------------------------------------------------------------------
    def _adder(self, key: str):
        def add(seconds: float) -> None:
            self.time_s[key] += seconds

        return add

    def _drafted(self, seconds: float) -> None:
        """A drafting interval: into the totals, and (with the last cache update) to a scheduler that weighs it."""
        self.time_s["draft"] += seconds
        observe = getattr(self.scheduler, "observe_draft_time", None)
        if observe is not None:
            observe(seconds + self._extend_s)

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
    def _noise(self, reqs: list[Request], base: list[int] | None, draft: bool) -> CoupledNoise:
        """Coupled acceptance's shared noise for ``reqs`` from position ``base`` (default: after each anchor); the
        drafter's copy reads it through its draft vocabulary."""
        vocab = getattr(getattr(self.proposer, "drafter", None), "draft_vocab", None) if draft else None
        base = [r.pos + 1 for r in reqs] if base is None else base
        return CoupledNoise([r.key for r in reqs], base, self.device, vocab=vocab)

    def _streams(self, reqs: list[Request], draft: bool = False) -> Streams:
        """Each request's own acceptance (or drafting) stream, row by row, from its key and counter."""
        if draft:
            return Streams([r.draft_key for r in reqs], [r.draft_draws for r in reqs], self.device)
        return Streams([r.key for r in reqs], [r.draws for r in reqs], self.device)

    @staticmethod
    def _advance(reqs: list[Request], streams: Streams, draft: bool = False) -> None:
        """Every row drew ``streams.used`` numbers (the same for each: what a request draws never depends on the
        batch)."""
        for r in reqs:
            if draft:
                r.draft_draws += streams.used
            else:
                r.draws += streams.used

    def _commit(self, r: Request, new: list[int], stopped: bool) -> None:
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

    accepted: list[int]
    next_token: list[int]
    drafts: list[list[int]]
    survival: torch.Tensor | None  # (R, γ) float32, for the round log
    conf_logits: torch.Tensor | None  # (R, γ) float32


def _to_host(res, drafts: torch.Tensor, a: torch.Tensor | None, z: torch.Tensor | None) -> _HostRound:
    """Pack m, y, the drafts, the survivals and the confidence logits into one float64 tensor (token ids are
    exact in float64) and move it once: on an accelerator every ``.tolist()`` / ``.cpu()`` is a synchronisation."""
    R, g = drafts.shape
    parts = [res.accepted[:, None], res.next_token[:, None], drafts]
    parts += [t for t in (a, z) if t is not None]
    packed = torch.cat([t.double() for t in parts], 1).cpu()
    ints = packed[:, : 2 + g].long()
    floats = packed[:, 2 + g :].float()
    a_h = floats[:, :g] if a is not None else None
    z_h = floats[:, -g:] if z is not None else None
    return _HostRound(ints[:, 0].tolist(), ints[:, 1].tolist(), ints[:, 2:].tolist(), a_h, z_h)
