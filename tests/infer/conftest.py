"""Targets for inference tests.

``varied_target`` is a tiny random Llama initialised with a large std so that its greedy
continuations vary (the embedded ``tiny-debug`` repeats one token, which a drafter predicting its
input would match trivially) and its top-2 logit gaps are far above float noise.
``toy_target`` has an 8-token vocabulary, small enough to enumerate exact output laws.
"""

import pytest
from infer_helpers import random_llama

from dspark_lightning import load_target


@pytest.fixture(scope="session")
def varied_target(tiny_target):
    model = random_llama(tiny_target.geometry.vocab_size, 64, 4, init=0.3, seed=0)
    return load_target(model, layer_ids=[0, 1, 2], tokenizer=tiny_target.tokenizer)


@pytest.fixture(scope="session")
def toy_target(tiny_target):
    model = random_llama(8, 32, 4, init=0.15, seed=1)
    return load_target(model, layer_ids=[0, 1, 2], tokenizer=tiny_target.tokenizer)


@pytest.fixture(scope="session")
def prompts(tiny_target):
    texts = ["hello there", "What is 17*23? Please answer briefly.", "x", "def f(a, b):\n    return"]
    return [tiny_target.render_prompt([{"role": "user", "content": t}]) for t in texts]
