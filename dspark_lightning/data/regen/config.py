"""``data.regen``: the settings of response regeneration, as a recipe gives them (checked where they are received)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ... import checks
from ...checks import UsageError
from ...registry import get


@dataclass
class RegenConfig:
    """Response regeneration by the target (sampling settings recommended for the target)."""

    batch_size: int = 8
    max_new_tokens: int = 256
    temperature: float = 0.2
    top_p: float = 0.9
    top_k: int | None = None
    max_turns: int | None = None
    """answer at most this many user turns per conversation (null = all)"""
    backend: str = "dspark"
    """dspark: our decoding Engine with continuous batching over conversations; hf: HF generate in batches; openai:
    an OpenAI-compatible chat server (vLLM, SGLang, llama-server) at ``base_url`` serving ``model``; vllm: vLLM's
    offline engine on the target's directory (the pinned venv of ``dspark-lightning vllm build``)"""
    concurrency: int = 32
    """turns decoding together with the dspark backend, conversations in flight with openai, vLLM's ``max_num_seqs``
    (batch_size is the HF backend's batch)"""
    base_url: str | None = None
    """backend openai: the server's API root, e.g. ``http://127.0.0.1:8000/v1``"""
    model: str | None = None
    """backend openai: the model name the server serves (the target, with its chat template)"""
    timeout_s: float = 300.0
    """backend openai: seconds one request may take"""
    retries: int = 3
    """backend openai: retries of a request that fails to connect, times out or gets a 5xx / 429 answer"""
    dtype: str | None = None
    """precision of the target copy that writes the responses (null = the target's own, ``target.dtype``).
    ``bf16`` about doubles regeneration on a CPU with bf16 units (benchmarks/results/matrix.md, "Regeneration
    throughput"); the
    responses are then the bf16 target's, while features and labels still come from the target itself. ``fastest``:
    bf16 where this machine runs it faster (CUDA; a CPU with bf16 units, measured once), else the target's own
    precision; the data's fingerprint records what it chose."""
    capture_features: bool = False
    """backend dspark, cached features: keep the target features the regeneration computes (prompt prefill, each
    response token) and cache those instead of running the target again over every conversation; rows they do not
    cover (a response the tokeniser re-encodes differently, fixed text) still take the feature pass. The features
    are then those of the regenerating copy (``dtype``): benchmarks/results/data/capture_drift/ measures how far bf16
    ones sit from fp32 serving."""

    answers_per_prompt: int = 1
    """train prompts answered this many times, each from its own sampling stream (the extra answers' ids are
    ``<prompt id>#<j>``); needs ``temperature > 0`` (greedy answers repeat). DeepSpec regenerates at T = 0.7, top-p
    0.8. Held-out prompts are answered once."""

    def __post_init__(self) -> None:
        checks.at_least("data.regen.answers_per_prompt", self.answers_per_prompt, 1)
        if self.answers_per_prompt > 1 and not self.temperature:
            raise UsageError("data.regen.answers_per_prompt > 1 needs temperature > 0: greedy answers are all the same")

        kind = get("regen_backend", self.backend)  # an unknown name lists the registered backends
        if self.capture_features and not kind.captures_features:
            raise UsageError(
                f"data.regen.capture_features: backend {self.backend!r} cannot capture features (dspark can)"
            )
        if kind.needs_server:
            self.server()  # checks base_url and model now, not after the target is loaded
        elif self.base_url is not None or self.model is not None:
            raise UsageError(f"data.regen.base_url / model are read by a server backend (openai), not {self.backend!r}")

    def server(self) -> Any:
        """The :class:`~dspark_lightning.data.regen.regen_server.ServerConfig` of a server backend (else ``None``)."""
        if not get("regen_backend", self.backend).needs_server:
            return None
        from .regen_server import ServerConfig

        return ServerConfig(self.base_url or "", self.model or "", self.timeout_s, self.retries)

    def settings(self) -> dict[str, Any]:
        """What :func:`regenerate` takes (``dtype`` chooses the target it is given; the server fields are one
        ``server``)."""
        skip = ("dtype", "capture_features", "answers_per_prompt", *_SERVER_FIELDS)  # prepare acts on these
        out = {k: v for k, v in asdict(self).items() if k not in skip}
        return {**out, "server": self.server()}

    def identity(self) -> dict[str, Any]:
        """What the prepared data depends on: every field, ``dtype`` only when set and the server's URL and model only
        for a server backend; timeouts and retries never change the data."""
        out = asdict(self)
        for k, unset in (("dtype", None), ("capture_features", False), ("answers_per_prompt", 1)):
            if out[k] == unset:  # an unset option leaves the fingerprint as it was before the option existed
                del out[k]
        for k in _SERVER_FIELDS:
            if not get("regen_backend", self.backend).needs_server or k in ("timeout_s", "retries"):
                del out[k]
        return out


_SERVER_FIELDS = ("base_url", "model", "timeout_s", "retries")
