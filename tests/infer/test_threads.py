"""decode() from several threads sharing one target and one drafter.

The target's tapped layers are collected per forward call (one dict on the module would be shared, and two
threads would fail with a ``KeyError``); every decode() builds its own verifier, proposer, scheduler and random streams.
Each thread decodes its own prompts, started together on a barrier, in several trials: no exception, and every
output equals what the same call gives alone (greedy, and T = 1 with the same seed and the same batch).
"""

import threading

import pytest
from infer_helpers import make_drafter

from dspark_lightning.infer import decode

N_THREADS, TRIALS, MAX_NEW = 4, 3, 12
TEXTS = [
    ["hello there", "x"],
    ["What is 17*23? Please answer briefly.", "def f(a, b):\n    return"],
    ["one two three", "a longer prompt about the weather in spring"],
    ["z", "print('hi')"],
]


def in_threads(fn) -> list:
    """``fn(i)`` for i < N_THREADS, each in its own thread, started together; re-raises the first error."""
    barrier = threading.Barrier(N_THREADS)
    results, errors = [None] * N_THREADS, []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 (reported below, with the thread's traceback)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("verifier", ["hf", "lean"])
def test_threads_sharing_a_target_and_drafter_decode_as_alone(varied_target, verifier, temperature):
    drafter = make_drafter(varied_target, block_size=3)

    def call(i: int) -> list[list[int]]:
        res = decode(varied_target, drafter, TEXTS[i], max_new_tokens=MAX_NEW, temperature=temperature,
                     seed=100 + i, verifier=verifier)  # fmt: skip
        return res.token_ids

    alone = [call(i) for i in range(N_THREADS)]
    for _ in range(TRIALS):
        assert in_threads(call) == alone


def test_threads_loading_one_target_get_one_object():
    from dspark_lightning import load_target

    loaded = in_threads(lambda i: load_target("tiny-debug", layer_ids=[0, 2, 4]))
    assert all(t is loaded[0] for t in loaded)
