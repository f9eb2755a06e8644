"""``data.regen``: the settings of response regeneration, as a recipe gives them (checked where they are received)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ... import checks
from ...checks import UsageError
from ...devices import DTYPES
from ...registry import Component
from .backend import as_backend


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
    backend: Component = "dspark"  # type: ignore[assignment]  # a name, or {class_path, init_args}
    """a registered backend, or ``{class_path: name, init_args: {...}}`` with its own settings. dspark: our decoding
    Engine with continuous batching over conversations; hf: HF generate in batches; openai: an OpenAI-compatible chat
    server (vLLM, SGLang, llama-server), ``{class_path: openai, init_args: {base_url: ..., model: ...}}``; vllm: vLLM's
    offline engine on the target's directory (the pinned venv of ``dspark-lightning vllm build``)"""
    concurrency: int = 32
    """turns decoding together with the dspark backend, conversations in flight with openai, vLLM's ``max_num_seqs``
    (batch_size is the HF backend's batch)"""
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
        """The one check of the regeneration settings: a recipe's ``data.regen`` and :func:`regenerate`'s arguments
        (it builds one) alike, before any target is loaded."""
        for key in ("batch_size", "max_new_tokens", "concurrency", "temperature", "top_p", "answers_per_prompt"):
            if getattr(self, key) is None:
                raise UsageError(f"data.regen.{key} must be given, got null")
        for key in ("batch_size", "max_new_tokens", "concurrency", "max_turns", "top_k", "answers_per_prompt"):
            checks.at_least(f"data.regen.{key}", getattr(self, key), 1)
        checks.in_range("data.regen.temperature", self.temperature, 0.0)
        checks.in_range("data.regen.top_p", self.top_p, 0.0, 1.0, open_low=True)
        if self.dtype not in (None, "fastest") and str(self.dtype).lower().removeprefix("torch.") not in DTYPES:
            raise UsageError(f"data.regen.dtype must be null, fastest or one of {', '.join(sorted(set(DTYPES)))}; "
                             f"got {checks.short(self.dtype)}")  # fmt: skip
        if self.answers_per_prompt > 1 and not self.temperature:
            raise UsageError("data.regen.answers_per_prompt > 1 needs temperature > 0: greedy answers are all the same")
        self.backend = Component.unwrap(self.backend)
        backend = self.backend_object()  # its settings are checked now, not after the target is loaded
        if self.capture_features and not backend.captures_features:
            raise UsageError(
                f"data.regen.capture_features: backend {backend.name!r} cannot capture features (dspark can)"
            )

    def backend_object(self) -> Any:
        """The :class:`~dspark_lightning.data.regen.backend.RegenBackend` ``backend`` names, with its settings."""
        return as_backend(self.backend)

    def settings(self) -> dict[str, Any]:
        """What :func:`regenerate` takes (``dtype`` chooses the target it is given)."""
        skip = ("dtype", "capture_features", "answers_per_prompt")  # prepare acts on these
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def identity(self) -> dict[str, Any]:
        """What the prepared data depends on: every field (``dtype`` only when set), the backend by its name and the
        backend's own settings but the transient ones (a timeout never changes the data)."""
        out = asdict(self)
        for k, unset in (("dtype", None), ("capture_features", False), ("answers_per_prompt", 1)):
            if out[k] == unset:  # an unset option leaves the fingerprint as it was before the option existed
                del out[k]
        backend = self.backend_object()
        return {**out, "backend": backend.name, **backend.identity()}
