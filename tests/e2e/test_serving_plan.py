"""``export: {servers: [...]}``: fit refuses, before any data work, what the named servers cannot serve, and after
training writes one export per server next to the native drafter."""

import json
from pathlib import Path

import pytest

from .conftest import TINY, run_main


@pytest.mark.parametrize(
    "args,words",
    [
        (
            ["--model.backbone.init_args.context_state=true"],
            ["export.servers [vllm, sglang, deepspec]", "context_state"],
        ),
        (
            [
                "--model.seq_head.class_path=dspark_lightning.drafters.GatedMarkovHead",
                '--export={"servers": ["llamacpp"]}',
            ],
            ["export.servers [llamacpp]", "llamacpp: markov_head_type 'gated'"],
        ),
        (
            ["--model.seq_head=null", "--model.conf_head=null", '--export={"servers": ["sglang"]}'],
            ["sglang: markov_rank 0"],
        ),
        (
            ["--model.draft_vocab_size=64", '--export={"servers": ["deepspec"]}'],
            ["deepspec: a reduced draft vocabulary"],
        ),
        (['--export={"servers": ["tgi"]}'], ["unknown server 'tgi'"]),
        (['--export={"servers": ["all"]}'], ["unknown server 'all'"]),
        (['--export={"servers": ["vllm", "vllm"]}'], ["names a server twice"]),
        (['--export={"engines": ["vllm"]}'], ["export.engines"]),  # the old name
        (['--export={"servers": "vllm"}'], ["--export.servers", "list"]),
        (['--export={"servers": ["vllm"], "dtype": "fp16"}'], ["--export.dtype", "fp16"]),
        (["--export.layout={class_path: dspark-hf, init_args: {num_anchors: 0}}"], ["num_anchors must be"]),
        (["--export.layout={class_path: dspark-hf, init_args: {colour: 1}}"], ["dspark-hf", "colour"]),
        (["--export.layout=eagle3-hf"], ["no place in the LlamaForCausalLMEagle3 layout"]),  # a DSpark drafter
    ],
    ids=[
        "context_state",
        "gated_llamacpp",
        "dflash_sglang",
        "vocab_deepspec",
        "unknown",
        "all",
        "twice",
        "key",
        "str",
        "dtype",
        "layout_setting",
        "layout_argument",
        "layout_family",
    ],  # fmt: skip
)
def test_fit_refuses_what_its_servers_cannot_serve_before_any_data_work(args, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["fit", "--config", TINY, "--trainer.max_steps=2", *args], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("dspark-lightning fit: error: "), err[-2000:]
    for w in words:
        assert w in line, line
    assert not (tmp_path / "outputs" / "tiny_debug" / "data").exists()  # no data work was done


def test_fit_writes_one_export_per_server(workdir, capsys):
    """... in the layout the recipe's ``export.layout`` names, with its settings (a name or {class_path, init_args},
    as every component)."""
    layout = "--export.layout={class_path: dspark-hf, init_args: {num_anchors: 77}}"
    code, out, err = run_main(["fit", "--config", TINY, "--trainer.max_steps=2", "--validate_before_fit=false", layout],
                              capsys)  # fmt: skip
    assert code == 0, err[-2000:]
    version = workdir / "outputs/tiny_debug/tb/version_0"
    for server in ("vllm", "sglang", "deepspec"):  # tiny_debug.yaml's servers
        cfg = json.loads((version / "serving" / server / "config.json").read_text())
        assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["block_size"] == 4 and cfg["num_anchors"] == 77
        assert f"{server} export -> " in out
    assert "dflash_config" in json.loads((version / "serving/vllm/config.json").read_text())
    assert not (version / "serving" / "llamacpp").exists()


def test_plain_trainer_fit_checks_the_servers_too(tiny_target):
    """The callback that exports after a plain ``Trainer.fit`` refuses the same drafters at setup."""
    from types import SimpleNamespace

    from dspark_lightning import create
    from dspark_lightning.export import InteropError
    from dspark_lightning.lightning.callbacks import DrafterExport

    drafter = create("drafter", "dspark", tiny_target, block_size=3, seq_head="gated")
    cb = DrafterExport(dir=str(Path("unused")), servers=["llamacpp"])
    with pytest.raises(InteropError, match=r"llamacpp: markov_head_type 'gated'"):
        cb.setup(SimpleNamespace(log_dir="."), SimpleNamespace(drafter=drafter), "fit")
    DrafterExport(servers=["sglang"]).setup(SimpleNamespace(log_dir="."), SimpleNamespace(drafter=drafter), "fit")


def test_a_recipe_whose_taps_changed_prepares_its_data_again(workdir, capsys):
    """The servable recipes tap other layers than before: a work dir holding the old taps' cache is prepared again
    (the fingerprint changed) instead of refused as a cache of other layers."""
    base = ["fit", "--config", TINY, "--trainer.max_steps=1", "--validate_before_fit=false", "--data.features=cached"]
    code, _, err = run_main(base, capsys)
    assert code == 0, err[-2000:]
    code, out, err = run_main([*base, "--target.layer_ids=[1, 3]"], capsys)
    assert code == 0, err[-2000:]
    assert "holds the data of another configuration" in out
    meta = json.loads((workdir / "outputs/tiny_debug/data/features_train/index.json").read_text())["meta"]
    assert meta["layer_ids"] == [1, 3]
