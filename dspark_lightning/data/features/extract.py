"""Target features for drafter training: tokenisation, the online path and batched extraction (docs/algorithm.md §4).

Two sources give identical batches: **online** (:func:`features_for_batch` runs the frozen target inside a training
step) and a **cache** (:func:`extract_features` feeds :func:`dspark_lightning.data.features.cache.write_cache`). Both
round the target outputs to the same ``feature_dtype`` through the same function, so a cached sample equals the online
features of the same batch bit for bit (and differs from any other batching only by fp32 noise before rounding).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ...checks import UsageError

log = logging.getLogger(__name__)

FEATURE_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


def resolve_feature_dtype(feature_dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; anything outside :data:`FEATURE_DTYPES` fails."""
    if isinstance(feature_dtype, torch.dtype):
        if feature_dtype not in FEATURE_DTYPES.values():
            raise UsageError(f"unsupported feature dtype {feature_dtype}; use one of {sorted(FEATURE_DTYPES)}")
        return feature_dtype
    if feature_dtype not in FEATURE_DTYPES:
        raise UsageError(f"unsupported feature dtype {feature_dtype!r}; use one of {sorted(FEATURE_DTYPES)}")
    return FEATURE_DTYPES[feature_dtype]


def feature_dtype_name(feature_dtype: str | torch.dtype) -> str:
    dt = resolve_feature_dtype(feature_dtype)
    return next(k for k, v in FEATURE_DTYPES.items() if v == dt)


def tokenize_conversations(
    target: Any, conversations: list[dict], max_length: int, min_supervised: int = 14, allow_empty: bool = False
) -> list[dict]:
    """Render rows ``{"id", "domain", "turns"}`` with the target's chat format (docs/algorithm.md §4).

    Truncates to ``max_length`` tokens and drops rows with fewer than ``min_supervised`` loss-mask tokens after
    truncation. Fails on empty input, duplicate ids (rows are keyed by id, pitfall 19) and when every row is dropped,
    unless ``allow_empty`` (one rank's slice of a split may legitimately be empty).
    Returns ``{"id", "domain", "input_ids": list[int], "loss_mask": list[int]}`` in input order.
    """
    if not conversations and not allow_empty:
        raise UsageError("tokenize_conversations got no conversations")
    if max_length < 2:
        raise UsageError(f"max_length must be >= 2, got {max_length}")
    out, seen, dropped = [], set(), 0
    for row in conversations:
        sid = str(row["id"])
        if sid in seen:
            raise UsageError(f"duplicate conversation id {sid!r}; rows must be keyed by a unique id")
        seen.add(sid)
        ids, mask = target.encode_conversation(row["turns"])
        ids, mask = ids[:max_length], mask[:max_length]
        if sum(mask) < min_supervised:
            dropped += 1
            continue
        out.append({"id": sid, "domain": str(row.get("domain", "")), "input_ids": list(ids), "loss_mask": list(mask)})
    if dropped:
        log.info(
            "dropped %d of %d conversations with < %d supervised tokens", dropped, len(conversations), min_supervised
        )
    if not out and not allow_empty:
        raise UsageError(
            f"all {len(conversations)} conversations have fewer than {min_supervised} supervised tokens "
            f"after truncation to {max_length}"
        )
    return out


def _target_device(target: Any) -> torch.device:
    p = next(iter(target.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def features_for_batch(
    target: Any,
    input_ids: torch.Tensor,  # (B, S)
    attention_mask: torch.Tensor | None,  # (B, S) 1 = real token, right padding
    feature_dtype: str | torch.dtype = "bfloat16",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online feature path: one frozen-target forward, rounded to ``feature_dtype`` and returned as float32.

    Returns ``(context (B, S, n*d), hidden (B, S, d))`` on the target's device. Padded positions hold garbage and
    must be masked by the caller. An all-ones mask is treated as no mask so that both spellings run the same kernels.
    The target runs in its own dtype (fp32 unless loaded otherwise) and outputs are upcast to fp32 before rounding.
    """
    dt = resolve_feature_dtype(feature_dtype)
    dev = _target_device(target)
    input_ids = input_ids.to(dev)
    if attention_mask is not None:
        attention_mask = attention_mask.to(dev)
        if bool(attention_mask.all()):
            attention_mask = None
    out = target(input_ids, attention_mask=attention_mask)
    context = out.context.float().to(dt).float()  # (B, S, n*d)
    hidden = out.hidden.float().to(dt).float()  # (B, S, d)
    return context, hidden


@torch.no_grad()
def target_law_summary(target: Any, hidden: torch.Tensor, chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position, the full-vocabulary log-sum-exp (fp32) and argmax (int32) of the target logits computed from
    ``hidden`` (..., d) exactly as a training step computes them (``target.logits`` in the LM head's dtype).

    Cached next to the features, they let the loss work in the draft-vocabulary space: the step projects only the
    N draft rows of the LM head and still counts the target mass outside them as rejected (``losses.py``)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    dt = target.lm_head.weight.dtype
    dev = target.lm_head.weight.device
    lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    top = torch.empty(flat.shape[0], dtype=torch.int32, device=flat.device)
    for i in range(0, flat.shape[0], chunk):
        z = target.logits(flat[i : i + chunk].to(dev, dt)).float()
        lse[i : i + chunk] = torch.logsumexp(z, -1).to(flat.device)
        top[i : i + chunk] = z.argmax(-1).to(flat.device, torch.int32)
    return lse.view(hidden.shape[:-1]), top.view(hidden.shape[:-1])


@dataclass
class ExtractionStats:
    """Counters of one extraction run; ``seconds`` is target compute time (excludes the consumer's time)."""

    samples: int = 0
    tokens: int = 0
    padded_tokens: int = 0  # tokens actually run, padding included
    batches: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def length_sorted_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Index batches, longest first, each with ``len(batch) * max_len <= batch_tokens`` (a lone longer sample is
    its own batch). Ties keep input order, so the batching is deterministic."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        # sorted descending: the first index of a batch has its max length
        if cur and (len(cur) + 1) * lengths[cur[0]] > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


class FeatureStream(Iterator[dict]):
    """Iterator over extracted samples (see :func:`extract_features`) with live :attr:`stats`."""

    def __init__(self, target: Any, tokenized: list[dict], feature_dtype: str, batch_tokens: int, progress: bool):
        if not tokenized:
            raise UsageError("extract_features got no samples")
        if any(len(r["input_ids"]) == 0 for r in tokenized):
            raise UsageError("extract_features got an empty sample")
        self.target = target
        self.tokenized = tokenized
        self.feature_dtype = resolve_feature_dtype(feature_dtype)
        self.batch_tokens = batch_tokens
        self.progress = progress
        self.stats = ExtractionStats()
        self._gen = self._run()

    def __next__(self) -> dict:
        return next(self._gen)

    def _run(self) -> Iterator[dict]:
        from tqdm.auto import tqdm

        lengths = [len(r["input_ids"]) for r in self.tokenized]
        pad_id = getattr(self.target.tokenizer, "pad_token_id", None) or 0
        bar = tqdm(total=sum(lengths), unit="tok", unit_scale=True, desc="target features", disable=not self.progress)
        try:
            for idx in length_sorted_batches(lengths, self.batch_tokens):
                rows = [self.tokenized[i] for i in idx]
                S = max(lengths[i] for i in idx)
                ids = torch.full((len(rows), S), pad_id, dtype=torch.long)  # (B, S) right padded
                attn = torch.zeros((len(rows), S), dtype=torch.long)  # (B, S)
                for b, r in enumerate(rows):
                    ids[b, : len(r["input_ids"])] = torch.tensor(r["input_ids"], dtype=torch.long)
                    attn[b, : len(r["input_ids"])] = 1
                t0 = time.perf_counter()
                context, hidden = features_for_batch(self.target, ids, attn, self.feature_dtype)
                context = context.to(self.feature_dtype).cpu()  # exact: values are already rounded
                hidden = hidden.to(self.feature_dtype).cpu()
                lse, top = target_law_summary(self.target, hidden.float())  # what the step computes from the cache
                self.stats.seconds += time.perf_counter() - t0
                n_tok = int(attn.sum())
                self.stats.batches += 1
                self.stats.tokens += n_tok
                self.stats.padded_tokens += ids.numel()
                bar.update(n_tok)
                for b, r in enumerate(rows):
                    L = len(r["input_ids"])
                    self.stats.samples += 1
                    yield {
                        "id": r["id"],
                        "domain": r.get("domain", ""),
                        "input_ids": torch.tensor(r["input_ids"], dtype=torch.int32),  # (S,)
                        "loss_mask": torch.tensor(r["loss_mask"], dtype=torch.uint8),  # (S,)
                        "context": context[b, :L].clone(),  # (S, n*d)
                        "hidden": hidden[b, :L].clone(),  # (S, d)
                        "target_lse": lse[b, :L].clone(),  # (S,) fp32
                        "target_top": top[b, :L].clone(),  # (S,) int32
                    }
        finally:
            bar.close()


def extract_features(
    target: Any,
    tokenized: list[dict],
    *,
    feature_dtype: str = "bfloat16",
    batch_tokens: int = 4096,
    progress: bool = True,
) -> FeatureStream:
    """Run the frozen target over ``tokenized`` rows and yield one feature sample per row.

    Rows are batched longest first (right padding + attention mask, at most ``batch_tokens`` padded tokens per batch)
    and yielded in that batch order, each carrying its own ``id``: ``{"id", "domain", "input_ids" int32 (S,),
    "loss_mask" uint8 (S,), "context" (S, n*d), "hidden" (S, d), "target_lse" fp32 (S,), "target_top" int32 (S,)}``
    with features in ``feature_dtype`` on the CPU (the last two: :func:`target_law_summary` of the rounded hidden).
    The returned iterator's ``.stats`` (:class:`ExtractionStats`) holds tokens and compute seconds.
    """
    return FeatureStream(target, tokenized, feature_dtype, batch_tokens, progress)


UNSUMMARISED = -1  # target_top of a captured sample's unsupervised positions (its law is not computed there)


def captured_sample(row: dict, captured: dict, max_length: int, min_supervised: int = 1) -> dict | None:
    """A feature sample of tokenised ``row`` from the features its regeneration computed, or ``None`` when they do
    not belong to it (the row then takes the feature pass).

    ``captured`` (``data.regen.regenerate``'s capture): ``tokens``, the rendered prompt (``prompt_len`` tokens) and the
    response tokens as the target sampled them, and ``context`` / ``hidden`` of positions ``0..n-1`` (``n =
    len(tokens) - 1``: the final sampled token was never run). The sample is those tokens, cut to ``max_length``: the
    response as the target emits it when serving, not its text re-encoded (which may split differently). It belongs
    to ``row`` when the row renders the same prompt; the loss mask is the row's over the prompt and 1 over the
    response. Position ``n``, when kept, is the final token (an end-of-turn), whose features are zeros: training never
    reads them (the last position is neither an anchor nor the target law of a label). Template glue after the
    end-of-turn token is not part of the sample."""
    tokens, P = captured["tokens"], captured["prompt_len"]
    n = captured["context"].shape[0]
    ids = row["input_ids"]
    shared = min(P, len(ids))
    if list(ids[:shared]) != list(tokens[:shared]):
        return None
    S = min(len(tokens), max_length)
    mask = [*row["loss_mask"][: min(P, S)], *[1] * (S - min(P, S))]
    if sum(mask) < min_supervised:
        return None
    context, hidden = captured["context"][:S], captured["hidden"][:S]
    if S == n + 1:
        context = torch.cat([context, context.new_zeros((1, context.shape[1]))])
        hidden = torch.cat([hidden, hidden.new_zeros((1, hidden.shape[1]))])
    return {
        "id": row["id"],
        "domain": row.get("domain", ""),
        "input_ids": torch.tensor(tokens[:S], dtype=torch.int32),
        "loss_mask": torch.tensor(mask, dtype=torch.uint8),
        "context": context,
        "hidden": hidden,
    }


class CapturedFeatureStream(Iterator[dict]):
    """Feature samples from regeneration's captures where they cover a row (:func:`captured_sample`), then the
    feature pass (:class:`FeatureStream`) over the rest. ``parts`` yields ``{id: captured}`` batches; features are
    rounded to ``feature_dtype`` and get the target-law summary like the pass's.

    The target-law summary of a captured sample is computed where its loss mask is 1, the only positions a loss
    term reads it at (elsewhere: log-sum-exp 0, argmax :data:`UNSUMMARISED`); most of a conversation is its prompt.

    ``stats`` counts the feature pass (its tokens and compute seconds: what the roofline compares);
    ``captured_samples`` / ``captured_tokens`` / ``summary_s`` the rest."""

    def __init__(self, target: Any, tokenized: list[dict], parts: Iterator[dict], feature_dtype: str, max_length: int,
                 batch_tokens: int = 4096, progress: bool = True, min_supervised: int = 1) -> None:  # fmt: skip
        self.target, self.tokenized, self.parts, self.max_length = target, tokenized, parts, max_length
        self.feature_dtype = resolve_feature_dtype(feature_dtype)
        self.batch_tokens, self.progress, self.min_supervised = batch_tokens, progress, min_supervised
        self.stats = ExtractionStats()
        self.captured_samples = self.captured_tokens = 0
        self.summary_s = 0.0
        self.fallback: list[dict] = []
        self._gen = self._run()

    def __next__(self) -> dict:
        return next(self._gen)

    def _run(self) -> Iterator[dict]:
        by_id = {r["id"]: r for r in self.tokenized}
        done: set[str] = set()
        for part in self.parts:
            samples = []
            for sid, cap in part.items():
                if sid in by_id and sid not in done:
                    s = captured_sample(by_id[sid], cap, self.max_length, self.min_supervised)
                    if s is not None:
                        samples.append(s)
                        done.add(sid)
            yield from self._finish(samples)
        self.fallback = [r for r in self.tokenized if r["id"] not in done]
        if self.fallback:
            stream = FeatureStream(self.target, self.fallback, self.feature_dtype, self.batch_tokens, self.progress)
            yield from stream
            self.stats = stream.stats

    def _finish(self, samples: list[dict]) -> Iterator[dict]:
        if not samples:
            return
        t0 = time.perf_counter()
        dt = self.feature_dtype
        for s in samples:
            s["context"], s["hidden"] = s["context"].float().to(dt), s["hidden"].float().to(dt)
        # the law of supervised positions only: a loss term at position t reads it only where loss_mask[t] = 1
        sel = [s["loss_mask"].bool() for s in samples]
        rows = torch.cat([s["hidden"][m] for s, m in zip(samples, sel, strict=True)])
        lse, top = target_law_summary(self.target, rows.float())
        self.summary_s += time.perf_counter() - t0
        at = 0
        for s, m in zip(samples, sel, strict=True):
            S, k = s["hidden"].shape[0], int(m.sum())
            s["target_lse"] = torch.zeros(S, dtype=torch.float32).masked_scatter_(m, lse[at : at + k])
            s["target_top"] = torch.full((S,), UNSUMMARISED, dtype=torch.int32).masked_scatter_(m, top[at : at + k])
            at += k
            self.captured_samples += 1
            self.captured_tokens += S
            yield s
