"""The ``dspark-lightning`` console script.

    dspark-lightning fit|validate|test --config recipes/...yaml   (Lightning; see lightning/cli.py)
    dspark-lightning prepare|verify --config recipes/...yaml      (regeneration + features, sharded; shard sha256)
    dspark-lightning decode --target ... --drafter ... --prompt "..."
    dspark-lightning profile --target ...
    dspark-lightning eval --drafter name=path ... --out DIR      (τ table, acceptance plot, speed)
    dspark-lightning bench --drafter name=path ... --out DIR     (side-by-side throughput)
    dspark-lightning export --drafter DIR --format dspark-hf --out DIR   (layouts vLLM / SGLang serve)
    dspark-lightning calibrate|threshold-sweep|serve-bench --drafter DIR ...   (STS, Figure 5, Figures 7-8)

Inference subcommands never import Lightning. Bad input, a full disk (naming the path and the space it needs) and
a folder another command is writing to give a one-line error and exit code 2.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time

INFER_COMMANDS = {  # subcommand -> (module, function); none of them imports Lightning
    "decode": ("dspark_lightning.infer.cli", "run_decode"),
    "profile": ("dspark_lightning.infer.cli", "run_profile"),
    "eval": ("dspark_lightning.eval.cli", "run_eval"),
    "bench": ("dspark_lightning.eval.cli", "run_bench"),
    "calibrate": ("dspark_lightning.eval.cli", "run_calibrate"),
    "threshold-sweep": ("dspark_lightning.eval.cli", "run_threshold_sweep"),
    "serve-bench": ("dspark_lightning.eval.cli", "run_serve_bench"),
    "export": ("dspark_lightning.interop", "run_export"),
}

DATA_COMMANDS = {  # subcommand -> (module, function); they parse a recipe's data: section as fit does
    "prepare": ("dspark_lightning.lightning.prepare_cli", "run_prepare"),
    "verify": ("dspark_lightning.lightning.prepare_cli", "run_verify"),
}


OVERVIEW = """\
usage: dspark-lightning COMMAND [options]   (dspark-lightning COMMAND --help for a command's options)

training (Lightning; recipes in recipes/*.yaml):
  fit               train a drafter and export it (--config RECIPE)
  validate, test    held-out metrics of a recipe's drafter (--ckpt_path)
  prepare           regenerate responses and cache target features, sharded by rank
  verify            sha256 of every cached feature shard

inference and evaluation (no Lightning import):
  decode            lossless speculative decoding of prompts with a drafter
  profile           measure the target's SPS(B) table on this machine
  eval              τ table, position-wise acceptance and speed of drafters
  bench             side-by-side throughput of drafters
  calibrate         fit STS confidence temperatures of a drafter
  threshold-sweep   confidence-threshold sweep
  serve-bench       closed-loop concurrency study of schedulers
  export            write a drafter in a layout vLLM / SGLang serve

Bad input gives a one-line `dspark-lightning COMMAND: error: ...` and exit code 2.
The training commands' options follow (LightningCLI):
"""


def one_line_error(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines) if lines else type(exc).__name__


def main(args: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    commands = {**INFER_COMMANDS, **DATA_COMMANDS}
    if not argv or argv[0] in ("-h", "--help"):
        print(OVERVIEW)  # LightningCLI's own help names only its subcommands
    if argv and argv[0] in commands:
        import importlib

        from yaml import YAMLError

        from .atomic import DiskFullError, disk_full_message, is_disk_full
        from .data.cache import CacheError
        from .export import DrafterLoadError
        from .locks import FolderLockedError
        from .registry import RegistryError

        errors = (ArgumentError, RegistryError, FileNotFoundError, DrafterLoadError, ValueError, NotImplementedError)
        errors += (CacheError, FileExistsError, YAMLError, DiskFullError, FolderLockedError)
        try:
            module, func = commands[argv[0]]
            getattr(importlib.import_module(module), func)(argv[1:])
        except errors as exc:
            print(f"dspark-lightning {argv[0]}: error: {one_line_error(exc)}", file=sys.stderr)
            sys.exit(2)
        except OSError as exc:  # a full disk in a write that is not ours: one line too, naming the file
            if not is_disk_full(exc):
                raise
            print(f"dspark-lightning {argv[0]}: error: {disk_full_message(exc)}", file=sys.stderr)
            sys.exit(2)
        return
    from .lightning.cli import main as lightning_main

    lightning_main(args)  # None: LightningCLI reads sys.argv itself (passing both makes it warn)


if __name__ == "__main__":
    main()
