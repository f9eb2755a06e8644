"""Export after fit: the trained drafter written as a drafter directory, optionally STS-calibrated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from ... import checks
from ...checkpoint import save_drafter
from ...export.plan import check_servable, export_for_servers, plan_args, serving_layout
from .fit_stats import validate_if_stale

CALIBRATE_KEYS = {"temperatures", "prompts_per_domain", "max_new_tokens", "domains"}


def full_drafter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The drafter's full (unsharded) weights on the CPU from a DSparkModule, bare or wrapped (FSDP, DDP).

    In a process group it is a collective (torch.distributed.checkpoint ``get_model_state_dict`` with
    ``full_state_dict`` and ``cpu_offload``): FSDP shards are all-gathered, rank 0 receives the tensors and the
    other ranks ``{}``, so no rank holds more than one full copy, and that copy in CPU memory."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        full = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {k.removeprefix("drafter."): v for k, v in full.items() if k.startswith("drafter.")}


class DrafterExport(L.Callback):
    """At the end of ``fit``, write the drafter (config.json + model.safetensors) to ``export_dir`` (default
    ``<log_dir>/drafter``), after a final validation if training went on after the last one, and print the held-out
    τ̂ it reached; then fit STS temperatures for each of ``calibrate``'s sampling temperatures (``dspark-lightning
    calibrate``), so the hardware-aware scheduler reads calibrated confidences.

    A non-empty ``export_dir`` is refused when ``fit`` starts (:meth:`check`), before any training. ``tau_start``:
    the τ̂ of a validation before training, printed with the final one (the CLI's ``--validate_before_fit``).
    ``enabled=False`` turns the export off (pass it to the Trainer: the module's default then stays out).
    ``serve``: the recipe's ``export`` mapping, ``{servers: [llamacpp, vllm], dtype: bf16}``: the drafter is checked
    against those servers when ``fit`` starts, and exported for each into ``<export_dir>/../serving/<server>``.
    """

    def __init__(
        self,
        export_dir: str | Path | None = None,
        calibrate: dict | None = None,
        enabled: bool = True,
        serve: dict | None = None,
    ):
        calibrate_args(calibrate)  # refused now, not after training
        self.servers, self.serve_dtype = plan_args(serve)
        self.export_dir, self.calibrate, self.enabled = export_dir, calibrate, enabled
        self.tau_start: float | None = None
        self.path: Path | None = None  # the export, once written (rank 0)

    def directory(self, trainer: L.Trainer) -> Path:
        """Where the export goes (``trainer.log_dir`` is a collective under DDP: every rank calls this)."""
        return Path(self.export_dir) if self.export_dir else Path(trainer.log_dir or ".") / "drafter"

    def check(self, trainer: L.Trainer) -> None:
        """Refuse a non-empty export directory up front (an export never overwrites one)."""
        out = self.directory(trainer)
        if self.enabled and out.exists() and any(out.iterdir()):
            raise FileExistsError(
                f"export directory {out} is not empty; refusing to overwrite it (choose --export_dir)"
            )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.check(trainer)
            if self.enabled:
                check_servable(pl_module.drafter, self.servers, getattr(pl_module, "target", None))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        validate_if_stale(trainer, pl_module)
        out = self.directory(trainer)
        state = pl_module.drafter_state_dict()  # gathers FSDP shards: a collective too
        if not trainer.is_global_zero:
            return
        self.path = save_drafter(pl_module.drafter, out, pl_module.target, state=state)
        end = trainer.callback_metrics.get("val/tau_hat")
        if end is not None:
            start = "" if self.tau_start is None else f"{float(self.tau_start):.3f} -> "
            print(f"[dspark-lightning] held-out tau_hat {start}{float(end):.3f}", flush=True)
        print(f"[dspark-lightning] exported drafter -> {self.path}", flush=True)
        calibrate_after_fit(self.path, self.calibrate)
        log = lambda line: print(line, flush=True)  # noqa: E731
        export_for_servers(self.path, serving_layout(pl_module.drafter), self.servers, self.serve_dtype, log)


def calibrate_args(spec: dict | None) -> list[dict[str, Any]]:
    """``--calibrate {temperatures: [...], prompts_per_domain, max_new_tokens, domains}`` -> the keyword arguments of
    one :func:`~dspark_lightning.calibration.calibrate` per temperature (no drafter yet); refuses unknown keys and
    empty lists."""
    if not spec:
        return []
    unknown = set(spec) - CALIBRATE_KEYS
    if unknown:
        raise checks.UsageError(f"--calibrate: unknown keys {sorted(unknown)}; allowed: {sorted(CALIBRATE_KEYS)}")
    from ...calibration import DOMAINS

    temps = spec.get("temperatures")
    if not isinstance(temps, list | tuple) or not temps:
        raise checks.UsageError("--calibrate needs temperatures: a non-empty list, e.g. [0.0, 1.0]")
    for t in temps:
        checks.temperature("--calibrate.temperatures", t)
    extra: dict[str, Any] = {}
    for key in ("prompts_per_domain", "max_new_tokens"):
        if spec.get(key) is not None:
            checks.at_least(f"--calibrate.{key}", spec[key], 1)
            extra[key] = int(spec[key])
    if spec.get("domains"):
        for d in spec["domains"]:
            if d not in DOMAINS:
                raise checks.UsageError(f"--calibrate.domains {d!r} is not one of {', '.join(DOMAINS)}")
        extra["domains"] = [str(d) for d in spec["domains"]]
    return [{"temperature": float(t), **extra} for t in temps]


def calibrate_after_fit(drafter_dir: Path, spec: dict | None) -> None:
    from ...calibration import calibrate

    for kwargs in calibrate_args(spec):
        print(f"[dspark-lightning] calibrating the exported drafter at T = {kwargs['temperature']:g}", flush=True)
        calibrate(drafter_dir, **kwargs)
