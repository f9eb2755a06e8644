"""decode() inputs, outputs and errors."""

import pytest
import torch
from infer_helpers import make_drafter

from dspark_lightning.infer import decode, encode_prompt


def test_prompt_forms_agree(tiny_target):
    turns = [{"role": "user", "content": "hi there"}]
    ids = tiny_target.encode_prompt(turns)
    assert encode_prompt(tiny_target, "hi there") == ids
    assert encode_prompt(tiny_target, turns) == ids
    assert encode_prompt(tiny_target, torch.tensor(ids)) == ids
    assert encode_prompt(tiny_target, "hi there", chat=False) == list(tiny_target.tokenizer("hi there")["input_ids"])
    a = decode(tiny_target, None, "hi there", max_new_tokens=4)
    b = decode(tiny_target, None, [ids], max_new_tokens=4)
    c = decode(tiny_target, None, torch.tensor([ids, ids]), max_new_tokens=4)
    assert a.token_ids == b.token_ids == c.token_ids[:1] and len(c.token_ids) == 2


def test_result_fields(tiny_target):
    res = decode(tiny_target, make_drafter(tiny_target, block_size=3), ["a", "bb"], max_new_tokens=5)
    assert [len(t) for t in res.token_ids] == [5, 5] and res.finish_reasons == ["length", "length"]
    assert len(res.texts) == 2 and res.stats.prompts == 2 and res.stats.generated_tokens == 10
    assert set(res.stats.time_s) == {"prefill", "draft", "schedule", "verify", "accept", "total", "setup"}
    assert len(res.stats.survival) == 3 and res.requests[0]["output_tokens"] == 5
    streamed = {}
    decode(
        tiny_target, None, ["a", "bb"], max_new_tokens=5, on_commit=lambda i, t: streamed.setdefault(i, []).extend(t)
    )
    assert [streamed[0], streamed[1]] == decode(tiny_target, None, ["a", "bb"], max_new_tokens=5).token_ids


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompts": [[]]}, "empty prompt"),
        ({"prompts": [[1, 999]]}, "outside the target vocabulary"),
        ({"prompts": ["x"], "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompts": ["x"], "max_new_tokens": 5000}, "positions"),
        ({"prompts": []}, "at least one prompt"),
        ({"prompts": ["x"], "temperature": -1.0}, "temperature"),
        ({"prompts": ["x"], "batching": "diagonal"}, "batching"),
    ],
)
def test_bad_input_raises_clear_errors(tiny_target, kwargs, match):
    with pytest.raises(ValueError, match=match):
        decode(tiny_target, None, **kwargs)


def test_unknown_scheduler_lists_names(tiny_target):
    from dspark_lightning.registry import RegistryError

    with pytest.raises(RegistryError, match="hardware_aware"):
        decode(tiny_target, make_drafter(tiny_target), ["x"], max_new_tokens=2, scheduler="fastest")


def test_a_second_verifier_is_registered_and_selected_by_name(varied_target, prompts, registered):
    """Verifiers are a registry kind: a wrapper that counts target forwards, chosen with verifier='counting'."""
    from infer_helpers import hf_greedy

    from dspark_lightning import names
    from dspark_lightning.infer import HFVerifier

    @registered("verifier", "counting")
    class CountingVerifier(HFVerifier):
        forwards = 0

        def forward(self, *args, **kwargs):
            CountingVerifier.forwards += 1
            return super().forward(*args, **kwargs)

    assert {"hf", "counting"} <= set(names("verifier"))
    drafter = make_drafter(varied_target, block_size=3)
    res = decode(varied_target, drafter, prompts[:2], max_new_tokens=10, verifier="counting", stop_token_ids=[])
    assert res.token_ids == [hf_greedy(varied_target, p, 10) for p in prompts[:2]]
    assert CountingVerifier.forwards == res.stats.steps > 0
