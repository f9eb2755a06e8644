"""Targets for inference tests.

``varied_target`` is a tiny random Llama initialised with a large std so that its greedy
continuations vary (the embedded ``tiny-debug`` repeats one token, which a drafter predicting its
input would match trivially) and its top-2 logit gaps are far above float noise.
``toy_target`` has an 8-token vocabulary, small enough to enumerate exact output laws.
"""

import pytest

from dspark_lightning.testing import random_target


@pytest.fixture(scope="session")
def toy_target():
    return random_target(vocab=8, hidden=32, layers=4, init=0.15, seed=1)


@pytest.fixture(scope="session")
def prompts(tiny_target):
    texts = ["hello there", "What is 17*23? Please answer briefly.", "x", "def f(a, b):\n    return"]
    return [tiny_target.encode_prompt(t) for t in texts]
