"""A lean target forward for decoding: the ``lean`` verifier (Llama / Qwen2 / Qwen3 / Mistral families).

Why it exists: on a CPU the HF forward of a small target is dominated by per-op overhead and by the kernel its
products go through, not by the bytes of weights it must read (``benchmarks/profile_breakdown.py verify``
shows both). This verifier computes the same function with:

- **fused projections**: one [q; k; v] and one [gate; up] product per layer (3 products instead of 7);
- **matrix kernels chosen on the machine** (:mod:`.kernels`): each product goes through the path this CPU runs
  fastest for its shape and row count, measured once and cached;
- **a preallocated KV cache written in place**: one row per request, positions contiguous, rollback
  is moving a length pointer (rejected drafts are always the newest entries);
- **no dense mask** where none is needed (one request: a 1-token query sees the whole row; a block
  uses a tiny (W, S) mask built from two ``arange`` comparisons);
- the tapped layers' raw outputs taken directly from the loop (no hooks).

Outputs equal the HF forward up to floating-point reassociation (tested against :class:`~.hf.HFVerifier`
and, through ``decode()``, greedy equality with HF ``generate()``). Only the padded batching exists:
each request owns one cache row. Unsupported architectures raise :class:`NotImplementedError`, and
``verifier="auto"`` falls back to ``hf`` for them.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ...checks import UnsupportedError, UsageError
from ...registry import register
from ..protocols import SegmentOutput
from . import kernels as kernel_tables
from .kernels import KernelTable, Linear

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def attention(q, K, V, mask, causal: bool, scale: float, gqa: bool, fp32: bool = False) -> torch.Tensor:
    """Scaled dot-product attention. ``fp32`` (regeneration only): on a CPU in bf16/fp16 it runs in fp32 and casts
    back, since PyTorch's CPU flash kernel is much slower in bf16 than in fp32, casts included. Off for decoding,
    whose bf16 output is token for token HF ``generate()``'s (tests/infer/test_devices.py)."""
    if fp32 and q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        dtype, m = q.dtype, mask.float() if mask is not None and mask.is_floating_point() else mask
        q, K, V = q.float(), K.float(), V.float()  # K, V: no copy from the verifier's fp32 cache
        out = F.scaled_dot_product_attention(q, K, V, attn_mask=m, is_causal=causal, scale=scale, enable_gqa=gqa)
        return out.to(dtype)
    return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)


def lean_unsupported(target, batching: str = "padded") -> str | None:
    """Why the lean verifier cannot run this target (None when it can)."""
    cfg = target.model.config
    kind = getattr(cfg, "model_type", "?")
    if batching != "padded":
        return f"batching {batching!r} (the lean verifier has one cache row per request: padded only)"
    if kind not in SUPPORTED:
        return f"architecture {kind!r} (supported: {', '.join(SUPPORTED)})"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", kind == "mistral"):
        return "sliding-window attention"
    if getattr(cfg, "mlp_bias", False) or getattr(cfg, "hidden_act", "silu") != "silu":
        return "an MLP other than a bias-free SwiGLU"
    return None


class _Layer:
    """One decoder layer's weights, rearranged for the fused products."""

    def __init__(self, layer) -> None:
        att, mlp = layer.self_attn, layer.mlp
        cat = torch.cat
        b = [getattr(p, "bias", None) for p in (att.q_proj, att.k_proj, att.v_proj)]
        qkv = cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])  # ((H+2Hkv)Dh, d)
        self.qkv = Linear(qkv, None if b[0] is None else cat(b))
        self.o = Linear(att.o_proj.weight, att.o_proj.bias)
        self.gu = Linear(cat([mlp.gate_proj.weight, mlp.up_proj.weight]), None)  # (2F, d)
        self.down = Linear(mlp.down_proj.weight, None)
        self.ln_in = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        self.ln_post = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        qn, kn = getattr(att, "q_norm", None), getattr(att, "k_norm", None)
        self.q_norm = None if qn is None else (qn.weight, qn.variance_epsilon)
        self.k_norm = None if kn is None else (kn.weight, kn.variance_epsilon)
        self.scaling = att.scaling


def rms_norm(x: torch.Tensor, weight_eps: tuple[torch.Tensor, float]) -> torch.Tensor:
    """HF Llama RMSNorm: normalise in fp32, cast back, scale."""
    w, eps = weight_eps
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half convention), x (R, H, W, Dh), cos/sin (R, 1, W, Dh)."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


@register("verifier", "lean")
class LeanVerifier:
    """Verifies drafts with a lean re-implementation of the target's forward (see the module docstring); a
    :class:`~.protocols.Verifier`.

    Args:
        target: the frozen target (Llama-family HF model).
        batching: must be ``padded``.
        capacity: initial cache length per request (grows by doubling as needed).
        kernels: ``auto`` (this machine's kernel table, measured once per CPU, thread count and dtype and cached;
            :mod:`.kernels`), a :class:`~dspark_lightning.infer.verify.kernels.KernelTable`, or ``linear``
            (``F.linear`` everywhere).
        progress: show the one-time kernel timing.
    """

    def __init__(self, target, batching: str = "padded", capacity: int = 256,
                 kernels: str | KernelTable = "auto", progress: bool = True) -> None:  # fmt: skip
        why = lean_unsupported(target, batching)
        if why is not None:
            raise UnsupportedError(f"the lean verifier cannot run target {target.name!r}: {why}; use verifier='hf'")
        self.target = target
        self.batching = batching
        self._fp32_attention = False  # see attention() and the property; set by infer.generation for regeneration
        self.progress = progress
        p = next(target.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        dec = target.decoder
        table = self._kernel_table(kernels)
        prepared = _PREPARED.setdefault(target, {})
        key = "linear" if table is None else id(table)
        if key not in prepared:  # fused and re-laid-out weights: made once per target and kernel table
            prepared.clear()
            layers = [_Layer(layer) for layer in dec.layers]
            head = Linear(target.lm_head.weight, getattr(target.lm_head, "bias", None))
            if table is not None:
                for m in _products(layers, head):
                    m.use(table)
            prepared[key] = (layers, head)
        self.layers, self.head = prepared[key]
        self.kernels = table
        self.embed = dec.embed_tokens
        self.final = (dec.norm.weight, dec.norm.variance_epsilon)
        self.rotary = dec.rotary_emb
        g = target.geometry
        self.H, self.Hkv, self.Dh = g.num_heads, g.num_kv_heads, g.head_dim
        self.tap: dict[int, list[int]] = {}  # layer id -> its slots in the context (a layer may be tapped twice)
        for i, lid in enumerate(g.layer_ids):
            self.tap.setdefault(lid, []).append(i)
        self.n_taps = len(g.layer_ids)
        self.rows: dict[int, int] = {}  # request id -> cache row
        self.lens = torch.zeros(0, dtype=torch.long, device=self.device)  # committed length per row
        self.lens_h: list[int] = []  # the same on the host: shapes and checks read it, never the device
        self.cap = capacity
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._alloc(0, capacity)

    @property
    def fp32_attention(self) -> bool:
        """Attention in fp32 over a bf16/fp16 target on a CPU (see :func:`attention`); the KV cache is then kept in
        fp32 too, so a step casts only its own new entries, never the whole context."""
        return self._fp32_attention

    @fp32_attention.setter
    def fp32_attention(self, on: bool) -> None:
        self._fp32_attention = bool(on)
        self._alloc(self.k[0].shape[0] if self.k else 0, self.cap)

    def _cache_dtype(self) -> torch.dtype:
        wide = self._fp32_attention and self.device.type == "cpu" and self.dtype in (torch.bfloat16, torch.float16)
        return torch.float32 if wide else self.dtype

    def linears(self) -> list[Linear]:
        return _products(self.layers, self.head)

    def _kernel_table(self, kernels: str | KernelTable) -> KernelTable | None:
        if isinstance(kernels, KernelTable):
            return kernels
        if kernels == "linear":
            return None
        if kernels != "auto":
            raise UsageError(f"kernels must be 'auto', 'linear' or a KernelTable, got {kernels!r}")
        return kernel_tables.for_weights(_shape_keys(self.target), lambda: _weights_by_shape(self.target),
                                         self.device, self.dtype, progress=self.progress)  # fmt: skip

    # --- cache -----------------------------------------------------------------------------
    def _alloc(self, rows: int, cap: int) -> None:
        shape, dtype = (rows, self.Hkv, cap, self.Dh), self._cache_dtype()
        old_k, old_v = self.k, self.v
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in self.layers]
        for new, old in zip(self.k + self.v, old_k + old_v, strict=False):
            r, s = min(rows, old.shape[0]), min(cap, old.shape[2])
            new[:r, :, :s] = old[:r, :, :s]
        self.cap = cap

    def _ensure(self, rows: int, length: int) -> None:
        """Room for ``rows`` requests of ``length`` positions (both grow by doubling)."""
        have_rows = self.k[0].shape[0]
        if rows <= have_rows and length <= self.cap:
            return
        cap = self.cap
        while cap < length:
            cap *= 2
        new_rows = have_rows if rows <= have_rows else max(rows, 2 * have_rows, 4)
        self._alloc(new_rows, cap)

    def remove(self, ids: list[int]) -> None:
        """Free the rows of finished requests; the last rows move into the holes (rows stay 0..n-1)."""
        for rid in ids:
            if rid not in self.rows:
                continue
            row, last = self.rows.pop(rid), len(self.rows)
            if row != last:
                mover = next(r for r, i in self.rows.items() if i == last)
                for t in self.k + self.v:
                    t[row] = t[last]
                self.lens[row] = self.lens[last]
                self.lens_h[row] = self.lens_h[last]
                self.rows[mover] = row
        self.lens = self.lens[: len(self.rows)].clone()
        del self.lens_h[len(self.rows) :]

    def cached_length(self, rid: int) -> int:
        """Live cached positions of request ``rid`` (0 once removed)."""
        return self.lens_h[self.rows[rid]] if rid in self.rows else 0

    def commit(self, ids, keep_pos: torch.Tensor) -> None:
        """Keep positions <= keep_pos[i] of request ids[i] (the rejected drafts are the newest entries); ``ids``
        and ``keep_pos`` are host data (a list / CPU tensor)."""
        rows_h = [self.rows[int(r)] for r in _host(ids)]
        for row, k in zip(rows_h, _host(keep_pos), strict=True):
            self.lens_h[row] = min(self.lens_h[row], int(k) + 1)
        rows = torch.as_tensor(rows_h, dtype=torch.long).to(self.device, non_blocking=True)
        self.lens[rows] = torch.as_tensor([self.lens_h[r] for r in rows_h], dtype=torch.long).to(self.device)

    # --- forward ---------------------------------------------------------------------------
    def _order(self, ids: list[int]) -> tuple[list[int] | None, int]:
        """Cache rows of ``ids``: they must be a permutation of a contiguous row range [r0, r0 + R)."""
        rows = [self.rows[r] for r in ids]
        r0 = min(rows)
        if sorted(rows) != list(range(r0, r0 + len(rows))):
            raise RuntimeError("the lean verifier forwards every live request at once (or a freshly added group)")
        if rows == list(range(r0, r0 + len(rows))):
            return None, r0
        inv = [0] * len(rows)
        for i, row in enumerate(rows):
            inv[row - r0] = i
        return inv, r0  # inv[row - r0] = index in ``ids``

    @torch.no_grad()
    def forward(
        self,
        ids: list[int],
        tokens: torch.Tensor,  # (R, W) tokens of each request, valid up to lengths[r]
        lengths,  # (R,) host data (list or CPU tensor)
        start,  # (R,) host data: position of each request's first token (== its committed length)
    ) -> SegmentOutput:
        inv, r0 = self._order(ids)
        lengths, start = _host(lengths), _host(start)
        if inv is not None:  # into row order
            idx = torch.as_tensor(inv, dtype=torch.long).to(self.device, non_blocking=True)
            tokens, lengths, start = tokens[idx], [lengths[i] for i in inv], [start[i] for i in inv]
        hidden, context = self._run(r0, tokens, lengths, start)
        if inv is not None:  # back to the caller's order
            back = torch.empty_like(idx)
            back[idx] = torch.arange(len(inv), device=self.device)
            hidden, context = hidden[back], context[back]
        return SegmentOutput(hidden=hidden, context=context)

    def _run(self, r0: int, tokens, lengths, start) -> tuple[torch.Tensor, torch.Tensor]:
        R, W = tokens.shape
        rows = slice(r0, r0 + R)
        base_h = self.lens_h[rows]
        if base_h != [int(s) for s in _host(start)]:
            raise RuntimeError("verification must start at each request's committed length")
        end = max(base_h) + W
        self._ensure(self.k[0].shape[0], end)
        dev = self.device
        base = self.lens[rows]
        j = torch.arange(W, device=dev)
        pos = base[:, None] + j  # (R, W)
        single = len(set(base_h)) == 1
        c0 = base_h[0] if single else 0  # from the host mirror: no device read per layer or per forward
        mask = None
        causal = single and c0 == 0 and W > 1  # a prefill from position 0: the fused causal kernel, no (W, W) mask
        if not (single and W == 1) and not causal:  # key c visible to query i of row r iff c <= base_r + i
            mask = torch.arange(end, device=dev)[None, None, :] <= pos[:, :, None]  # (R, W, end)
            mask = mask[:, None]
        x = self.embed(tokens)  # (R, W, d)
        cos, sin = self.rotary(x, pos)
        cos, sin = cos[:, None], sin[:, None]  # (R, 1, W, Dh)
        H, Hkv, Dh = self.H, self.Hkv, self.Dh
        write_rows = torch.arange(r0, r0 + R, device=dev)[:, None, None]
        heads = torch.arange(Hkv, device=dev)[None, :, None]
        cols = pos[:, None, :]  # (R, 1, W)
        taps = [None] * self.n_taps
        for li, L in enumerate(self.layers):
            h = rms_norm(x, L.ln_in)
            qkv = L.qkv(h)
            q, k, v = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
            q = q.view(R, W, H, Dh).transpose(1, 2)  # (R, H, W, Dh)
            k = k.view(R, W, Hkv, Dh).transpose(1, 2)
            v = v.view(R, W, Hkv, Dh).transpose(1, 2)
            if L.q_norm is not None:
                q, k = rms_norm(q, L.q_norm), rms_norm(k, L.k_norm)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k, v = k.to(self.k[li].dtype), v.to(self.k[li].dtype)  # an fp32 cache under fp32 attention
            if single:  # every row writes the same columns: a plain slice
                self.k[li][rows, :, c0 : c0 + W] = k
                self.v[li][rows, :, c0 : c0 + W] = v
            else:
                self.k[li][write_rows, heads, cols] = k
                self.v[li][write_rows, heads, cols] = v
            K, V = self.k[li][rows, :, :end], self.v[li][rows, :, :end]
            a = attention(q, K, V, mask, causal, L.scaling, H != Hkv, self.fp32_attention)
            x = x + L.o(a.transpose(1, 2).reshape(R, W, H * Dh))
            g, u = L.gu(rms_norm(x, L.ln_post)).chunk(2, dim=-1)
            x = x + L.down(F.silu(g) * u)
            for slot in self.tap.get(li, ()):
                taps[slot] = x
        self.lens_h[rows] = [b + int(n) for b, n in zip(base_h, _host(lengths), strict=True)]
        self.lens[rows] = torch.as_tensor(self.lens_h[rows], dtype=torch.long).to(dev, non_blocking=True)
        return rms_norm(x, self.final), torch.cat(taps, dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target logits (..., V): the LM head, then the model's own post-processing (scales, soft
        caps), exactly as :meth:`Target.logits <dspark_lightning.targets.Target.logits>`."""
        return self.target.finish_logits(self.head(hidden))

    @torch.no_grad()
    def prefill(self, ids: list[int], prompts: list[list[int]]) -> SegmentOutput:
        """Give each new request a cache row and run its prompt (grouped by length, no padding compute)."""
        R, P_max = len(prompts), max(len(p) for p in prompts)
        first = len(self.rows)
        self._ensure(first + R, P_max)
        for i, rid in enumerate(ids):
            self.rows[rid] = first + i
        self.lens = torch.cat([self.lens, self.lens.new_zeros(R)])
        self.lens_h += [0] * R
        hidden = context = None
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(len(p), []).append(i)
        for P, idx in groups.items():
            # a group's rows must be contiguous: run it row by row unless it is the whole contiguous range
            for chunk in _contiguous(idx):
                x = torch.as_tensor([prompts[i] for i in chunk], dtype=torch.long, device=self.device)
                zero = torch.zeros(len(chunk), dtype=torch.long)  # host: lengths and starts are shapes
                h, c = self._run(first + chunk[0], x, torch.full_like(zero, P), zero)
                if hidden is None:
                    hidden = h.new_zeros((R, P_max, h.shape[-1]))
                    context = c.new_zeros((R, P_max, c.shape[-1]))
                hidden[chunk[0] : chunk[-1] + 1, :P] = h
                context[chunk[0] : chunk[-1] + 1, :P] = c
        return SegmentOutput(hidden=hidden, context=context)


_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {kernel table id: (layers, head)}


def _products(layers: list[_Layer], head: Linear) -> list[Linear]:
    """Every product of a forward, in order: per layer [q; k; v], o, [gate; up], down; then the LM head."""
    return [m for L in layers for m in (L.qkv, L.o, L.gu, L.down)] + [head]


def _weights_by_shape(target) -> dict[str, list[tuple[torch.Tensor, None]]]:
    """The lean forward's weights grouped by shape, fused as it runs them (biases are left out of the timing)."""
    head = Linear(target.lm_head.weight, None)
    by_shape: dict[str, list] = {}
    for m in _products([_Layer(layer) for layer in target.decoder.layers], head):
        by_shape.setdefault(kernel_tables.shape_key(m.weight), []).append((m.weight.detach(), None))
    return by_shape


def _shape_keys(target) -> set[str]:
    g, d = target.geometry, target.geometry.hidden_size
    q, kv, f = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim, g.intermediate_size
    return {f"{q + 2 * kv}x{d}", f"{d}x{q}", f"{2 * f}x{d}", f"{d}x{f}", kernel_tables.shape_key(target.lm_head.weight)}


def _contiguous(idx: list[int]) -> list[list[int]]:
    """Split sorted indices into runs of consecutive values."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _host(x) -> list:
    """Host data as a list: a list as is, a tensor through ``tolist`` (free for a CPU tensor)."""
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)
