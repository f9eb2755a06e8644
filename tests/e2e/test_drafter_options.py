"""Recipe options end to end on tiny_debug: the draft-vocabulary loss, a curriculum, WSD, the argmax CE,
the context state and the warm start train, log the T = 0 metrics, export, reload and decode losslessly."""

import csv
import json
from pathlib import Path

import pytest
import torch

from .conftest import TINY

OPTIONS = [
    "--trainer.max_steps=6",
    "--trainer.val_check_interval=3",
    "--model.draft_vocab_size=64",
    "--model.loss.top_ce_weight=0.5",
    "--model.optim.schedule=wsd",
    '--model.curriculum=[{"until": 0.5, "block_size": 2, "anchors": 4, "decay": 1.0}, {"until": 1.0}]',
    '--model.warm_start={"layers": null}',
    "--model.backbone.init_args.context_state=true",
    '--export={"servers": []}',  # a research run: no server reads the context state
]


def test_fit_with_every_issue18_option_exports_a_lossless_drafter(workdir, capsys):
    from dspark_lightning import load_drafter
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.infer import decode
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule
    from tests.infer.infer_helpers import hf_greedy

    cli = DSparkCLI(DSparkModule, DSparkDataModule, args=["fit", "--config", TINY, *OPTIONS])
    log_dir = Path(cli.trainer.log_dir)
    rows = list(csv.DictReader(open(workdir / "outputs/tiny_debug/csv/version_0/metrics.csv")))
    for key in ("val/tfa_pos1", "val/tau_greedy", "val/acc_pos1_chat", "val/tfa_pos1_chat", "train/top_ce"):
        vals = [float(r[key]) for r in rows if r.get(key)]
        assert vals and all(0.0 <= v <= 5.0 for v in vals), key
    stats = json.loads((log_dir / "fit_stats.json").read_text())
    assert 0.0 <= stats["validation"]["all"]["tfa_pos"][0] <= 1.0
    assert "TF-A_1" in capsys.readouterr().out  # the end-of-fit table

    target = cli.model.target
    drafter = load_drafter(log_dir / "drafter", target)
    assert drafter.backbone.context_state and drafter.block_size == 4  # the export keeps the full block
    prompt = target.encode_prompt("Count to five.")
    res = decode(target, drafter, [prompt], max_new_tokens=24, temperature=0.0, scheduler="static")
    got = res.token_ids[0]
    assert got and got == hf_greedy(target, prompt, 24, target.stop_token_ids)[: len(got)]
    assert res.stats.rounds > 0


def test_warm_start_copies_the_target_layers(tiny_target):
    from dspark_lightning import create
    from dspark_lightning.drafters.warm_start import WarmStart, warm_start

    d = create(
        "drafter", "dspark", tiny_target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    ids = warm_start(d, tiny_target, WarmStart())
    src = tiny_target.decoder_layers[ids[0]]
    taps = tiny_target.geometry.layer_ids
    assert ids == [min(taps[-1] + 1, len(tiny_target.decoder_layers) - 1)]  # the layer that reads the deepest tap
    assert torch.equal(d.backbone.layers[0].attn.q_proj.weight, src.self_attn.q_proj.weight)
    assert torch.equal(d.backbone.layers[0].mlp.down_proj.weight, src.mlp.down_proj.weight)
    dim = tiny_target.geometry.hidden_size
    fc = d.backbone.fc.weight
    j = len(taps) - 1
    assert torch.equal(fc[:, j * dim :], torch.eye(dim)) and not fc[:, : j * dim].any()
    assert not d.seq_head.lr.w2.weight.any() and not d.conf_head.proj.weight.any()
    with pytest.raises(ValueError, match="warm_start.layers"):
        warm_start(d, tiny_target, WarmStart(layers=[99]))
    with pytest.raises(ValueError, match="fuse_tap"):
        warm_start(d, tiny_target, WarmStart(fuse_tap=-7))
