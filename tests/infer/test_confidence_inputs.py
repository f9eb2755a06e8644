"""A confidence head that reads the draft's own margin and entropy, and a confidence map that reads the margin:
both run in decode() with greedy output equal to plain decoding, and the head refuses an export no engine reads."""

import pytest
import torch
from infer_helpers import make_drafter

from dspark_lightning.checkpoint.calibration import ConfidenceMap
from dspark_lightning.export.common import InteropError
from dspark_lightning.export.dspark_hf import check_dspark
from dspark_lightning.infer import decode
from dspark_lightning.infer.propose.draft import make_proposer


def test_draft_features_are_the_margin_and_entropy_of_the_logits(tiny_target):
    d = make_drafter(
        tiny_target, conf_head={"class_path": "linear", "init_args": {"draft_features": ["margin", "entropy"]}}
    )
    z = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]])
    f = d.conf_head.features(z)
    assert f[:, 0].tolist() == pytest.approx([1.5, 0.0])
    p = z.softmax(-1)
    assert f[:, 1].tolist() == pytest.approx((-(p * p.log()).sum(-1)).tolist())
    h = torch.zeros(2, tiny_target.geometry.hidden_size)
    with pytest.raises(ValueError, match="draft logits"):
        d.conf_head(h, torch.zeros(2, d.conf_head.token_dim))
    with pytest.raises(ValueError, match="distinct names"):
        make_drafter(
            tiny_target, conf_head={"class_path": "linear", "init_args": {"draft_features": ["margin", "margin"]}}
        )


def test_a_head_with_draft_features_decodes_losslessly_and_is_not_exported(tiny_target, prompts):
    d = make_drafter(tiny_target, conf_head={"class_path": "linear", "init_args": {"draft_features": ["margin"]}})
    plain = decode(tiny_target, None, prompts, max_new_tokens=12)
    spec = decode(tiny_target, d, prompts, max_new_tokens=12, scheduler="auto")
    assert spec.token_ids == plain.token_ids
    with pytest.raises(InteropError, match="draft_features"):
        check_dspark(d, trained=False)


def test_a_margin_map_drives_the_confidences_of_a_drafter_without_a_head(tiny_target, prompts):
    d = make_drafter(tiny_target, conf_head=None)
    cmap = ConfidenceMap((0.0, 0.0, 0.0), (1.0, 0.5, 0.25), (-1.0, -1.0, -1.0))
    proposer = make_proposer(d, confidence=cmap)
    ids = prompts[:2]
    plain = decode(tiny_target, None, ids, max_new_tokens=10)
    spec = decode(
        tiny_target, d, ids, max_new_tokens=10, scheduler={"class_path": "threshold", "init_args": {"threshold": 0.2}}
    )
    assert spec.token_ids == plain.token_ids
    with pytest.raises(ValueError, match="confidence head"):
        make_proposer(d, confidence=ConfidenceMap((1.0, 1.0, 1.0), (0.0,) * 3, (0.0,) * 3))
    assert proposer.confidence is cmap
    assert spec.log.margins and all(m.shape == (3,) and bool((m >= 0).all()) for m in spec.log.margins)
