"""Step 3 of a round: choose each request's verification length l_r (docs/algorithm.md §6).

A scheduler is called with the conditional confidences ĉ (R, γ) of the current blocks and
nothing else: it never sees the draft tokens. Each ĉ_k was computed before x_k was sampled, and
every rule here admits position k using only candidates ranked at or above it, so the event
"l_r >= k" does not depend on x_k (non-anticipation, required for losslessness).

Registered names: ``static``, ``threshold``, ``hardware_aware`` (Algorithm 1 with the early-stop
break), ``async_hardware_aware`` (budget from confidences two steps old, fresh split) and ``auto`` (Algorithm 1 or
a global search of the budget, whichever this machine's SPS curve calls for). Every scheduler is a
:class:`Scheduler`: one base class whose hooks do nothing by default, like a Lightning ``Callback``; the
hardware-aware ones use them all (draft gate, step observations, the machine's :class:`~.hardware.HardwareProfile`).
"""

from __future__ import annotations

import inspect
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from ... import checks
from ...checks import UsageError
from ...registry import RegistryError, build, get, register
from .sps import SPSTable

if TYPE_CHECKING:
    from ..hardware import HardwareProfile
    from .draft_cost import DraftCost


class Scheduler:
    """Picks each request's verification length from the confidences; the base class of every scheduler.

    Subclasses implement :meth:`__call__`. The other methods are hooks the engine calls at fixed points of a round
    (it skips the per-step ones a scheduler does not override):

    - :meth:`reset`: once, when an engine takes the scheduler.
    - :meth:`use_hardware`: the machine's :class:`~.hardware.HardwareProfile`, before the decoding loop, with the parts
      :attr:`reads_hardware` names (``decode()`` measures the missing ones once and caches them).
    - :meth:`wants_draft`: before drafting, whether to run the drafter this step at all.
    - :meth:`observe_draft_time` and :meth:`observe_step`: a drafted step's drafting time, and every finished step.

    Lossless whatever a subclass does, as long as l_r depends on the confidences and on earlier steps only (never on
    this step's draft tokens).
    """

    reads_hardware: frozenset[str] = frozenset()  # the HardwareProfile parts use_hardware() reads

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        """ĉ (R, γ) in [0, 1] -> l (R,) long in [0, γ], on the host."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(conf) -> lengths")

    def reset(self) -> None:
        """Forget the state of an earlier run."""

    def needs_hardware(self) -> frozenset[str]:
        """The profile parts this scheduler still lacks (default: all it reads)."""
        return self.reads_hardware

    def use_hardware(self, profile: HardwareProfile) -> None:
        """The machine's profile (SPS table, drafting cost, kernel table), measured outside the decoding loop."""

    def wants_draft(self, R: int) -> bool:
        """Whether to run the drafter this step, from earlier steps only (False: l = 0 for every request)."""
        return True

    def observe_step(self, drafted: bool, R: int, tokens: int, seconds: float, verified: int | None = None) -> None:
        """A finished step: drafted or not, R requests, ``tokens`` committed, its time, ``verified`` tokens B."""

    def observe_draft_time(self, seconds: float) -> None:
        """A drafted step's drafting time (with the drafter's last cache update)."""

    def observe_rounds(self, conf: torch.Tensor, lengths: torch.Tensor, accepted: list[int]) -> None:
        """A drafted step's outcome: the confidences ĉ (R, γ) this scheduler was called with, the lengths it chose
        and each request's accepted drafts m_r (host). Later steps may learn from it (it is their past)."""


HOOKS = ("reset", "use_hardware", "wants_draft", "observe_step", "observe_draft_time", "observe_rounds")


def overrides(scheduler: Scheduler, hook: str) -> bool:
    """Whether ``scheduler``'s class replaces the base class's ``hook``."""
    return getattr(type(scheduler), hook, None) is not getattr(Scheduler, hook)


class FunctionScheduler(Scheduler):  # a plain function ``conf -> lengths`` as a scheduler (no hooks)
    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        return self.fn(conf)


def survival(conf: torch.Tensor) -> torch.Tensor:
    """a_{r,j} = prod_{i<=j} ĉ_{r,i} (R, γ), non-increasing in j."""
    return conf.double().clamp(0, 1).cumprod(-1)


def ranked_pool(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates (r, j) with a > 0 sorted by (-a, j, r) -> (values (N,), request index (N,)).

    Computed on the host (the pool is R*γ numbers and the SPS table lives there): an accelerator tensor is
    copied once here, so every scheduler accepts confidences on any device and returns host tensors.
    """
    a = a.detach().cpu()
    R, g = a.shape
    r = torch.arange(R).repeat_interleave(g)
    j = torch.arange(g).repeat(R)
    v = a.reshape(-1)
    keep = v > 0
    v, r, j = v[keep], r[keep], j[keep]
    order = torch.argsort(r, stable=True)  # lexicographic (-a, j, r) by stable sorts, least significant key first
    order = order[torch.argsort(j[order], stable=True)]
    order = order[torch.argsort(-v[order], stable=True)]
    return v[order], r[order]


def admit(req: torch.Tensor, n: int, R: int) -> torch.Tensor:
    """l_r = how many of the first n ranked candidates belong to request r (prefix-closed by construction)."""
    return torch.bincount(req[:n], minlength=R).long()


def admit_top(a: torch.Tensor, K: int, sps: SPSTable) -> torch.Tensor:
    """ℓ (R,) admitting the K best-ranked candidates of the survival pool ``a`` (R, γ), K clamped to what the pool
    and the SPS table allow (a budget from other confidences may exceed them)."""
    R, g = a.shape
    values, req = ranked_pool(a)
    return admit(req, max(0, min(K, R * g, len(values), sps.max_tokens - R)), R)


def throughput_curve(values: torch.Tensor, R: int, sps: SPSTable) -> torch.Tensor:
    """Θ_n = (R + sum of the top n a) * SPS(R + n) for n = 0..N."""
    tau = R + torch.cat([values.new_zeros(1), values.cumsum(0)])
    return tau * sps(torch.arange(len(values) + 1, dtype=torch.float64) + R)


def prefix_schedule(conf: torch.Tensor, sps: SPSTable) -> torch.Tensor:
    """Paper Algorithm 1: admit in rank order while Θ strictly improves; stop at the first non-improvement."""
    R = conf.shape[0]
    values, req = ranked_pool(survival(conf))
    theta = throughput_curve(values, R, sps)
    n = int((theta[1:] > theta[:-1]).long().cumprod(0).sum())
    return admit(req, n, R)


def global_capacity(a: torch.Tensor, sps: SPSTable) -> int:
    """K = argmax_n Θ_n over a whole (stale) pool, no early stop (the asynchronous variant's budget)."""
    values, _ = ranked_pool(a)
    return int(torch.argmax(throughput_curve(values, a.shape[0], sps)))


@register("scheduler", "static")
class StaticScheduler(Scheduler):
    """l_r = min(gamma, γ) for every request (gamma=None: the whole block, as in the paper's Table 1)."""

    def __init__(self, gamma: int | None = None) -> None:
        checks.at_least("gamma", gamma, 0)
        self.gamma = gamma

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        R, g = conf.shape
        return torch.full((R,), g if self.gamma is None else min(self.gamma, g), dtype=torch.long)


@register("scheduler", "threshold")
class ThresholdScheduler(Scheduler):
    """Verify the leading run of positions that pass a threshold.

    Args:
        threshold: θ in [0, 1]; 0 verifies the whole block.
        mode: ``cumulative`` (default) admits k while the survival a_k = prod ĉ_i >= θ;
            ``raw`` is the reference's rule, the first position whose own ĉ_k < θ ends the run.
    """

    def __init__(self, threshold: float = 0.5, mode: str = "cumulative") -> None:
        if mode not in ("cumulative", "raw"):
            raise UsageError(f"mode must be 'cumulative' or 'raw', got {mode!r}")
        if threshold is None:
            raise checks.UsageError("threshold must be a finite number in [0, 1], got None")
        checks.probability("threshold", threshold)
        self.threshold, self.mode = float(threshold), mode

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        conf = conf.detach().cpu()  # host, like every scheduler
        score = survival(conf) if self.mode == "cumulative" else conf.double()
        return (score >= self.threshold).long().cumprod(-1).sum(-1)


class DraftGate:
    """Skip the drafter for a whole step when drafting has not paid on this machine (decided before drafting).

    Every step the engine reports whether it drafted, its batch size R, the tokens it committed and its wall time. The
    gate keeps, per R, the last ``window`` drafted steps and the last ``window`` plain steps, and their rate as
    committed tokens over seconds summed over the window (a ratio of sums: one unlucky step does not decide); before
    measuring plain steps it uses the SPS table's R * SPS(R). It drafts the first ``warmup`` steps at a batch size
    whatever the rates: the first rounds of a response are the ones a drafter predicts worst, and judged on them alone a
    drafter that pays later would be locked out for good. Otherwise it drafts while the drafted rate is at least the
    plain rate; otherwise it skips, and probes (drafts once) after ``probe`` skipped steps, doubling the interval up to
    ``max_probe`` while skipping keeps winning, so it returns to drafting when the estimate turns (a better-matched
    prompt, a longer context, another batch size). Drafted steps older than ``max_age`` steps give way to fresher ones
    (a probe's); while none is fresh the last ones still stand, so a gate that skips keeps skipping until its next probe
    rather than warming up again each time they expire (which would draft steps that lose, over and over).

    Lossless: the decision at step t uses only steps < t (their tokens, acceptance and timing), never the
    drafts of step t, so it is a non-anticipating choice of l_r = 0 for every request.
    """

    def __init__(
        self, probe: int = 8, max_probe: int = 64, window: int = 16, warmup: int = 2, max_age: int = 64
    ) -> None:
        if min(probe, max_probe, window, max_age) < 1 or warmup < 0:
            raise UsageError("probe, max_probe, window and max_age must be >= 1 and warmup >= 0")
        self.probe, self.max_probe, self.window, self.warmup = probe, max_probe, window, warmup
        self.max_age = max_age
        self.reset()

    def reset(self) -> None:
        self.steps: dict[tuple[bool, int], deque[tuple[int, int, float]]] = {}  # (drafted, R) -> (step, tokens, s)
        self.now = 0  # steps observed
        self.drafted: dict[int, int] = {}  # R -> drafted steps observed (the warm-up counts them)
        self.skipped = 0
        self.interval = self.probe

    def _fresh(self, drafted: bool, R: int) -> list[tuple[int, int, float]]:
        return [x for x in self.steps.get((drafted, R), ()) if x[0] > self.now - self.max_age]

    def rate(self, drafted: bool, R: int) -> float | None:
        """Committed tokens per second over the window of (drafted, R) steps no older than ``max_age`` steps."""
        return _ratio(self._fresh(drafted, R))

    def wants_draft(self, R: int, plain_rate: float | None) -> bool:
        seen = self.steps.get((True, R), ())
        drafted = _ratio(self._fresh(True, R) or list(seen))  # none fresh: the last ones stand until a probe
        plain = self.rate(False, R)
        plain = plain_rate if plain is None else plain
        if self.drafted.get(R, 0) < self.warmup or drafted is None or plain is None or drafted >= plain:
            self.skipped, self.interval = 0, self.probe
            return True
        if self.skipped >= self.interval:  # probe: draft once to refresh the estimate
            self.skipped, self.interval = 0, min(2 * self.interval, self.max_probe)
            return True
        self.skipped += 1
        return False

    def observe(self, drafted: bool, R: int, tokens: int, seconds: float) -> None:
        self.now += 1
        if seconds <= 0:
            return
        if drafted:
            self.drafted[R] = self.drafted.get(R, 0) + 1
        self.steps.setdefault((drafted, R), deque(maxlen=self.window)).append((self.now, tokens, seconds))


def _ratio(steps: list[tuple[int, int, float]]) -> float | None:
    """Committed tokens over seconds summed over (step, tokens, seconds) records, None for none."""
    return sum(t for _, t, _ in steps) / sum(s for _, _, s in steps) if steps else None


TIMINGS = ("model", "live")


class _SPSScheduler(Scheduler):
    """Shared by the SPS-driven schedulers: the table, the drafting cost and the draft gate.

    ``timing="model"`` (default, reproducible): a step's time is modelled as 1 / SPS(B) for its B verified
    tokens plus the drafter's cost per round at its batch size, profiled once per (drafter, machine) and cached
    (:mod:`dspark_lightning.infer.profiling.measure_draft_cost`, handed over by :meth:`use_hardware`); ℓ and the gate
    then depend only on the confidences and the tokens committed so far, so the same call with the same seed gives
    the same output under any machine load. ``timing="live"`` uses this
    run's wall clock instead (an EMA of drafting time, measured step rates): it adapts to the load of the
    moment and is not reproducible at T > 0.
    """

    def __init__(
        self,
        sps: SPSTable | str | None = None,
        context_len: int = 512,
        include_draft_time: bool = True,
        skip_draft: bool = True,
        timing: str = "model",
        draft_cost: float | None = None,
    ):
        if timing not in TIMINGS:
            raise UsageError(f"timing must be one of {TIMINGS}, got {timing!r}")
        if draft_cost is not None and not (draft_cost >= 0 and math.isfinite(draft_cost)):
            raise UsageError(f"draft_cost must be a finite number of seconds >= 0, got {draft_cost}")
        self.sps = SPSTable.load(sps) if isinstance(sps, str) else sps
        if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
            raise UsageError(
                f"context_len must be an integer >= 1 (cached tokens of the SPS profile), got {context_len!r}"
            )
        self.context_len = context_len
        self.include_draft_time = include_draft_time
        self.timing = timing
        self.fixed_cost = draft_cost  # seconds per round, whatever the batch (overrides the profile)
        self.cost: DraftCost | None = None  # the drafter's profiled cost per round (use_hardware)
        self.draft_s: float | None = None  # live timing: running estimate of the per-step drafting time
        self.gate = DraftGate() if skip_draft else None

    def reset(self) -> None:
        if self.gate is not None:
            self.gate.reset()

    def wants_draft(self, R: int) -> bool:
        if self.gate is None:
            return True
        plain = float(R * self.sps(R)) if self.sps is not None and R <= self.sps.max_tokens else None
        return self.gate.wants_draft(R, plain)

    def observe_step(self, drafted: bool, R: int, tokens: int, seconds: float, verified: int | None = None) -> None:
        """Model timing replaces the wall time by 1 / SPS(B) (+ the drafting cost)."""
        if self.gate is None:
            return
        if self.timing == "model":
            B = R if verified is None else verified
            if self.sps is None or B > self.sps.max_tokens:
                return
            seconds = 1.0 / float(self.sps(B)) + (self.draft_cost(R) if drafted else 0.0)
        self.gate.observe(drafted, R, tokens, seconds)

    reads_hardware = frozenset({"sps", "draft_cost"})

    def needs_hardware(self) -> frozenset[str]:
        """The SPS table unless one was given, and the drafter's cost per round for model timing that counts the
        drafting time without a fixed ``draft_cost``."""
        need = {"sps"} if self.sps is None else set()
        if self.timing == "model" and self.fixed_cost is None and self.include_draft_time and self.cost is None:
            need.add("draft_cost")
        return frozenset(need)

    def use_hardware(self, profile: HardwareProfile) -> None:
        if self.sps is None:
            self.sps = profile.sps
        if profile.draft_cost is not None:
            self.cost = profile.draft_cost

    def draft_cost(self, R: int) -> float:
        """Modelled drafting seconds of a step with R requests (0 when drafting time is not counted)."""
        if not self.include_draft_time:
            return 0.0
        if self.fixed_cost is not None:
            return self.fixed_cost
        return self.cost(R) if self.cost is not None else 0.0

    def observe_draft_time(self, seconds: float) -> None:  # live timing's estimate (no token value enters it)
        self.draft_s = seconds if self.draft_s is None else 0.7 * self.draft_s + 0.3 * seconds

    def _table(self, R: int) -> SPSTable:
        if self.sps is None:
            raise RuntimeError(
                f"{type(self).__name__} has no SPS table: pass sps=... or a HardwareProfile with one "
                "(use_hardware; decode() measures it)"
            )
        extra = self.draft_cost(R) if self.timing == "model" else (self.draft_s or 0.0)
        if not self.include_draft_time or not extra:
            return self.sps
        # Whole-step rate: the drafting cost is paid once per step whatever l is (docs/algorithm.md §6, "Optionally time
        # the whole step"); on a CPU it is comparable to a target forward and moves the optimum to longer l.
        sps = [1.0 / (1.0 / v + extra) if v > 0 else 0.0 for v in self.sps.sps]
        return SPSTable(tokens=self.sps.tokens, sps=sps, meta=self.sps.meta)


def step_in_curve(sps: SPSTable, R: int = 1, span: int = 6, ratio: float = 3.0) -> int | None:
    """B = R when verifying one token more than R costs over ``ratio`` x the mean cost of each of the next ``span``
    (a step in the step-time curve 1/SPS), else None (a smooth curve, or a table too short to judge). At a step
    Algorithm 1's early break stops although a longer block would pay (docs/algorithm.md §6: the break needs a
    smooth SPS)."""
    cost = [1.0 / float(sps(torch.tensor(float(b)))) for b in range(R, min(sps.max_tokens, R + span + 1) + 1)]
    if len(cost) < span + 2:
        return None
    first, rest = cost[1] - cost[0], (cost[-1] - cost[1]) / span
    return R if first > 0 and first > ratio * max(rest, 0.0) else None


@register("scheduler", "hardware_aware")
class HardwareAwareScheduler(_SPSScheduler):
    """Paper Algorithm 1 with the early-stopping break, driven by a profiled SPS table.

    Args:
        sps: an :class:`SPSTable`, a path to its JSON, or None to load/profile the target's table on first use.
        context_len: context length of the profile used when ``sps`` is None.
        include_draft_time: add the drafting cost per step to every 1/SPS(B) (whole-step rate).
        skip_draft: skip the drafter for whole steps while drafting has not paid (:class:`DraftGate`).
        timing: ``model`` (reproducible: SPS table + drafting cost profiled once and cached) or ``live`` (this
            run's wall clock; adapts to load, not reproducible at T > 0). See :class:`_SPSScheduler`.
        draft_cost: fixed drafting seconds per round (instead of the profile).
    """

    _curve_checked = False  # the SPS table's step has been looked for (once per scheduler)

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        if not self._curve_checked and self.sps is not None:
            self._curve_checked = True
            warn_on_step(self.sps)
        return prefix_schedule(conf.detach().cpu(), self._table(conf.shape[0]))


def warn_on_step(sps: SPSTable) -> None:
    """Say once per scheduler when this machine's SPS curve has a step at B = 1 (the scheduler still runs)."""
    if step_in_curve(sps) is None:
        return
    import warnings

    s1, s2 = float(sps(torch.tensor(1.0))), float(sps(torch.tensor(2.0)))
    warnings.warn(
        f"the SPS curve has a step (SPS(1) = {s1:.1f}, SPS(2) = {s2:.1f}, flat after): hardware_aware (Algorithm 1) "
        f"admits no draft unless a_1 > {s1 / s2 - 1:.2f}, even when the whole block would pay; auto looks ahead "
        "along the block (docs/inference.md)",
        stacklevel=3,
    )


@register("scheduler", "async_hardware_aware")
class AsyncHardwareAwareScheduler(_SPSScheduler):
    """The production asynchronous variant (paper §5.2).

    The budget K_t (total admitted drafts) comes from the confidences of ``lag`` steps earlier by a
    global search; the fresh confidences only rank the candidates, and the top K_t are admitted.
    Until ``lag`` steps exist, K_t is Algorithm 1's (causal) choice on the fresh pool.
    """

    def __init__(
        self,
        sps: SPSTable | str | None = None,
        context_len: int = 512,
        include_draft_time: bool = True,
        lag: int = 2,
        skip_draft: bool = True,
        timing: str = "model",
        draft_cost: float | None = None,
    ) -> None:
        super().__init__(sps, context_len, include_draft_time, skip_draft, timing, draft_cost)
        if lag < 1:
            raise UsageError(f"lag must be >= 1, got {lag}")
        self.lag = lag
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.history: deque[torch.Tensor] = deque(maxlen=self.lag)

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        conf = conf.detach().cpu()
        sps = self._table(conf.shape[0])
        a = survival(conf)
        if len(self.history) == self.lag:
            K = global_capacity(self.history[0], sps)
        else:
            K = int(prefix_schedule(conf, sps).sum())
        self.history.append(a)
        return admit_top(a, K, sps)


class OnlineCalibration:
    """Per-position logit shifts learned from this run's finished rounds: ĉ'_k = σ(logit ĉ_k + δ_k).

    Each verified position k of a round that reached it (ℓ ≥ k, m ≥ k − 1) is one observation of the outcome
    y = 1[m ≥ k] beside the prediction ĉ_k. δ_k moves the mean prediction onto the observed rate, with ``prior``
    pseudo-observations at the prediction itself: δ_k = logit((Σy + prior·p̄) / (n + prior)) − logit(p̄), p̄ the mean
    ĉ_k of those rounds. A position with no observation borrows the shift of the deepest position observed (0 before
    any). The expectation of a position not yet ranked (the lookahead's and the gate's) is the mean of ĉ'_k over
    the last ``window`` drafted steps, every one corrected with the current shifts, so a correction learned late
    applies to the whole window at once. Lossless: the shifts and means of step t come from steps < t only.
    """

    def __init__(self, prior: float = 8.0, clip: float = 4.0, window: int = 50) -> None:
        self.prior, self.clip, self.window = prior, clip, window
        self.reset()

    def reset(self) -> None:
        self.n: list[int] = []  # observations per position
        self.y: list[float] = []  # their outcomes, summed
        self.p: list[float] = []  # their predictions ĉ_k, summed
        self.recent: deque[torch.Tensor] = deque(maxlen=self.window)  # logit ĉ of the last drafted steps
        self.drafted = 0
        self._shift: torch.Tensor | None = None
        self._mean: list[float] | None = None
        self._survival: list[float] = []

    def _grow(self, g: int) -> None:
        while len(self.n) < g:
            self.n.append(0)
            self.y.append(0.0)
            self.p.append(0.0)

    def shifts(self, g: int) -> torch.Tensor:
        if self._shift is not None and len(self._shift) == g:
            return self._shift
        self._grow(g)
        out, carry = [], 0.0
        for k in range(g):
            if self.n[k]:
                pbar = min(max(self.p[k] / self.n[k], 1e-4), 1 - 1e-4)
                rate = (self.y[k] + self.prior * pbar) / (self.n[k] + self.prior)
                carry = max(-self.clip, min(self.clip, math.log(rate / (1 - rate)) - math.log(pbar / (1 - pbar))))
            out.append(carry)
        self._shift = torch.tensor(out, dtype=torch.float64)
        return self._shift

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        c = conf.double().clamp(1e-6, 1 - 1e-6)
        return torch.sigmoid(torch.logit(c) + self.shifts(c.shape[1]))

    def _window(self) -> None:
        """The mean over the window of ĉ'_k and of the survival Π_{j≤k} ĉ'_j per position, each row corrected with
        the current shifts (a row's own product: positions of one round rise and fall together)."""
        g = max((t.shape[1] for t in self.recent), default=0)
        conf, surv, count = (torch.zeros(g, dtype=torch.float64) for _ in range(3))
        shift = self.shifts(g) if g else None
        for logit in self.recent:
            w = logit.shape[1]
            c = torch.sigmoid(logit + shift[:w])
            conf[:w] += c.sum(0)
            surv[:w] += c.cumprod(1).sum(0)
            count[:w] += logit.shape[0]
        self._mean = (conf / count.clamp(min=1)).tolist()
        self._survival = (surv / count.clamp(min=1)).tolist()

    @property
    def mean(self) -> list[float]:
        """Mean ĉ'_k per position over the window (empty before any drafted step)."""
        if self._mean is None:
            self._window()
        return self._mean

    @property
    def survival(self) -> list[float]:
        """Mean survival a_k = Π_{j≤k} ĉ'_j per position over the window (empty before any drafted step)."""
        if self._mean is None:
            self._window()
        return self._survival

    def expected(self, k: int) -> float | None:
        """The mean of ĉ'_k (0-based k) over the window, None before any drafted step."""
        mean = self.mean
        return mean[k] if self.drafted and k < len(mean) else None

    def observe(self, conf: torch.Tensor, lengths: torch.Tensor, accepted: list[int]) -> None:
        R, g = conf.shape
        self.drafted += 1
        self._grow(g)
        c = conf.double().clamp(1e-6, 1 - 1e-6)
        self.recent.append(torch.logit(c))
        rows = c.tolist()
        for r in range(R):
            m, ell = int(accepted[r]), int(lengths[r])
            for k in range(min(ell, m + 1)):  # verified positions the round reached
                self.n[k] += 1
                self.y[k] += 1.0 if m >= k + 1 else 0.0
                self.p[k] += rows[r][k]
        self._shift = None
        self._mean = None


def step_rates(sps: SPSTable, extra: float = 0.0) -> list[float]:
    """Steps per second at B = 0..max_tokens, with ``extra`` seconds added to every step (the drafting cost)."""
    base = sps(torch.arange(sps.max_tokens + 1, dtype=torch.float64)).tolist()
    return [1.0 / (1.0 / v + extra) if v > 0 else 0.0 for v in base]


def lookahead_schedule(conf: torch.Tensor, rates: list[float], expected=None) -> torch.Tensor:
    """Algorithm 1 whose stopping test looks ahead: candidate n (request r, position j) of the ranked pool is
    admitted when admitting it and up to γ − j more positions of request r would beat stopping, valuing position
    j + i at a_{r,j} · Π_{l≤i} e_{j+l}, with e_k = ``expected(k)`` (earlier rounds' mean confidence) or, without
    one, r's own ĉ_{r,j}. The first candidate that fails stops the walk.

    Non-anticipating like Algorithm 1: the test of (r, j) reads the candidates ranked at or above it, a_{r,j} and
    ĉ_{r,j} (computed before x_{r,j} was drawn) and earlier rounds, never ĉ_{r,j+1}, which depends on x_{r,j}. With
    no lookahead it is Algorithm 1. It admits blocks that pay where Algorithm 1 stops at the first step of a stepped
    SPS curve (one more verified token costing much more than each of the next ones). ``rates``: steps per second
    at B = 0, 1, ... (:func:`step_rates`), none beyond the list."""
    R, g = conf.shape
    c = conf.double().clamp(0, 1)
    a = c.cumprod(-1)
    values, req = ranked_pool(a)
    if not len(values):
        return torch.zeros(R, dtype=torch.long)
    pos = torch.zeros(R, dtype=torch.long)  # positions admitted so far per request
    limit = len(rates) - 1
    B, tau = R, float(R)
    for v, r in zip(values.tolist(), req.tolist(), strict=True):
        j = int(pos[r])  # 0-based position of this candidate
        if B + 1 > limit:
            break
        current = tau * rates[B]
        best, extra, a_next = -1.0, 0.0, v
        for i in range(0, min(g - j, limit - B)):  # admit it plus i further positions of request r
            if i:
                e = expected(j + i) if expected is not None else None
                a_next *= float(c[r, j]) if e is None else e
                extra += a_next
            best = max(best, (tau + v + extra) * rates[B + 1 + i])
        if best <= current:
            break
        tau += v
        B += 1
        pos[r] += 1
    return pos


def uniform_schedule(conf: torch.Tensor, rates: list[float], expected=None) -> torch.Tensor:
    """:func:`lookahead_schedule` for a padded verifier, whose forward computes 1 + max ℓ positions in every row
    whatever the lengths: every request verifies the same n drafts, and the walk raises n while admitting position n
    of every request (plus, looking ahead, up to γ − n more valued as in :func:`lookahead_schedule`) beats stopping,
    a step of R requests costing ``rates[R (1 + n)]``.

    Non-anticipating: including position n of request r reads its a_{r,n} (computed before x_{r,n} was drawn), the
    other requests' (independent of r's drafts) and earlier rounds."""
    R, g = conf.shape
    c = conf.double().clamp(0, 1)
    a = c.cumprod(-1)
    column = a.sum(0).tolist()  # what position n adds over all requests
    limit = len(rates) - 1
    n, tau = 0, float(R)
    while n < g and R * (n + 2) <= limit:
        current = tau * rates[R * (1 + n)]
        best, extra, a_next = -1.0, 0.0, a[:, n]
        for i in range(0, g - n):
            B = R * (n + 2 + i)
            if B > limit:
                break
            if i:
                e = expected(n + i) if expected is not None else None
                a_next = a_next * (c[:, n] if e is None else e)
                extra += float(a_next.sum())
            best = max(best, (tau + column[n] + extra) * rates[B])
        if best <= current:
            break
        tau += column[n]
        n += 1
    return torch.full((R,), n, dtype=torch.long)


@register("scheduler", "auto")
class AutoScheduler(_SPSScheduler):
    """The default: the verification length that pays on this machine, from confidences corrected by this run.

    - ĉ is corrected online (:class:`OnlineCalibration`): a drafter whose confidences are miscalibrated for these
      prompts (no calibration file, another serving temperature, another prompt distribution) is put right by the
      rounds it has already run.
    - A step's time: the engine's own plain and drafted steps at R requests verifying B tokens, profiled once per
      (drafter, machine) with the drafting cost (:class:`~.draft_cost.DraftCost`), so everything a step does
      beyond the target's forward is counted for plain decoding and drafting alike; without that profile (a given
      ``sps`` and ``draft_cost``), the SPS table plus the drafting cost.
    - ℓ: :func:`lookahead_schedule` on those whole-step rates, which is Algorithm 1 on a smooth curve and still
      admits the blocks that pay at a step of the curve; with a padded verifier (every row computes 1 + max ℓ
      positions), :func:`uniform_schedule`, priced at what the padded step computes.
    - Whether to draft at all: the best fixed verification length n for R requests whose drafts survive as the
      recent rounds' did (the window's mean of each round's own survival Π ĉ', corrected), R (1 + Σ_{k≤n} a_k) over
      the modelled step time, against plain decoding's R tokens per plain step, drafting only when it is ``margin``
      faster (a gain smaller than the estimate's error is not worth the risk); a skipping gate drafts again after
      ``probe`` skipped steps (doubling up to ``max_probe``) to refresh its estimate, verifying at least one draft
      per request there (a probe that verified nothing would observe nothing). Probes cost at most ``probe_budget``
      of plain decoding's time: the skips between two probes are at least a probe's modelled time beyond a plain
      step, in plain steps, over that budget (at batch 8 a drafted step can cost most of a plain step more).

    Every decision reads the current confidences as Algorithm 1 does and earlier steps otherwise, so the output law
    is the target's; with ``timing="model"`` (default) nothing depends on the wall clock.
    """

    def __init__(
        self,
        sps: SPSTable | str | None = None,
        context_len: int = 512,
        include_draft_time: bool = True,
        skip_draft: bool = True,
        timing: str = "model",
        draft_cost: float | None = None,
        online: bool = True,
        probe: int = 8,
        max_probe: int = 64,
        margin: float = 0.03,
        probe_budget: float = 0.01,
    ) -> None:
        super().__init__(sps, context_len, include_draft_time, False, timing, draft_cost)
        checks.at_least("probe", probe, 1)
        checks.in_range("probe_budget", probe_budget, 0.0, 1.0, open_low=True)
        checks.at_least("max_probe", max_probe, 1)
        checks.in_range("margin", margin, 0.0)
        self.skip_draft, self.online_on, self.probe, self.max_probe = skip_draft, online, probe, max_probe
        self.margin, self.probe_budget = margin, probe_budget
        self.online = OnlineCalibration()
        self.padded = False  # how the engine verifies (its HardwareProfile says)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.online.reset()
        self.skipped, self.interval = 0, self.probe
        self.probing = False  # this step drafts only to refresh the estimate: it verifies at least one draft
        self._rate_cache: dict = {}
        self._pays_cache: dict = {}
        self._gap: dict[int, int] = {}  # R -> the fewest skips between two probes

    def _conf(self, conf: torch.Tensor) -> torch.Tensor:
        return self.online(conf) if self.online_on else conf.double()

    def _steps(self) -> bool:
        """Whether a step's time comes from the engine's profiled whole steps (model timing, profiled cost)."""
        return self.timing == "model" and self.fixed_cost is None and self.cost is not None and self.cost.has_steps

    def _rates(self, R: int, g: int) -> list[float]:
        """Whole-step rates at B = 0..R·(1 + g) for R requests: from the profiled plain and drafted steps where there
        are some, else the SPS table plus the drafting cost at R requests; cached per (R, g)."""
        if self._steps():
            key = ("steps", R, g)
            if self._rate_cache.get("key") != key:
                step = [1.0 / self.cost.step_seconds(R, max(B, R)) for B in range(R * (1 + g) + 1)]
                self._rate_cache = {"key": key, "rates": step}
            return self._rate_cache["rates"]
        if self.sps is None:
            self._table(R)  # refuses a scheduler without an SPS table
        extra = self.draft_cost(R) if self.timing == "model" else (self.draft_s or 0.0)
        key = (R, extra)
        if self._rate_cache.get("key") != key:
            self._rate_cache = {"key": key, "rates": step_rates(self.sps, extra)}
        return self._rate_cache["rates"]

    def _plain_rate(self, R: int) -> float:
        """Tokens per second of plain decoding at R requests."""
        return R / self.cost.plain_seconds(R) if self._steps() else R * float(self.sps(R))

    def use_hardware(self, profile: HardwareProfile) -> None:
        super().use_hardware(profile)
        self.padded = profile.padded

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        conf = conf.detach().cpu()
        expected = self.online.expected if self.online_on else None
        walk = uniform_schedule if self.padded else lookahead_schedule
        lengths = walk(self._conf(conf), self._rates(*conf.shape), expected)
        if self.probing:  # a probe that verified nothing would observe nothing and leave the gate shut for good
            lengths, self.probing = lengths.clamp(min=1), False
        return lengths

    def observe_rounds(self, conf: torch.Tensor, lengths: torch.Tensor, accepted: list[int]) -> None:
        self.online.observe(conf.detach().cpu(), lengths, accepted)

    def drafting_pays(self, R: int) -> bool | None:
        """Whether R requests with the earlier rounds' mean survival would commit tokens faster drafting than plain
        (None before any drafted round, or when R is beyond the SPS table)."""
        if not self.online.drafted or (not self._steps() and (self.sps is None or R > self.sps.max_tokens)):
            return None
        key = (R, self.online.drafted)  # its inputs change only with R and after a drafted round
        if self._pays_cache.get("key") != key:
            self._pays_cache = {"key": key, "pays": self._drafting_pays(R)}
        return self._pays_cache["pays"]

    def _drafting_pays(self, R: int) -> bool:
        """The best fixed verification length for R requests whose drafts survive as the window's rounds did, in
        tokens per second, against plain decoding's, which it must beat by ``margin``."""
        a = self.online.survival
        rates = self._rates(R, len(a))
        gains = [0.0]
        for v in a:
            gains.append(gains[-1] + v)
        fits = [n for n in range(1, len(a) + 1) if R * (1 + n) < len(rates)]
        best = max((R * (1 + gains[n]) * rates[R * (1 + n)] for n in fits), default=0.0)
        return best > (1 + self.margin) * self._plain_rate(R)

    def min_gap(self, R: int) -> int:
        """The fewest skipped steps between two probes of R requests: a probe (one draft per request) costs its
        modelled time beyond a plain step, which the skips' plain steps must dilute to ``probe_budget``."""
        if R not in self._gap:
            rates = self._rates(R, 1)
            extra = self._plain_rate(R) / (R * rates[min(2 * R, len(rates) - 1)]) - 1.0
            self._gap[R] = max(1, math.ceil(max(extra, 0.0) / self.probe_budget))
        return self._gap[R]

    def wants_draft(self, R: int) -> bool:
        if not self.skip_draft:
            return True
        pays = self.drafting_pays(R)
        self.probing = False
        if pays is None or pays:
            self.skipped, self.interval = 0, self.probe
            return True
        # probe: draft once, verifying at least one draft, to refresh the estimate
        if self.skipped >= max(self.interval, self.min_gap(R)):
            self.skipped, self.interval, self.probing = 0, min(2 * self.interval, self.max_probe), True
            return True
        self.skipped += 1
        return False


def build_scheduler(spec: Any) -> Scheduler:
    """A scheduler from its spec, a :class:`Scheduler` (returned as is) or a plain function ``conf -> lengths``
    (wrapped). The spec is a component's one spelling (:func:`~dspark_lightning.registry.build`): a registered name
    (``"auto"``) or ``{"class_path": "static", "init_args": {"gamma": 3}}``; the constructors check their arguments."""
    if isinstance(spec, str) and ":" in spec:
        name = spec.partition(":")[0]
        get("scheduler", name)  # an unknown name is named first
        takes = ", ".join(scheduler_params(name)) or "none"
        raise checks.UsageError(f"scheduler {spec!r}: name a scheduler and its arguments as {{class_path: {name}, "
                                f"init_args: {{...}}}} (its arguments: {takes})")  # fmt: skip
    if isinstance(spec, (str, dict)):
        spec = build("scheduler", spec)
    if isinstance(spec, Scheduler):
        return spec
    if callable(spec):
        hooks = [h for h in HOOKS if callable(getattr(spec, h, None))]
        if hooks:  # an object with hooks that is not a Scheduler: its hooks would be silently ignored
            raise checks.UsageError(
                f"scheduler {type(spec).__name__} has {', '.join(hooks)} but is not a subclass of "
                "dspark_lightning.infer.Scheduler, so the engine would never call them; subclass it"
            )
        return FunctionScheduler(spec)
    raise checks.UsageError(f"a scheduler is a registered name, {{class_path: NAME, init_args: {{...}}}}, a Scheduler "
                            f"or a function conf -> lengths, got {checks.short(spec)}")  # fmt: skip


def scheduler_params(name: str) -> list[str]:
    try:
        return list(inspect.signature(get("scheduler", name)).parameters)
    except RegistryError:
        return []


def scheduler_spec(value: Any, sps: str | SPSTable | None = None) -> Any:
    """A command's ``--scheduler`` value as its spec, checked once before any work: a registered name or a YAML
    ``{class_path: ..., init_args: {...}}`` (a spec already parsed is taken as is). ``sps``: a measured SPS table
    (its JSON path) for a scheduler that takes one and is not given one."""
    import yaml

    if isinstance(value, str):
        try:
            value = yaml.safe_load(value) if value.strip().startswith("{") else value.strip()
        except yaml.YAMLError:
            raise checks.UsageError(f"scheduler {value!r} is not a name or a YAML mapping") from None
    if sps is not None and isinstance(value, (str, dict)):
        spec = {"class_path": value} if isinstance(value, str) else dict(value)
        path = spec.get("class_path")
        if isinstance(path, str) and "sps" in scheduler_params(path) and "sps" not in (spec.get("init_args") or {}):
            value = {**spec, "init_args": {**(spec.get("init_args") or {}), "sps": sps}}
    try:
        build_scheduler(value)
    except (TypeError, ValueError) as exc:  # a plugin's constructor refusing the user's value
        if isinstance(exc, checks.UsageError):
            raise
        raise checks.UsageError(f"scheduler {checks.short(value)}: {' '.join(str(exc).split())}") from exc
    return value
