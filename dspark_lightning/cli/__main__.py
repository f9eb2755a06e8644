"""``python -m dspark_lightning.cli``: the console script (what ``torchrun -m`` launches)."""

from .main import main

main()
