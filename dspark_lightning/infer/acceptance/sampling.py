"""Sampling laws shared by the draft and the target (docs/algorithm.md §1, "Numerics and temperature").

Both sides turn logits into probabilities with the same :func:`probs` (temperature, then top-k,
then top-p, as HF's warpers), once, in fp32. Tokens are drawn from exactly that tensor, and the
acceptance test and the residual read the same tensor. Below ``GREEDY_EPS`` the law is the
one-hot argmax, computed with integer comparisons (never a division by T = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

GREEDY_EPS = 1e-5


def reads_are_free(device: torch.device) -> bool:
    """Whether the host may read a tensor on ``device`` for nothing (a CPU device), so that a data-dependent shortcut
    may read it; on an accelerator each such read waits for the device queue to drain, and the shortcut is skipped.
    (``HostReads``, the tests' counter of host reads in ``tests/infer/host_reads.py``, answers False while it counts, to
    count the accelerator's path.)"""
    return device.type == "cpu"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 (or < 1e-5) = greedy
    top_k: int | None = None  # keep the k most likely tokens (None = all)
    top_p: float | None = None  # keep the smallest set with mass >= top_p (None = all)

    def __post_init__(self) -> None:
        """The one check of the sampling arguments: every route (decode(), the engine, regeneration, the commands)
        builds its law here."""
        from ... import checks

        if self.temperature is None:
            raise checks.UsageError("temperature must be given, got None")
        checks.in_range("temperature", self.temperature, 0.0)
        checks.at_least("top_k", self.top_k, 1)
        checks.in_range("top_p", self.top_p, 0.0, 1.0, open_low=True)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits (..., V) -> the sampling law (..., V) in fp32. Greedy gives the one-hot argmax."""
    z = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).float()
    z = z / params.temperature
    if params.top_k is not None and params.top_k < z.shape[-1]:
        kth = torch.topk(z, params.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        z = z.masked_fill(top_p_drop(z, params.top_p), float("-inf"))
    return z.softmax(-1)


M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """x * m mod 2^32 for int64 tensors holding 32-bit values, in two 16-bit halves (no int64 overflow)."""
    lo = x * (m & 0xFFFF)
    hi = ((x * (m >> 16)) & 0xFFFF) << 16
    return (lo + hi) & M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (Wellons' lowbias32): every input bit changes every output bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


class Streams:
    """Per-request random streams as counters: request r's j-th uniform is a hash of (its 63-bit key, j), so a
    batch of R requests draws all its numbers in one set of kernels (a ``torch.Generator`` per request launches
    one per request), and what a request draws never depends on which others share its batch. ``used`` is how
    many numbers each row has drawn from this object (the caller adds it to the requests' counters)."""

    def __init__(self, keys: list[int], counters: list[int], device) -> None:
        k = torch.tensor([[key & M32, (key >> 32) & M32] for key in keys], dtype=torch.long).reshape(-1, 2)
        self.k = _hash32(k).to(device, non_blocking=True)  # (R, 2) mixed key words
        self.base = torch.tensor(counters, dtype=torch.long).to(device, non_blocking=True)
        self.used = 0

    def __len__(self) -> int:
        return self.base.shape[0]

    def draw(self, k: int, dtype=torch.float32) -> torch.Tensor:
        """(R, k) U[0, 1): 24 random bits for float32, 53 for float64."""
        j = (self.base[:, None] + self.used + torch.arange(k, device=self.base.device)) & M32  # (R, k)
        self.used += k
        lo, hi = self.k[:, :1], self.k[:, 1:]
        a = _hash32(_hash32(j ^ lo) ^ hi)
        if dtype == torch.float64:  # 26 + 27 bits from two independent hashes of the counter
            b = _hash32(_hash32(j ^ hi ^ 0x5BD1E995) ^ lo)
            return ((a >> 6).double() * 2.0**27 + (b >> 5).double()) * 2.0**-53
        return (a >> 8).to(dtype) * 2.0**-24


@runtime_checkable
class CoupledDraw(Protocol):
    """Randomness that picks the token itself from a law (coupled acceptance's shared Gumbel noise,
    :class:`~.coupled.CoupledNoise`) rather than handing out uniforms."""

    def coupled_draw(self, law: torch.Tensor) -> torch.Tensor:
        """One token per row of ``law`` (R, V)."""
        ...


Generators = torch.Generator | list[torch.Generator] | Streams | CoupledDraw | None


def uniforms(rows: int, k: int, generator: Generators, device, dtype=torch.float32) -> torch.Tensor:
    """(rows, k) U[0, 1) draws: from one generator, from :class:`Streams` (row r from request r's counter), or
    row r from ``generator[r]`` (per-request streams, so a request's draws do not depend on which other requests
    share its batch)."""
    if isinstance(generator, Streams):
        if len(generator) != rows:
            raise ValueError(f"{len(generator)} per-row streams for {rows} rows")
        return generator.draw(k, dtype)
    if not isinstance(generator, list):
        return torch.rand(rows, k, generator=generator, device=device, dtype=dtype)
    if len(generator) != rows:
        raise ValueError(f"{len(generator)} per-row generators for {rows} rows")
    return torch.stack([torch.rand(k, generator=g, device=device, dtype=dtype) for g in generator])


TOP_P_CANDIDATES = 256


def top_p_drop(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """HF TopPLogitsWarper's rule, (..., V) bool: drop a token when the mass of the tokens ranked above it is
    already >= top_p (the top token is always kept). Exact; the nucleus is searched among the
    ``TOP_P_CANDIDATES`` most likely tokens first, and only rows whose nucleus is wider get a full sort (a full
    sort of a large vocabulary per row is costly on a CPU)."""
    p = z.softmax(-1)
    k = min(TOP_P_CANDIDATES, z.shape[-1])
    vals, idx = torch.topk(p, k, dim=-1)  # descending
    above = vals.cumsum(-1) - vals  # mass ranked strictly above each candidate
    covered = reads_are_free(z.device) and bool((above[..., -1] + vals[..., -1] >= top_p).all())
    if k < z.shape[-1] and not covered:  # always on an accelerator: a sort is cheap there, the test is a sync
        vals, idx = torch.sort(p, dim=-1, descending=True)
        above = vals.cumsum(-1) - vals
    keep = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, idx, above < top_p)
    return ~keep


CHUNK = 256


def sample(p: torch.Tensor, params: SamplingParams, generator: Generators) -> torch.Tensor:
    """Draw one token per row from ``p`` (..., V) -> (...). Greedy takes the argmax (no randomness used; ``p`` may
    then be logits).

    Inverse CDF with one uniform u per row, in two levels so that no (rows, V) float64 tensor is made: the chunk
    of ``CHUNK`` tokens whose cumulative mass (float64, over V / CHUNK chunk sums) first exceeds u * total, then,
    with the position of u * total inside that chunk rescaled to a uniform, the token inside it. A token (or a
    chunk) of probability 0 never has a cumulative mass above its predecessor's, so it is never drawn.
    """
    if params.greedy:
        return p.argmax(-1)
    flat = p.reshape(-1, p.shape[-1])
    if isinstance(generator, CoupledDraw):  # coupled acceptance: the Gumbel-max draw with the shared noise
        return generator.coupled_draw(flat).view(p.shape[:-1])
    R, V = flat.shape
    u = uniforms(R, 1, generator, p.device, torch.float64)[:, 0]
    C = min(CHUNK, V)
    n = -(-V // C)
    chunks = torch.nn.functional.pad(flat, (0, n * C - V)).view(R, n, C)
    mass = chunks.sum(-1, dtype=torch.float64)  # (R, n)
    cum = mass.cumsum(-1)
    t = u * cum[:, -1]
    j = torch.searchsorted(cum, t[:, None], right=True).clamp_(max=n - 1)  # (R, 1) the chunk
    before = cum.gather(1, j) - mass.gather(1, j)
    inner = chunks.gather(1, j[:, :, None].expand(R, 1, C))[:, 0].double().cumsum(-1)  # (R, C)
    w = ((t[:, None] - before) / mass.gather(1, j)).clamp_(0.0, 1.0 - 2.0**-53)  # uniform inside the chunk
    i = torch.searchsorted(inner, w * inner[:, -1:], right=True).clamp_(max=C - 1)
    return (j * C + i)[:, 0].view(p.shape[:-1])


def target_law(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's side of acceptance: :func:`probs`, except in greedy mode, where acceptance reads only the
    argmax and the fp32 logits serve (no (…, V) one-hot tensor)."""
    return logits.float() if params.greedy else probs(logits, params)
