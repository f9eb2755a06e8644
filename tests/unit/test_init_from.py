"""Warm start from a published drafter (``model.init_from``): a drafter folder of any layout the project reads
starts a new run; at step 0 the new drafter decodes exactly as the source did (same drafts, same acceptance), a
different draft vocabulary is remapped by token id, and what cannot be reused is refused in one line."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infer"))
from infer_helpers import make_drafter  # noqa: E402

from dspark_lightning import load_drafter, load_target  # noqa: E402
from dspark_lightning.checkpoint import save_drafter  # noqa: E402
from dspark_lightning.drafters.warm_start import from_drafter  # noqa: E402
from dspark_lightning.export.convert import export_drafter  # noqa: E402
from dspark_lightning.infer import decode  # noqa: E402
from dspark_lightning.lightning.module import DSparkModule  # noqa: E402

PROMPTS = ([5, 17, 33, 2, 90, 7], [40, 41, 42, 43])
VOCAB = torch.arange(0, 260, 3)  # a reduced draft vocabulary of 87 of the 260 tokens


@pytest.fixture(scope="module")
def target():
    return load_target("tiny-debug")


def source(target, block_size=3, vocab=VOCAB):
    d = make_drafter(target, block_size=block_size, seed=3, draft_vocab_size=len(vocab))
    d.set_draft_vocab(vocab)
    with torch.no_grad():  # a trained-looking head: the random init zeroes nothing, so every copy shows
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return d


def rounds(target, drafter):
    res = decode(target, drafter, list(PROMPTS), max_new_tokens=16, scheduler="static", stop_token_ids=[],
                 drafter_dtype=None)  # fmt: skip
    return res.token_ids, list(res.log.accepted), torch.stack(res.log.margins), res.stats.tau


@pytest.mark.parametrize("layout", ["native", "dspark-hf"])
def test_step_zero_decodes_like_the_source(tmp_path, target, layout):
    src = source(target)
    folder = save_drafter(src, tmp_path / "native", target)
    if layout != "native":
        folder = export_drafter(folder, layout, tmp_path / layout, dtype="fp32", target=target).path
    loaded = load_drafter(folder, target)
    fresh = make_drafter(target, block_size=3, seed=11, draft_vocab_size=len(VOCAB))
    assert not fresh.vocab_ready
    reuse = from_drafter(fresh, loaded)
    assert torch.equal(fresh.draft_vocab, VOCAB) and not reuse.fresh and not reuse.remapped
    want, got = rounds(target, src), rounds(target, fresh)
    assert got[0] == want[0] and got[1] == want[1] and got[3] == want[3]
    torch.testing.assert_close(got[2], want[2])


def test_another_draft_vocabulary_is_remapped_by_token_id(target):
    src = source(target)
    new_vocab = torch.arange(0, 260, 2)  # 130 tokens; those divisible by 6 are in both
    d = make_drafter(target, block_size=3, seed=11, draft_vocab_size=len(new_vocab))
    d.set_draft_vocab(new_vocab)
    init = {k: v.clone() for k, v in d.state_dict().items()}
    reuse = from_drafter(d, src)
    assert reuse.remapped, "no draft-vocabulary tensor was remapped"
    for name in reuse.remapped:
        new, old, before = d.state_dict()[name], src.state_dict()[name], init[name]
        ax = [i for i, n in enumerate(new.shape) if n == len(new_vocab)][0]
        for tok in (0, 6, 12, 2, 4):
            i = int((new_vocab == tok).nonzero())
            row = new.select(ax, i)
            if tok % 6 == 0:  # in both vocabularies: the source's row
                assert torch.equal(row, old.select(ax, int((VOCAB == tok).nonzero())))
            else:  # only in the new one: left fresh
                assert torch.equal(row, before.select(ax, i))


def test_another_block_size_is_refused_in_one_line(target):
    with pytest.raises(ValueError, match=r"model\.block_size: 3"):
        from_drafter(make_drafter(target, block_size=5, draft_vocab_size=len(VOCAB)), source(target))


def test_a_missing_head_starts_fresh_and_is_said(target):
    src = make_drafter(target, block_size=3, seed=3, conf_head=None)
    d = make_drafter(target, block_size=3, seed=11)
    reuse = from_drafter(d, src)
    assert reuse.fresh and all(n.startswith("conf_head") for n in reuse.fresh)
    assert "fresh: conf_head" in reuse.summary()


def test_the_module_continues_from_a_folder(tmp_path, target):
    """``model.init_from`` on the LightningModule: the source's vocabulary and weights are in place after setup."""
    src = source(target)
    folder = save_drafter(src, tmp_path / "src", target)

    class DM:  # the datamodule parts setup reads (no data: the source's vocabulary is adopted)
        max_anchors = None

    class Trainer:
        datamodule, precision, gradient_clip_val = DM(), "32-true", None

    m = DSparkModule(
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head="vanilla",
        conf_head="linear",
        block_size=3,
        target="tiny-debug",
        mask_token_id=1,
        draft_vocab_size=len(VOCAB),
        init_from=str(folder),
    )
    m.trainer = Trainer()
    m.setup("fit")
    assert torch.equal(m.drafter.draft_vocab, VOCAB)
    for k, v in src.state_dict().items():
        assert torch.equal(m.drafter.state_dict()[k], v), k


def test_a_folder_with_other_taps_is_refused(tmp_path, target):
    other = load_target("tiny-debug", layer_ids=[0])
    folder = save_drafter(make_drafter(other, block_size=3), tmp_path / "src", other)
    with pytest.raises(ValueError, match=r"target\.layer_ids"):
        DSparkModule(backbone={"class_path": "dense", "init_args": {"num_layers": 1}}, seq_head="vanilla", block_size=3,
                     target="tiny-debug", mask_token_id=1, init_from=str(folder))  # fmt: skip
    assert load_target("tiny-debug").geometry.layer_ids != (0,)  # the shared target keeps its taps
