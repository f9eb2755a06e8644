"""The ``dspark-lightning`` console script (LightningCLI + jsonargparse).

    dspark-lightning fit --config recipes/smollm2_dspark.yaml
    dspark-lightning validate --config recipes/tiny_debug.yaml --ckpt_path ...

A recipe has ``target`` (given to the model and the data), ``model``, ``data``, ``trainer`` and ``export`` sections.
``fit`` validates once before training (τ̂ at step 0), trains, and exports the drafter directory
(config.json + model.safetensors) into ``<log_dir>/drafter`` or ``--export.dir``. Bad input (a
usage error) gives a one-line error and exit code 2; any other exception is a bug and shows its traceback (see
cli/main.py). The export, fit_stats.json and the divergence guard are the module's callbacks
(``callbacks/``), so a plain ``Trainer.fit`` does the same; this CLI builds the export callback from the recipe's
``export:`` section and adds the step-0 validation and ``--ckpt_path last``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import zipfile
from argparse import ArgumentError
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time

from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: E402
from lightning.pytorch.cli import LightningCLI  # noqa: E402
from yaml import YAMLError  # noqa: E402

from .. import checks, locks  # noqa: E402
from ..atomic import disk_full_message, is_disk_full  # noqa: E402
from ..errors import one_line_error, user_error_within  # noqa: E402
from ..lightning import recipe_checks  # noqa: E402
from ..lightning.callbacks import DrafterExport, TrainingDiverged  # noqa: E402
from ..lightning.checkpoint_io import AtomicCheckpointIO, checkpoint_problem  # noqa: E402
from ..lightning.config import TargetConfig, target_for_trainer  # noqa: E402
from ..lightning.datamodule import DSparkDataModule  # noqa: E402
from ..lightning.module import DSparkModule  # noqa: E402
from .main import usage_error  # noqa: E402

# What Lightning and jsonargparse raise for a bad recipe or command line, and a run the recipe made diverge: each is
# turned into a UsageError at the boundary that meets it (parsing, building, the run), its cause kept for
# DSPARK_TRACEBACK=1; anything else is a bug and keeps its traceback.
RECIPE_ERRORS = (ArgumentError, YAMLError, MisconfigurationException, TrainingDiverged)


class DSparkCLI(LightningCLI):
    def __init__(self, *args, **kwargs) -> None:
        """The folder locks taken by :meth:`instantiate_classes` are held until the command ends (or fails).
        Lightning's trainer turns Ctrl-C into ``sys.exit(1)``: raised again as KeyboardInterrupt, so the console
        script ends with its one "interrupted" line and exit code 130. A bad recipe or command line (jsonargparse's
        ``ArgumentError``, Lightning's ``MisconfigurationException``) and a diverged run are usage errors."""
        with contextlib.ExitStack() as self._locks:
            try:
                super().__init__(*args, **kwargs)
            except RECIPE_ERRORS as exc:
                raise checks.UsageError(one_line_error(exc)) from exc
            except SystemExit as exc:
                status = getattr(getattr(getattr(self, "trainer", None), "state", None), "status", None)
                if exc.code == 1 and status == "interrupted":
                    raise KeyboardInterrupt from None
                raise

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(TargetConfig, "target", help="the frozen target, declared once (model and data)")
        for to in ("model.target", "data.target"):
            parser.link_arguments(("target", "trainer.accelerator", "trainer.precision"), to, target_for_trainer)
        parser.add_lightning_class_args(DrafterExport, "export")
        parser.add_argument("--validate_before_fit", type=bool, default=True, help="validate once at step 0 (τ̂ start)")

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's, less ``predict``: a drafter has no predict step (``dspark-lightning decode`` generates)."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k != "predict"}

    def parse_arguments(self, parser, args) -> None:
        """LightningCLI reads the hyperparameters of an explicit ``--ckpt_path`` right after parsing: check the file
        first."""
        super().parse_arguments(parser, args)
        cfg = self.config.get(str(self.config.get("subcommand")), self.config)
        check_checkpoint_file(cfg.get("ckpt_path"))

    def instantiate_classes(self) -> None:
        """Check the recipe before anything is built, then build it; a component that refuses its arguments (a
        ``ValueError``, torch's ``RuntimeError`` for ``rank: -1``) is a recipe error, reported in one line with the
        original as its cause; a ``TypeError`` or ``AttributeError`` there is a bug and keeps its traceback."""
        cfg = self.config.get(self.subcommand, self.config)
        classes = {"target": TargetConfig, "model": DSparkModule, "data": DSparkDataModule}
        recipe_checks.lightning_args(cfg, classes)  # trainer counts, nulls, dirs
        recipe_checks.model_args(cfg.get("model"))
        recipe_checks.data_args(cfg.get("data"), DSparkDataModule)
        try:
            super().instantiate_classes()
        except (checks.UsageError, *RECIPE_ERRORS):
            raise
        except (ValueError, RuntimeError) as exc:  # a constructor refusing a value (a tensor of negative size)
            if (ours := user_error_within(exc)) is not None:
                raise ours from None
            raise checks.UsageError(f"the recipe's model or data cannot be built: {one_line_error(exc)}") from exc
        check_built(self.model)
        if self.subcommand == "fit":  # the export's folder and servers, before any data work
            self._exporter().check(self.trainer, self.model)
        if self.subcommand == "fit" and locks.is_primary_process():  # the ranks of one run share its folders
            for folder in (cfg.get("trainer", {}).get("default_root_dir"), cfg.get("data", {}).get("work_dir")):
                if folder and "://" not in str(folder):
                    self._locks.enter_context(locks.folder_lock(folder, "fit"))

    def instantiate_trainer(self, **kwargs):
        """Checkpoints go through :class:`AtomicCheckpointIO` unless the recipe brings its own ``CheckpointIO``."""
        from lightning.pytorch.plugins.io import CheckpointIO

        config = self._get(self.config_init, "trainer", default={})
        plugins = config.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        strategy_io = getattr(config.get("strategy"), "_checkpoint_io", None)
        if strategy_io is None and not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        return super().instantiate_trainer(**kwargs)

    def _exporter(self) -> DrafterExport:
        return next(c for c in self.trainer.callbacks if isinstance(c, DrafterExport))

    def before_fit(self) -> None:
        checks.data_positions(self.model.target, self.config[self.subcommand].get("data"))  # before any work
        resuming = self._resolve_ckpt_path()
        if self.config[self.subcommand].validate_before_fit and not resuming:  # τ̂ at step 0 is the fresh run's
            self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
            self._exporter().tau_start = self.trainer.callback_metrics.get("val/tau_hat")

    def before_validate(self) -> None:
        checks.data_positions(self.model.target, self.config[self.subcommand].get("data"))
        self._resolve_ckpt_path()

    before_test = before_validate

    # --- checkpoints ----------------------------------------------------------------------------------
    def _resolve_ckpt_path(self) -> bool:
        """Turn ``--ckpt_path last`` into the newest checkpoint of this recipe's earlier runs, or fail loudly; check
        that an explicit path exists. Returns whether a checkpoint will be loaded.

        Lightning's own ``last`` looks only in this run's checkpoint folder, which for a logger is a new
        ``version_N``: it found nothing and silently trained from step 0."""
        kwargs = self.config_init[self.subcommand]
        ckpt = kwargs.get("ckpt_path")
        if ckpt is None:
            return False
        ckpt = str(ckpt)
        if ckpt == "last":
            kwargs["ckpt_path"] = str(self._latest_checkpoint())
            print(f"[dspark-lightning] resuming from {kwargs['ckpt_path']}", flush=True)
        elif ckpt not in ("best", "hpc") and "://" not in ckpt and not Path(ckpt).is_file():
            raise FileNotFoundError(f"--ckpt_path {ckpt}: no such checkpoint file")
        return True

    def _checkpoint_patterns(self) -> list[str]:
        """Where this recipe's runs keep checkpoints: a ModelCheckpoint's fixed ``dirpath``, else Lightning's default
        for it, ``<save_dir>/<name>/<version>/checkpoints`` of the first logger (``<default_root_dir>/checkpoints``
        without one), over every earlier version."""
        trainer, patterns = self.trainer, []
        for cb in trainer.checkpoint_callbacks:
            if getattr(cb, "dirpath", None):
                patterns.append(str(Path(cb.dirpath, "*.ckpt")))
            elif trainer.loggers and trainer.loggers[0].save_dir is not None:
                logger = trainer.loggers[0]
                patterns.append(str(Path(logger.save_dir, str(logger.name or ""), "*", "checkpoints", "*.ckpt")))
            else:
                patterns.append(str(Path(trainer.default_root_dir, "checkpoints", "*.ckpt")))
        return patterns

    def _latest_checkpoint(self) -> Path:
        """The most recently written *readable* checkpoint matching :meth:`_checkpoint_patterns` (``last.ckpt`` wins
        a tie). A truncated or damaged newer one (a disk that filled, a copy that broke off) is skipped, in one line;
        none readable is a one-line error."""
        patterns = self._checkpoint_patterns()
        found = [Path(f) for pattern in patterns for f in glob.glob(pattern) if Path(f).is_file()]
        if not found:
            where = ", ".join(patterns) or "nowhere (checkpointing is disabled)"
            raise FileNotFoundError(
                f"--ckpt_path last: no checkpoint of this recipe matches {where}; run fit without --ckpt_path to start"
            )
        return newest_readable(found)


def newest_readable(found: list[Path]) -> Path:
    """The newest of ``found`` (``last*`` wins a tie) that :func:`checkpoint_problem` passes; says which it skipped."""
    skipped = []
    for f in sorted(found, key=lambda f: (f.stat().st_mtime_ns, f.stem.startswith("last")), reverse=True):
        problem = checkpoint_problem(f)
        if problem is None:
            if skipped:
                names = "; ".join(f"{p} ({why})" for p, why in skipped)
                print(f"[dspark-lightning] --ckpt_path last: skipping unreadable {names}; using {f}", flush=True)
            return f
        skipped.append((f, problem))
    names = "; ".join(f"{p} ({why})" for p, why in skipped)
    raise checks.UsageError(
        f"--ckpt_path last: no readable checkpoint of this recipe ({names}); run fit without --ckpt_path to start over"
    )


def check_checkpoint_file(path: str | None) -> None:
    """An explicit ``--ckpt_path`` file must be a torch checkpoint (a zip archive), checked up front: a garbage file
    would otherwise fail deep inside ``torch.load`` after the model was built and validated."""
    if path is None or str(path) in ("last", "best", "hpc") or "://" in str(path):
        return
    checks.path_length("--ckpt_path", path)  # before is_file(): an over-long name makes stat() itself fail
    if not Path(path).is_file():
        return  # missing files and FIFOs: see _resolve_ckpt_path
    if not zipfile.is_zipfile(path):
        raise checks.UsageError(f"--ckpt_path {path} is not a checkpoint written by fit (not a torch zip archive)")


def check_built(model: DSparkModule) -> None:
    """What needs the target's vocabulary: the mask token must be one of its ids."""
    drafter = getattr(model, "drafter", None)
    mask, vocab = getattr(drafter, "mask_token_id", None), getattr(getattr(drafter, "geometry", None), "vocab_size", 0)
    if vocab:
        checks.token_id("model.mask_token_id", mask, vocab)


def refuse_unsupported(argv: list[str]) -> None:
    """``predict`` and LightningCLI's ``--optimizer`` / ``--lr_scheduler``: refused in one line rather than accepted
    and ignored (the drafter's AdamW with warmup + cosine comes from ``model.optim``; see docs/training.md)."""
    if argv and argv[0] == "predict":
        raise checks.UsageError("there is no predict step for a drafter; generate with `dspark-lightning decode`")
    for arg in argv:
        if arg.split("=", 1)[0].split(".", 1)[0] in ("--optimizer", "--lr_scheduler"):
            raise checks.UsageError(
                f"{arg.split('=', 1)[0]} is not supported: the optimizer is AdamW with linear warmup and cosine decay, "
                "set by model.optim (lr, betas, eps, weight_decay, warmup_fraction)"
            )


def main(args: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    try:
        refuse_unsupported(argv)
        DSparkCLI(
            DSparkModule,
            DSparkDataModule,
            parser_kwargs={"exit_on_error": False, "prog": "dspark-lightning"},
            save_config_kwargs={"overwrite": False},
            auto_configure_optimizers=False,
            args=args,
        )
    except checks.UsageError as exc:  # the one kind shown as one line (DSPARK_TRACEBACK=1: after its traceback)
        usage_error(command, exc)
    except OSError as exc:
        if not is_disk_full(exc):  # a full disk in a write that is not ours (a logger's): one line too
            raise
        print(f"dspark-lightning{' ' + command if command else ''}: error: {disk_full_message(exc)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
