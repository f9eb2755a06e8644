"""Export after fit: the trained drafter written as a drafter directory, optionally STS-calibrated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import nn

from ... import checks
from ...checkpoint import save_drafter
from ...data.prepare import DataPaths
from ...data.prompts.sources import DOMAINS
from ...export.layouts import as_layout
from ...export.plan import check_servable, check_servers, export_for_servers, serving_layout
from ...registry import Component
from ..config import as_config
from .fit_stats import validate_if_stale


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


@dataclass
class Calibration:
    """``export.calibrate``: after the export, fit STS confidence temperatures for each of these sampling temperatures
    (:func:`~dspark_lightning.calibration.calibrate` per temperature), so the hardware-aware scheduler reads calibrated
    confidences (docs/inference.md)."""

    temperatures: list[float]
    """sampling temperatures, e.g. [0.0, 1.0]"""
    prompts_per_domain: int | None = None
    """prompts per domain (null = calibrate's default)"""
    max_new_tokens: int | None = None
    """tokens per rollout (null = calibrate's default)"""
    domains: list[Literal[DOMAINS]] | None = None
    """prompt domains (null = all)"""
    pool: Literal["heldout", "builtin"] = "heldout"
    """heldout: the recipe's own held-out split (the prompts the drafter will serve); builtin: the STS pool"""

    def __post_init__(self) -> None:
        if not self.temperatures:
            raise checks.UsageError("export.calibrate needs temperatures: a non-empty list, e.g. [0.0, 1.0]")
        for t in self.temperatures:
            checks.in_range("export.calibrate.temperatures", t, 0.0)  # a sampling temperature: >= 0, finite
        for key in ("prompts_per_domain", "max_new_tokens"):
            checks.at_least(f"export.calibrate.{key}", getattr(self, key), 1)

    def runs(self, heldout: Path | None = None) -> list[dict[str, Any]]:
        """The keyword arguments of one :func:`~dspark_lightning.calibration.calibrate` per temperature; ``heldout``:
        the recipe's held-out responses file, the pool when ``pool`` is ``heldout`` and the file exists."""
        extra = {k: v for k in ("prompts_per_domain", "max_new_tokens", "domains") if (v := getattr(self, k))}
        if self.pool == "heldout" and heldout is not None and heldout.is_file():
            extra["prompts"] = heldout
        return [{"temperature": float(t), **extra} for t in self.temperatures]


class DrafterExport(L.Callback):
    """At the end of ``fit``, write the drafter (config.json + model.safetensors) to ``dir`` (default
    ``<log_dir>/drafter``), after a final validation if training went on after the last one, and print the held-out
    τ̂ it reached; then STS-calibrate it (``calibrate``) and export it for each of ``servers``.

    The recipe's ``export:`` section holds these arguments (``dspark-lightning fit`` adds this callback from it); a
    plain ``Trainer.fit`` gets the defaults from ``DSparkModule.configure_callbacks``, or the instance it is given.
    A non-empty ``dir`` is refused when ``fit`` starts (:meth:`check`), before any training, and so is a drafter one of
    ``servers`` could not serve. ``tau_start``: the τ̂ of a validation before training, printed with the final one
    (the CLI's ``--validate_before_fit``).

    Args:
        dir: the exported drafter directory (null = ``<log_dir>/drafter``).
        calibrate: STS temperatures fitted after the export (null = none).
        servers: the servers the drafter is trained for, e.g. ``[llamacpp, vllm]``: each gets an export in
            ``<dir>/../serving/<server>`` (docs/serving.md).
        dtype: the serving exports' weights.
        layout: the serving exports' layout, a name or ``{class_path, init_args}`` with its settings (null = the
            drafter family's: dspark-hf, or eagle3-hf for an EAGLE-3 drafter).
        enabled: false turns the export off.
    """

    def __init__(
        self,
        dir: str | None = None,  # noqa: A002 - the recipe key export.dir
        calibrate: Calibration | None = None,
        servers: list[str] | None = None,
        dtype: Literal["bf16", "fp32"] = "bf16",
        layout: Component | None = None,
        enabled: bool = True,
    ):
        checks.output_dir("export.dir", dir)
        self.dir, self.enabled, self.dtype = dir, enabled, dtype
        self.layout = Component.unwrap(layout)
        if self.layout is not None:
            as_layout(self.layout)  # its settings are checked now
        self.calibrate = as_config(calibrate, Calibration, "export.calibrate") if calibrate is not None else None
        self.servers = check_servers(list(servers or []))
        self.tau_start: float | None = None
        self.path: Path | None = None  # the export, once written (rank 0)

    def directory(self, trainer: L.Trainer) -> Path:
        """Where the export goes (``trainer.log_dir`` is a collective under DDP: every rank calls this)."""
        return Path(self.dir) if self.dir else Path(trainer.log_dir or ".") / "drafter"

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a non-empty export directory (an export never overwrites one) and a drafter a named server could
        not serve."""
        if not self.enabled:
            return
        out = self.directory(trainer)
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"export directory {out} is not empty; refusing to overwrite it (set export.dir)")
        check_servable(pl_module.drafter, self.servers, getattr(pl_module, "target", None), self.layout)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.check(trainer, pl_module)

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
        if self.calibrate is not None:
            from ...calibration import calibrate

            work_dir = getattr(trainer.datamodule, "work_dir", None) if trainer.datamodule is not None else None
            heldout = DataPaths(Path(work_dir)).responses("heldout") if work_dir else None
            for kwargs in self.calibrate.runs(heldout):
                print(
                    f"[dspark-lightning] calibrating the exported drafter at T = {kwargs['temperature']:g}", flush=True
                )
                calibrate(self.path, **kwargs)
        log = lambda line: print(line, flush=True)  # noqa: E731
        layout = self.layout if self.layout is not None else serving_layout(pl_module.drafter)
        export_for_servers(self.path, layout, self.servers, self.dtype, log)
