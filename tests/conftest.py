import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub lookup otherwise hangs ~25 s

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_target():
    from dspark_lightning import load_target

    return load_target("tiny-debug")


@pytest.fixture(scope="session")
def varied_target():
    """A tiny random Llama whose greedy and sampled continuations vary (see tests/infer/conftest.py)."""
    from dspark_lightning.testing import random_target

    return random_target(vocab=260, hidden=64, layers=4, init=0.3, seed=0)


@pytest.fixture(scope="session")
def tiny_batch(tiny_target):
    """Features of two random sequences from the tiny target: (context, hidden, ids)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 24), generator=g)
    out = tiny_target(ids)
    return out.context, out.hidden, ids
