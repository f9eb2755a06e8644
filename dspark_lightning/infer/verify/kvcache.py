"""A batched KV cache whose entries each belong to one request at one position (or are free).

Speculative decoding appends blocks of different useful lengths per request and rolls each
request back to its own accepted length. Instead of moving tensors every round, every cache
column carries ``owner`` (request id, -1 = free) and ``pos`` (the token position), and attention
masks are derived from them: a query of request r at position P sees the live keys of r at
positions <= P. Rolling back is marking entries free; :meth:`RaggedCache.compact` squeezes the
free entries out once they make up most of the cache.

Two batching modes (``flat=False|True``):
- padded: one row per request; a forward over R requests is an (R, max length) grid with padding;
- flat: one row for all requests; a forward is one strip of sum(lengths) tokens, with a
  block-diagonal mask (no padding compute, a longer key axis).

The layer tensors live in objects with ``keys``/``values`` (rows, H, S, Dh) attributes: HF's
``DynamicLayer`` for the target (the model appends to them itself) or :class:`KVLayer` for the
drafter context cache.

No per-round copy grows with the context: ``owner``/``pos`` and a :class:`KVLayer`'s ``keys``/``values``
are views of the used prefix of a :class:`Buffer` whose capacity doubles when short, and a round's new
columns are written into its free tail (amortised O(new columns)). Adding rows, removing requests and
compaction write in place too while the capacity suffices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import UsageError


def _grown(capacity: int, need: int) -> int:
    return capacity if need <= capacity else max(need, 2 * capacity)


class Buffer:
    """A tensor's used prefix ``used`` = ``data[:rows]`` narrowed to ``length`` columns along ``dim``.

    ``data`` has spare rows and columns; growing past them doubles the short capacity (the prefix is copied
    once), so appending L columns costs O(L) amortised. Cells that become used by :meth:`resize` hold ``fill``.
    """

    def __init__(self, dim: int, fill: float | int = 0) -> None:
        self.dim, self.fill = dim, fill
        self.data: torch.Tensor | None = None  # None until the first write fixes the other dims
        self.rows = self.length = 0
        self.ahead = 0  # columns past ``length`` written by :meth:`lookahead` (kept by a reallocation)

    @property
    def used(self) -> torch.Tensor | None:
        return None if self.data is None else self.data[: self.rows].narrow(self.dim, 0, self.length)

    def reserve(self, rows: int, length: int, like: torch.Tensor | None = None) -> None:
        """Capacity for (rows, length) at least (``like`` gives dtype and other dims of a first allocation)."""
        old = self.data
        base = old if old is not None else like
        cap_r, cap_c = (old.shape[0], old.shape[self.dim]) if old is not None else (0, 0)
        if old is not None and rows <= cap_r and length <= cap_c:
            return
        shape = list(base.shape)
        shape[0], shape[self.dim] = _grown(cap_r, rows), _grown(cap_c, length)
        n = self.length + self.ahead
        kept = None if old is None else old[: self.rows].narrow(self.dim, 0, n)
        self.data = base.new_full(shape, self.fill)
        if kept is not None:
            self.data[: self.rows].narrow(self.dim, 0, n).copy_(kept)  # the one copy of the prefix a doubling costs

    def resize(self, rows: int, length: int) -> None:
        """Used shape -> (rows, length); cells that become used hold ``fill``."""
        self.reserve(rows, length)
        r0, c0 = min(self.rows, rows), min(self.length, length)
        self.rows, self.length, self.ahead = rows, length, 0
        used = self.used
        used[r0:].fill_(self.fill)
        used[:r0].narrow(self.dim, c0, length - c0).fill_(self.fill)

    def append(self, t: torch.Tensor) -> None:
        """Write ``t`` (rows, ..., L, ...) into the next L columns."""
        if self.data is not None and t.shape[0] != self.rows:
            raise UsageError(f"appending {t.shape[0]} rows to a buffer of {self.rows}")
        L = t.shape[self.dim]
        self.reserve(t.shape[0], self.length + L, like=t)
        self.rows = t.shape[0]
        self.data[: self.rows].narrow(self.dim, self.length, L).copy_(t)
        self.length, self.ahead = self.length + L, 0

    def lookahead(self, t: torch.Tensor, offset: int) -> torch.Tensor:
        """Write ``t`` (rows, ..., L, ...) at columns length+offset.. without committing them (the next append
        overwrites them); the view of every column through them. Replaces torch.cat([used, earlier, t])."""
        L, rows = t.shape[self.dim], self.rows
        if t.shape[0] != rows or offset > self.ahead:
            raise UsageError(f"look-ahead of {t.shape[0]} rows at +{offset} on {rows} rows with {self.ahead} ahead")
        self.reserve(rows, self.length + offset + L)  # keeps the earlier look-ahead columns
        self.data[:rows].narrow(self.dim, self.length + offset, L).copy_(t)
        self.ahead = offset + L
        return self.data[:rows].narrow(self.dim, 0, self.length + self.ahead)

    def assign(self, t: torch.Tensor) -> None:
        """Make ``t`` the used prefix: copied in place while it fits the capacity, else ``t`` becomes ``data``."""
        fits = self._fits(t)
        self.rows, self.length, self.ahead = t.shape[0], t.shape[self.dim], 0
        if fits:
            self.used.copy_(t)
        else:
            self.data = t

    def _fits(self, t: torch.Tensor) -> bool:
        d = self.data
        if d is None or (d.dtype, d.device, d.dim()) != (t.dtype, t.device, t.dim()):
            return False
        return all(
            n <= c if i in (0, self.dim) else n == c for i, (n, c) in enumerate(zip(t.shape, d.shape, strict=True))
        )


class KVLayer:
    """Keys/values of one attention layer, (rows, H, S, Dh): the fields HF's DynamicLayer has, here views of
    preallocated :class:`Buffer`\\ s that :meth:`update` appends to in place."""

    def __init__(self) -> None:
        self._k, self._v = Buffer(dim=2), Buffer(dim=2)

    @property
    def keys(self) -> torch.Tensor | None:
        return self._k.used

    @property
    def values(self) -> torch.Tensor | None:
        return self._v.used

    @property
    def is_initialized(self) -> bool:
        return self._k.data is not None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append L columns (rows, H, L, Dh)."""
        self._k.append(k)
        self._v.append(v)

    def resize(self, rows: int, length: int) -> None:
        """Used shape -> (rows, H, length, Dh); new cells are zeros (finite: masked keys must not make NaN)."""
        self._k.resize(rows, length)
        self._v.resize(rows, length)

    def reserve(self, rows: int, length: int) -> None:
        self._k.reserve(rows, length)
        self._v.reserve(rows, length)

    def lookahead(self, k: torch.Tensor, v: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uncommitted keys/values (rows, H, L, Dh) at columns S+offset..; the (rows, H, S+offset+L, Dh) views
        through them (a chain step's [context; earlier steps; this step] without concatenating the context)."""
        return self._k.lookahead(k, offset), self._v.lookahead(v, offset)

    def assign(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Replace the contents (in place while they fit the capacity)."""
        self._k.assign(k)
        self._v.assign(v)


@dataclass
class Grid:
    """Where each request's new tokens go in the (rows, L) input of one forward."""

    rows: torch.Tensor  # (R, W) row of request r's j-th token
    cols: torch.Tensor  # (R, W) column of request r's j-th token
    valid: torch.Tensor  # (R, W) bool, j < lengths[r]
    shape: tuple[int, int]  # (rows, L) of the forward input

    def scatter(self, values: torch.Tensor, fill: float | int) -> torch.Tensor:
        """(R, W, ...) per-request values -> (rows, L, ...) forward shape (``fill`` elsewhere).

        Entries past a request's length go to one spare slot that is dropped: integer indices only, so no
        boolean-mask indexing (a device -> host synchronisation on an accelerator)."""
        n, rest = self.shape[0] * self.shape[1], values.shape[2:]
        flat = torch.where(self.valid, self.rows * self.shape[1] + self.cols, n)  # (R, W)
        out = values.new_full((n + 1, *rest), fill)
        out[flat.reshape(-1)] = values.reshape(-1, *rest)
        return out[:n].view(*self.shape, *rest)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, L, ...) forward output -> (R, W, ...) per request (entries past lengths are padding)."""
        return x[self.rows, self.cols]


class RaggedCache:
    def __init__(self, layers: list, flat: bool = False, device: torch.device | str = "cpu") -> None:
        self.layers = layers
        self.flat = flat
        self.device = torch.device(device)
        rows = 1 if flat else 0
        self._owner, self._pos = Buffer(dim=1, fill=-1), Buffer(dim=1, fill=0)
        self._owner.assign(torch.full((rows, 0), -1, dtype=torch.long, device=self.device))
        self._pos.assign(torch.zeros((rows, 0), dtype=torch.long, device=self.device))
        self.slots: list[int] = []  # padded batching: request id of each row

    # --- bookkeeping -----------------------------------------------------------------------
    @property
    def owner(self) -> torch.Tensor:  # (rows, S) request id of each entry, -1 = free
        return self._owner.used

    @property
    def pos(self) -> torch.Tensor:  # (rows, S) token position of each entry
        return self._pos.used

    @property
    def rows(self) -> int:
        return self.owner.shape[0]

    @property
    def length(self) -> int:
        return self.owner.shape[1]

    def live(self) -> torch.Tensor:
        return self.owner >= 0

    def reserve(self, rows: int, length: int) -> None:
        """Capacity for (rows, length) ahead of time (bookkeeping and the initialised :class:`KVLayer`\\ s), so
        growing up to it never moves their storage."""
        self._owner.reserve(rows, length)
        self._pos.reserve(rows, length)
        for layer in self.layers:
            if isinstance(layer, KVLayer) and layer.is_initialized:
                layer.reserve(rows, length)

    def _resize(self, rows: int, length: int) -> None:
        """Every row (rows, length): new entries free, new layer cells zeros (HF layers are copied)."""
        self._owner.resize(rows, length)
        self._pos.resize(rows, length)
        for layer in self.layers:
            if isinstance(layer, KVLayer):
                if layer.is_initialized:
                    layer.resize(rows, length)
            elif _has_rows(layer):
                layer.keys, layer.values = (
                    _zero_padded(layer.keys, rows, length),
                    _zero_padded(layer.values, rows, length),
                )

    def _map_layers(self, fn) -> None:
        """Replace every layer's keys/values t by fn(t) (in place for a :class:`KVLayer` while they fit)."""
        for layer in self.layers:
            if _has_rows(layer):
                k, v = fn(layer.keys), fn(layer.values)
                if isinstance(layer, KVLayer):
                    layer.assign(k, v)
                else:
                    layer.keys, layer.values = k, v

    def add_requests(self, ids: list[int]) -> None:
        if self.flat:
            return
        self.slots.extend(ids)
        self._resize(self.rows + len(ids), self.length)

    def insert(self, rids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], pos: torch.Tensor) -> None:
        """Add G new requests' prefilled K/V (per layer (G, H, P, Dh), equal lengths) at positions ``pos`` (P,)."""
        G, P = len(rids), pos.numel()
        rid = torch.as_tensor(rids, dtype=torch.long, device=self.device)
        if self.flat:
            for layer, (k, v) in zip(self.layers, kv, strict=True):
                k, v = (t.transpose(0, 1).reshape(1, t.shape[1], G * P, t.shape[3]) for t in (k, v))
                if isinstance(layer, KVLayer):
                    layer.update(k, v)
                elif _has_rows(layer):
                    layer.keys, layer.values = torch.cat([layer.keys, k], 2), torch.cat([layer.values, v], 2)
                else:
                    _set(layer, k, v)
            self.append(rid.repeat_interleave(P)[None], pos.to(self.pos).repeat(G)[None])
            return
        self.add_requests(rids)
        rows = slice(self.rows - G, self.rows)
        if P > self.length:  # widen every row with free columns
            self._resize(self.rows, P)
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            if not _has_rows(layer):
                shape = (self.rows, k.shape[1], self.length, k.shape[3])
                _set(layer, k.new_zeros(shape), v.new_zeros(shape))
            layer.keys[rows, :, :P] = k
            layer.values[rows, :, :P] = v
        self.owner[rows, :P] = rid[:, None]
        self.pos[rows, :P] = pos.to(self.pos)

    def remove_requests(self, ids: list[int]) -> None:
        gone = torch.isin(self.owner, torch.as_tensor(ids, dtype=torch.long, device=self.device))
        self.owner.masked_fill_(gone, -1)
        if self.flat:
            return
        gone_ids = set(ids)
        keep = [i for i, rid in enumerate(self.slots) if rid not in gone_ids]
        self.slots = [self.slots[i] for i in keep]
        idx = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        self._owner.assign(self.owner[idx])
        self._pos.assign(self.pos[idx])
        self._map_layers(lambda t: t[idx])

    def grid(self, ids: list[int], lengths: torch.Tensor | list[int]) -> Grid:
        """Layout of a forward over ``ids`` with ``lengths`` new tokens each; ``lengths`` is host data (a list or a
        CPU tensor: the grid's shape is read from it, and a device tensor would cost a synchronisation)."""
        R = len(ids)
        host = [int(n) for n in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
        W = max(host, default=0)
        lengths = torch.as_tensor(host, dtype=torch.long).to(self.device, non_blocking=True)
        j = torch.arange(W, device=self.device)
        valid = j[None, :] < lengths[:, None]  # (R, W)
        if self.flat:
            starts = torch.cumsum(lengths, 0) - lengths  # (R,)
            total = sum(host)
            rows = torch.zeros((R, W), dtype=torch.long, device=self.device)
            cols = (starts[:, None] + j).clamp(max=max(total - 1, 0))
            return Grid(rows, cols, valid, (1, total))
        row_of = {rid: i for i, rid in enumerate(self.slots)}
        rows = torch.as_tensor([row_of[rid] for rid in ids], dtype=torch.long, device=self.device)
        return Grid(rows[:, None].expand(R, W), j[None, :].expand(R, W), valid, (self.rows, W))

    def append(self, owner: torch.Tensor, pos: torch.Tensor) -> None:
        """Record L new columns (rows, L), written into the free tail; the layer tensors grow by the same L (by
        the model or by the caller)."""
        self._owner.append(owner)
        self._pos.append(pos)

    def release_after(self, ids: list[int], keep_pos: torch.Tensor) -> None:
        """Free every entry of request ids[i] (host list) at a position > keep_pos[i] (rejected drafts)."""
        if not ids:
            return
        top = max(ids)
        limit = torch.full((top + 1,), torch.iinfo(torch.long).max, dtype=torch.long, device=self.device)
        limit[torch.as_tensor(ids, dtype=torch.long).to(self.device, non_blocking=True)] = keep_pos
        live = (self.owner >= 0) & (self.owner <= top)
        lim = limit[self.owner.clamp(min=0, max=limit.numel() - 1)]
        self.owner.masked_fill_(live & (self.pos > lim), -1)

    def compact(self, slack: float = 2.0, min_free: int = 16, live_max: int | None = None) -> bool:
        """Squeeze free entries out when the cache is more than ``slack`` x its live length (+ min_free).

        ``live_max``: the caller's host-side bound on any row's live entries (its longest request), so the check
        reads nothing from the device (an upper bound is enough: the extra columns are kept as free entries)."""
        live = self.live()
        counts = live.sum(1)
        if live_max is not None:
            keep = min(int(live_max), self.length)
        else:
            keep = int(counts.max()) if counts.numel() else 0
        if self.length <= slack * keep + min_free:
            return False
        order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)[:, :keep]  # live columns first, in order
        new_live = torch.arange(keep, device=self.device)[None, :] < counts[:, None]
        self._owner.assign(torch.gather(self.owner, 1, order).masked_fill(~new_live, -1))
        self._pos.assign(torch.gather(self.pos, 1, order))

        def take(t: torch.Tensor) -> torch.Tensor:
            idx = order[:, None, :, None].expand(t.shape[0], t.shape[1], keep, t.shape[3])
            return torch.gather(t, 2, idx)

        self._map_layers(take)
        return True

    # --- masks -----------------------------------------------------------------------------
    def attend(
        self, q_owner: torch.Tensor, q_pos: torch.Tensor, strict: bool = False, window: int | None = None
    ) -> torch.Tensor:
        """(rows, L, S) bool: key live, same request, key pos <= query pos (< if strict), within the window."""
        k_owner, k_pos = self.owner[:, None, :], self.pos[:, None, :]
        qo, qp = q_owner[:, :, None], q_pos[:, :, None]
        ok = (k_owner == qo) & (k_owner >= 0)
        ok &= (k_pos < qp) if strict else (k_pos <= qp)
        if window is not None:
            ok &= k_pos >= qp - window
        return ok


def _set(layer, k: torch.Tensor, v: torch.Tensor) -> None:
    """Initialise a layer's tensors (HF layers need their lazy initialisation first)."""
    if isinstance(layer, KVLayer):
        layer.assign(k, v)
        return
    init = getattr(layer, "lazy_initialization", None)
    if init is not None and not getattr(layer, "is_initialized", True):
        init(k, v)
    layer.keys, layer.values = k, v


def _has_rows(layer) -> bool:
    keys = getattr(layer, "keys", None)
    return keys is not None and keys.dim() == 4


def _zero_padded(t: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """(r, H, s, Dh) -> a copy (rows, H, length, Dh) with zeros in the new cells (layers that are not KVLayers)."""
    out = t.new_zeros((rows, t.shape[1], length, t.shape[3]))
    r, s = min(rows, t.shape[0]), min(length, t.shape[2])
    out[:r, :, :s] = t[:r, :, :s]
    return out


class RequestCache:
    """The per-request bookkeeping of a component that keeps its entries in a :class:`RaggedCache` (``kv``): the
    host's count of each request's cached positions (``held``, what compaction's ``live_max`` is read from, never
    the device), freeing finished requests and each new column's owner. The drafter proposers
    (:class:`~dspark_lightning.infer.propose.proposer.ProposerBase`) and the HF verifier share it; ``device`` is the
    owner's."""

    device: torch.device
    kv: RaggedCache
    held: dict[int, int]  # request id -> cached positions

    def _open_cache(self, layers: list, batching: str) -> None:
        self.kv = RaggedCache(layers, flat=batching == "flat", device=self.device)
        self.held = {}

    def _compact(self) -> None:
        """:meth:`RaggedCache.compact` with ``live_max`` from the host's counts: the longest request (padded), all
        of them (flat)."""
        held = self.held.values()
        self.kv.compact(live_max=sum(held) if self.kv.flat else max(held, default=0))

    def _drop(self, ids: list[int]) -> None:  # finished requests
        if ids:
            self.kv.remove_requests(ids)
            for i in ids:
                self.held.pop(i, None)
            self._compact()

    def _owners(self, grid: Grid, ids: list[int]) -> torch.Tensor:
        """The request id of each cell of ``grid`` (rows, L) over ``ids``, -1 in its padding (``scatter`` drops the
        entries past each request's length)."""
        rid = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        return grid.scatter(rid[:, None].expand(grid.valid.shape), -1)

    def cached_length(self, rid: int) -> int:
        """Live cached positions of request ``rid`` (0 once removed)."""
        return int((self.kv.owner == rid).sum())
