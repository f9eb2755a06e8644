"""Response regeneration through vLLM's offline engine (``data.regen.backend: vllm``).

The target's own directory is loaded by vLLM's ``LLM`` in the pinned vLLM venv (:mod:`dspark_lightning.export.vllm`,
``dspark-lightning vllm build``), in the target copy's precision, and driven with token ids: every prompt is rendered
by the target's own chat format here (:meth:`Target.encode_prompt`), so vLLM answers exactly the tokens our other
backends answer. A batch of conversations goes a turn at a time (vLLM batches the turn itself), each request with its
own seed from (seed, id, turn). At T = 0 in fp32 its answers are our engine's (tests/slow/test_vllm.py checks it); at
T > 0 they follow vLLM's sampler, so they differ from the ``dspark`` backend's draws while sharing their law.
"""

from __future__ import annotations

from typing import Any

from ... import checks
from ...registry import register
from .backend import TurnByTurnBackend, split_output


@register("regen_backend", "vllm")
class VLLMRegenerator(TurnByTurnBackend):
    """One vLLM engine for a whole regeneration (``max_num_seqs`` = ``concurrency``); :meth:`close` ends it."""

    def start(self, target: Any, settings: dict[str, Any], **kw: Any) -> None:
        from ...export.vllm import VLLMWorker
        from ...targets import resolve_target_path

        super().start(target, settings, **kw)
        dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
        positions = checks.positions_of(target) or 2048
        self.worker = VLLMWorker(resolve_target_path(target.name), dtype=dtype, max_model_len=positions,
                                 engine={"max_num_seqs": self.concurrency})  # fmt: skip
        self.stop = sorted(target.stop_token_ids)

    def sample(self, prompts: list[list[int]], seeds: list[int], budgets: list[int]) -> list[tuple[str, int, bool]]:
        cfg = self.settings
        sampling = {
            "temperature": cfg["temperature"],
            "top_p": cfg["top_p"],
            "top_k": cfg["top_k"],
            "stop_token_ids": self.stop,
        }
        params = [{**sampling, "max_tokens": b, "seed": s % 2**31} for s, b in zip(seeds, budgets, strict=True)]
        outs = self.worker.generate(prompts, params)["outputs"]
        return [split_output(self.target, o["ids"]) for o in outs]

    def close(self) -> None:
        self.worker.close()
