"""Regeneration by HF ``generate`` (``data.regen.backend: hf``): left-padded batches of ``batch_size``
conversations, a turn at a time, with temperature, top-k and top-p filtering and then a per-row Gumbel-max draw
from each (conversation, turn)'s own seed."""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register
from .backend import TurnByTurnBackend, split_output


class _PerRowSampler:
    """A logits processor: filter like HF's warpers, then add per-row Gumbel noise (argmax = a sample)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, top_k: int | None) -> None:
        self.seeds, self.temperature, self.top_p, self.top_k = seeds, temperature, top_p, top_k
        self.gens: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float() / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
            probs = sorted_scores.softmax(dim=-1)
            drop_sorted = probs.cumsum(dim=-1) - probs >= self.top_p  # the top token is always kept
            scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
        if self.gens is None:
            self.gens = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        exp = torch.stack(
            [torch.empty(scores.shape[-1], device=scores.device).exponential_(generator=g) for g in self.gens]
        )
        return scores - exp.log()  # argmax(logits + Gumbel) ~ softmax(logits)


def _sample(
    target: Any, prompts: list[list[int]], seeds: list[int], cfg: dict[str, Any], budgets: list[int] | None = None
) -> list[tuple[str, int, bool]]:
    """Left-padded batched ``generate``; returns (response text, generated tokens, stopped) per prompt. ``budgets``:
    new tokens each row may keep (what fits the target's positions); the batch runs to the largest and each row is
    cut at its own (a row's earlier tokens never depend on later positions)."""
    budgets = budgets or [cfg["max_new_tokens"]] * len(prompts)
    from transformers import GenerationConfig, LogitsProcessorList

    tok, stop = target.tokenizer, set(target.stop_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_id
    device = next(target.model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    # Greedy over our perturbed scores; neutralise processors a checkpoint's generation_config.json could add.
    gc = GenerationConfig(
        max_new_tokens=max(budgets),
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=sorted(stop),
        pad_token_id=pad,
    )
    procs = LogitsProcessorList()
    if cfg["temperature"] > 0:
        procs.append(_PerRowSampler(seeds, cfg["temperature"], cfg["top_p"], cfg["top_k"]))
    out = target.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, logits_processor=procs)
    return [split_output(target, row[:n]) for row, n in zip(out[:, width:].tolist(), budgets, strict=True)]


@register("regen_backend", "hf")
class HFRegenerator(TurnByTurnBackend):
    """HF ``generate`` on the target's own model, ``batch_size`` conversations a turn at a time."""

    concurrent = False

    def sample(self, prompts: list[list[int]], seeds: list[int], budgets: list[int]) -> list[tuple[str, int, bool]]:
        return _sample(self.target, prompts, seeds, self.settings, budgets)
