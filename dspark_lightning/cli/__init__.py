"""The ``dspark-lightning`` console script, the top floor of the package (nothing below imports it).

- main.py: :func:`main`, one ``jsonargparse.CLI`` over the command functions (:func:`~.main.commands`); a usage
  error (``checks.UsageError``) or an OS error ends in one line on stderr and exit code 2, anything else (a bug)
  shows its traceback;
- decode.py: ``decode`` and ``profile``;
- evaluate.py: ``eval``, ``bench``, ``calibrate``, ``threshold-sweep`` and ``serve-bench``;
- export.py: ``export``;
- prepare.py: ``prepare`` and ``check-cache``, a recipe's data stages (the only commands here that import Lightning).

``fit`` / ``validate`` / ``test`` are LightningCLI's (``cli/fit.py``).
"""

from .main import main

__all__ = ["main"]
