"""Hugging Face ``generate()`` on the same target, as the reference a user would otherwise pick."""

from __future__ import annotations

import time
from typing import Any

import torch


@torch.no_grad()
def hf_generate(
    target,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    batch_size: int = 1,
    seed: int = 0,
    **generate_kwargs: Any,
) -> dict[str, Any]:
    """Generate with ``target.model.generate`` in static batches (left padding); stops at the target's stop ids.

    Returns ``token_ids`` (per prompt, pads and anything after a stop token removed), ``generated_tokens``
    and ``time_s``. Sampling settings are explicit so the model's generation_config defaults do not leak in.
    """
    model, tok = target.model, target.tokenizer
    stop = target.stop_token_ids
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
    sampling = (
        {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
        if temperature < 1e-5
        else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    )
    torch.manual_seed(seed)
    out: list[list[int]] = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        L = max(len(p) for p in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), L), dtype=torch.long)
        for j, p in enumerate(batch):
            ids[j, L - len(p) :] = torch.tensor(p)
            mask[j, L - len(p) :] = 1
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            eos_token_id=stop,
            pad_token_id=pad,
            **sampling,
            **generate_kwargs,
        )
        for row in gen[:, L:].tolist():
            cut = next((k + 1 for k, t in enumerate(row) if t in stop), len(row))
            out.append(row[:cut])
    elapsed = time.perf_counter() - t0
    return {"token_ids": out, "generated_tokens": sum(len(r) for r in out), "time_s": elapsed}
