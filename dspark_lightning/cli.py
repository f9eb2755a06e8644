"""The ``dspark-lightning`` console script.

    dspark-lightning fit|validate|test --config recipes/...yaml   (Lightning; see lightning/cli.py)
    dspark-lightning decode --target ... --drafter ... --prompt "..."
    dspark-lightning profile --target ...

Inference subcommands never import Lightning. Bad input gives a one-line error and exit code 2.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time

INFER_COMMANDS = {"decode": "run_decode", "profile": "run_profile"}


def one_line_error(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines) if lines else type(exc).__name__


def main(args: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in INFER_COMMANDS:
        from .export import DrafterLoadError
        from .infer import cli
        from .registry import RegistryError

        errors = (ArgumentError, RegistryError, FileNotFoundError, DrafterLoadError, ValueError, NotImplementedError)
        try:
            getattr(cli, INFER_COMMANDS[argv[0]])(argv[1:])
        except errors as exc:
            print(f"dspark-lightning {argv[0]}: error: {one_line_error(exc)}", file=sys.stderr)
            sys.exit(2)
        return
    from .lightning.cli import main as lightning_main

    lightning_main(argv)


if __name__ == "__main__":
    main()
