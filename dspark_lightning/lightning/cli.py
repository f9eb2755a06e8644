"""The ``dspark-lightning`` console script (LightningCLI + jsonargparse).

    dspark-lightning fit --config recipes/smollm2_dspark.yaml
    dspark-lightning validate --config recipes/tiny_debug.yaml --ckpt_path ...

``fit`` validates once before training (τ̂ at step 0), trains, and exports the drafter directory
(config.json + model.safetensors) into ``<log_dir>/drafter`` or ``--export_dir``. Bad input gives
a one-line error and exit code 2.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time

from lightning.pytorch.cli import LightningCLI  # noqa: E402

from ..cli import one_line_error  # noqa: E402
from ..data.cache import CacheError  # noqa: E402
from ..export import DrafterLoadError, save_drafter  # noqa: E402
from ..registry import RegistryError  # noqa: E402
from .datamodule import DSparkDataModule  # noqa: E402
from .module import DSparkModule  # noqa: E402

USER_ERRORS = (
    ArgumentError,
    RegistryError,
    FileNotFoundError,
    FileExistsError,
    CacheError,
    DrafterLoadError,
    ValueError,
)


class DSparkCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.target", "model.target")
        parser.link_arguments("data.layer_ids", "model.layer_ids")
        parser.link_arguments("data.system_prompt", "model.system_prompt")
        parser.link_arguments("data.target_dtype", "model.target_dtype")
        parser.add_argument("--validate_before_fit", type=bool, default=True, help="validate once at step 0 (τ̂ start)")
        parser.add_argument(
            "--export_dir", type=str | None, default=None, help="exported drafter dir (default: <log_dir>/drafter)"
        )

    def before_instantiate_classes(self) -> None:
        """``data.target_dtype: null`` follows the trainer: fp32 for a CPU run or a 32-bit precision (the CPU recipes
        stay fp32 on a machine that has a GPU), else the devices default (bf16 on CUDA)."""
        cfg = self.config.get(self.subcommand, self.config)
        data, trainer = cfg.get("data"), cfg.get("trainer")
        if data is None or trainer is None or data.get("target_dtype") is not None:
            return
        accel = str(trainer.get("accelerator") or "auto").lower()
        precision = str(trainer.get("precision") or "32-true")
        if accel == "cpu" or precision.startswith(("32", "64")):
            data["target_dtype"] = "fp32"
            if cfg.get("model") is not None and "target_dtype" in cfg["model"]:
                cfg["model"]["target_dtype"] = "fp32"

    def _export_dir(self) -> Path:
        cfg = self.config[self.subcommand]
        return Path(cfg.export_dir) if cfg.export_dir else Path(self.trainer.log_dir or ".") / "drafter"

    def before_fit(self) -> None:
        out = self._export_dir()
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(
                f"export directory {out} is not empty; refusing to overwrite it (choose --export_dir)"
            )
        self.datamodule.check()
        self._tau_start = None
        if self.config[self.subcommand].validate_before_fit:
            self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
            self._tau_start = self.trainer.callback_metrics.get("val/tau_hat")

    def after_fit(self) -> None:
        out = self._export_dir()  # trainer.log_dir is a collective under DDP: every rank calls it
        state = self.model.drafter_state_dict()  # gathers FSDP shards: a collective too
        if self.trainer.is_global_zero:
            path = save_drafter(self.model.drafter, out, self.model.target, state=state)
            end = self.trainer.callback_metrics.get("val/tau_hat")
            if end is not None:
                start = "" if self._tau_start is None else f"{float(self._tau_start):.3f} -> "
                print(f"[dspark-lightning] held-out tau_hat {start}{float(end):.3f}", flush=True)
            print(f"[dspark-lightning] exported drafter -> {path}", flush=True)


def main(args: list[str] | None = None) -> None:
    try:
        DSparkCLI(
            DSparkModule,
            DSparkDataModule,
            parser_kwargs={"exit_on_error": False},
            save_config_kwargs={"overwrite": False},
            args=args,
        )
    except USER_ERRORS as exc:
        print(f"dspark-lightning: error: {one_line_error(exc)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
