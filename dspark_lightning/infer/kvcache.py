"""A batched KV cache whose entries each belong to one request at one position (or are free).

Speculative decoding appends blocks of different useful lengths per request and rolls each
request back to its own accepted length. Instead of moving tensors every round, every cache
column carries ``owner`` (request id, -1 = free) and ``pos`` (the token position), and attention
masks are derived from them: a query of request r at position P sees the live keys of r at
positions <= P. Rolling back is marking entries free; :meth:`RaggedCache.compact` squeezes the
free entries out once they make up most of the cache.

Two layouts (``flat=False|True``):
- padded: one row per request; a forward over R requests is an (R, max length) grid with padding;
- flat: one row for all requests; a forward is one strip of sum(lengths) tokens, with a
  block-diagonal mask (no padding compute, a longer key axis).

The layer tensors live in objects with ``keys``/``values`` (rows, H, S, Dh) attributes: HF's
``DynamicLayer`` for the target (the model appends to them itself) or :class:`KVLayer` for the
drafter context cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class KVLayer:
    """Keys/values of one attention layer, (rows, H, S, Dh); the fields HF's DynamicLayer has."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def is_initialized(self) -> bool:
        return self.keys is not None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat([self.keys, k], dim=2)
            self.values = torch.cat([self.values, v], dim=2)


@dataclass
class Grid:
    """Where each request's new tokens go in the (rows, L) input of one forward."""

    rows: torch.Tensor  # (R, W) row of request r's j-th token
    cols: torch.Tensor  # (R, W) column of request r's j-th token
    valid: torch.Tensor  # (R, W) bool, j < lengths[r]
    shape: tuple[int, int]  # (rows, L) of the forward input

    def scatter(self, values: torch.Tensor, fill: float | int) -> torch.Tensor:
        """(R, W, ...) per-request values -> (rows, L, ...) forward layout (``fill`` elsewhere).

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
        self.owner = torch.full((rows, 0), -1, dtype=torch.long, device=self.device)  # (rows, S)
        self.pos = torch.zeros((rows, 0), dtype=torch.long, device=self.device)  # (rows, S)
        self.slots: list[int] = []  # padded layout: request id of each row

    # --- bookkeeping -----------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return self.owner.shape[0]

    @property
    def length(self) -> int:
        return self.owner.shape[1]

    def live(self) -> torch.Tensor:
        return self.owner >= 0

    def _map_layers(self, fn) -> None:
        for layer in self.layers:
            if _has_rows(layer):
                layer.keys, layer.values = fn(layer.keys), fn(layer.values)

    def add_requests(self, ids: list[int]) -> None:
        if self.flat:
            return
        n = len(ids)
        self.slots.extend(ids)
        self.owner = torch.cat([self.owner, self.owner.new_full((n, self.length), -1)])
        self.pos = torch.cat([self.pos, self.pos.new_zeros((n, self.length))])
        self._map_layers(lambda t: torch.cat([t, t.new_zeros((n, *t.shape[1:]))]))

    def insert(self, rids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], pos: torch.Tensor) -> None:
        """Add G new requests' prefilled K/V (per layer (G, H, P, Dh), equal lengths) at positions ``pos`` (P,)."""
        G, P = len(rids), pos.numel()
        rid = torch.as_tensor(rids, dtype=torch.long, device=self.device)
        if self.flat:
            for layer, (k, v) in zip(self.layers, kv, strict=True):
                k, v = (t.transpose(0, 1).reshape(1, t.shape[1], G * P, t.shape[3]) for t in (k, v))
                if _has_rows(layer):
                    layer.keys, layer.values = torch.cat([layer.keys, k], 2), torch.cat([layer.values, v], 2)
                else:
                    _set(layer, k, v)
            self.append(rid.repeat_interleave(P)[None], pos.to(self.pos).repeat(G)[None])
            return
        self.add_requests(rids)
        rows = slice(self.rows - G, self.rows)
        if P > self.length:  # widen every row with free columns
            n = P - self.length
            self.append(self.owner.new_full((self.rows, n), -1), self.pos.new_zeros((self.rows, n)))
            self._map_layers(lambda t: torch.cat([t, t.new_zeros((t.shape[0], t.shape[1], n, t.shape[3]))], 2))
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
        self.owner = self.owner.masked_fill(gone, -1)
        if self.flat:
            return
        gone_ids = set(ids)
        keep = [i for i, rid in enumerate(self.slots) if rid not in gone_ids]
        self.slots = [self.slots[i] for i in keep]
        idx = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        self.owner, self.pos = self.owner[idx], self.pos[idx]
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
        missing = [rid for rid in ids if rid not in row_of]
        if missing:
            raise KeyError(f"requests {missing} were not added to the cache")
        rows = torch.as_tensor([row_of[rid] for rid in ids], dtype=torch.long, device=self.device)
        return Grid(rows[:, None].expand(R, W), j[None, :].expand(R, W), valid, (self.rows, W))

    def append(self, owner: torch.Tensor, pos: torch.Tensor) -> None:
        """Record L new columns (rows, L); the layer tensors grow by the same L (by the model or by the caller)."""
        self.owner = torch.cat([self.owner, owner], dim=1)
        self.pos = torch.cat([self.pos, pos], dim=1)

    def release_after(self, ids: list[int], keep_pos: torch.Tensor) -> None:
        """Free every entry of request ids[i] (host list) at a position > keep_pos[i] (rejected drafts)."""
        if not ids:
            return
        top = max(ids)
        limit = torch.full((top + 1,), torch.iinfo(torch.long).max, dtype=torch.long, device=self.device)
        limit[torch.as_tensor(ids, dtype=torch.long).to(self.device, non_blocking=True)] = keep_pos
        live = (self.owner >= 0) & (self.owner <= top)
        lim = limit[self.owner.clamp(min=0, max=limit.numel() - 1)]
        self.owner = self.owner.masked_fill(live & (self.pos > lim), -1)

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
        self.owner = torch.gather(self.owner, 1, order).masked_fill(~new_live, -1)
        self.pos = torch.gather(self.pos, 1, order)

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
    init = getattr(layer, "lazy_initialization", None)
    if init is not None and not getattr(layer, "is_initialized", True):
        init(k, v)
    layer.keys, layer.values = k, v


def _has_rows(layer) -> bool:
    keys = getattr(layer, "keys", None)
    return keys is not None and keys.dim() == 4
