"""Every drafter a product recipe trains serves in llama.cpp, proven by llama.cpp's own code (release b11434).

The GGUFs come from ``export --server llamacpp`` (llama.cpp's converter); the loader is llama.cpp's, run through
``llama-speculative-simple --spec-type draft-dspark`` built from the pinned source (``make llamacpp-tools``, cached
per CPU). The target is a tiny random Llama with SmolLM2's tokenizer and depth (30 layers), so every recipe's tapped
layers exist and llama.cpp's converter knows the tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = sorted(
    p for p in (ROOT / "recipes").rglob("*.yaml") if p.parent.name != "matrix"
)  # research cells under recipes/matrix/ opt out


@pytest.fixture(scope="module")
def llama_tools():
    from dspark_lightning.export import llamacpp

    return llamacpp.build()  # cached per CPU; a clean machine compiles it here (minutes)


@pytest.fixture(scope="module")
def smol_tiny(tmp_path_factory, llama_tools):
    """(HF directory, F32 GGUF) of a tiny random Llama with SmolLM2's tokenizer and 30 layers."""
    from dspark_lightning.export import llamacpp
    from dspark_lightning.targets.embedded import SMOLLM2, build_tiny_target, embedded_path

    d = tmp_path_factory.mktemp("smol_tiny")
    build_tiny_target(d / "hf", num_layers=30, tokenizer_from=embedded_path(SMOLLM2))
    llamacpp.convert(d / "hf", d / "target.gguf", "f32")
    return d / "hf", d / "target.gguf"


def check_llamacpp_load(drafter, draft_gguf: Path, target_gguf: Path) -> dict:
    """What llama.cpp's loader reports of ``draft_gguf`` is the drafter we trained."""
    from llamacpp_report import gguf_tensors, load_report

    rep = load_report(target_gguf, draft_gguf)
    assert rep["returncode"] == 0, rep["log_tail"]
    kv, g = rep["kv"], drafter.geometry
    ids = list(g.layer_ids)
    assert kv["general.architecture"] == "dflash"
    assert int(kv["dflash.block_size"]) == drafter.block_size
    assert kv["dflash.target_layers"] == str([i + 1 for i in ids])  # llama.cpp numbers layer inputs
    assert kv["dflash.sample_from_anchor"] == "true"
    assert kv["dflash.has_confidence_head"] == ("true" if drafter.conf_head is not None else "false")
    assert int(kv["tokenizer.ggml.mask_token_id"]) == drafter.mask_token_id
    assert rep["spec"] == {"block_size": drafter.block_size, "mask_token_id": drafter.mask_token_id,
                           "n_extract": len(ids), "sample_from_anchor": True}  # fmt: skip
    rank = drafter.seq_head.token_dim
    assert rep["markov_rank"] == rank
    shapes = gguf_tensors(draft_gguf)
    assert rep["n_tensors"] == len(shapes)  # the loader created every tensor of the file, each of its shape
    d, v = g.hidden_size, g.vocab_size
    assert shapes["fc.weight"] == [d, len(ids) * d]
    assert shapes["markov_w1.weight"] == [v, rank]
    if drafter.draft_vocab is not None:
        n = drafter.draft_vocab.numel()
        assert rep["draft_vocab_size"] == n
        assert shapes["d2t"] == [n] and shapes["output.weight"] == [n, d] and shapes["markov_w2.weight"] == [n, rank]
    else:
        assert "draft_vocab_size" not in rep and "d2t" not in shapes and "output.weight" not in shapes
        assert shapes["markov_w2.weight"] == [v, rank]
    assert rep["n_drafted"] > 0  # it drafted with the draft-dspark graph
    return rep


@pytest.mark.parametrize("recipe", PRODUCT, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_every_product_recipe_exports_for_its_servers(recipe, smol_tiny, tmp_path, monkeypatch):
    """The recipe's drafter (random init on the tiny target, no data) exports for every server the recipe names;
    llama.cpp loads its GGUF. A recipe that names none says why in a comment, and every export refuses its drafter
    (on the tiny stand-in target; the Gemma recipe's refusals come from its target's architecture, checked on the real
    target in test_gemma3_target.py)."""
    import yaml

    from dspark_lightning.checkpoint import save_drafter
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.export import InteropError, export_drafter
    from dspark_lightning.export.plan import check_servers, serving_layout
    from dspark_lightning.export.servers import server_names
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    monkeypatch.chdir(tmp_path)
    hf, target_gguf = smol_tiny
    servers = check_servers((yaml.safe_load(recipe.read_text()).get("export") or {}).get("servers") or [])
    if not servers:
        text = recipe.read_text()
        assert "export: {servers: []}" in text and text.count("#") > 2, "a recipe that serves nowhere says why"
    cpu = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.logger=false"]
    cli = DSparkCLI(DSparkModule, DSparkDataModule, run=False,
                    args=["--config", str(recipe), f"--target.name={hf}", *cpu])  # fmt: skip
    drafter, target = cli.model.drafter, cli.model.target
    if getattr(drafter, "draft_vocab", None) is not None:  # chosen from the data at fit time: any sorted ids here
        n = drafter.draft_vocab.numel()
        drafter.set_draft_vocab(
            torch.randperm(target.geometry.vocab_size, generator=torch.Generator().manual_seed(0))[:n].sort().values
        )
    native = save_drafter(drafter, tmp_path / "drafter", target)
    fmt = serving_layout(drafter)
    if not servers:
        if yaml.safe_load(recipe.read_text())["target"]["name"] == "gemma3-270m":
            return  # refused by its target's architecture: run on the real Gemma target in test_gemma3_target.py
        for server in server_names():
            with pytest.raises(InteropError) as e:
                export_drafter(native, fmt, tmp_path / f"out_{server}", server=server)
            assert "\n" not in str(e.value)
        return
    for server in servers:
        res = export_drafter(native, fmt, tmp_path / server, server=server)
        assert (res.path / "config.json").is_file() and (res.path / "model.safetensors").is_file()
        if server == "llamacpp":
            check_llamacpp_load(drafter, res.path / "draft.gguf", target_gguf)


@pytest.mark.parametrize(
    "kind", ["full_vocab", "reduced_vocab", "no_confidence_head", "bf16"], ids=lambda k: k.replace("_", "-")
)
def test_llamacpp_loads_every_servable_kind(kind, smol_tiny, tmp_path):
    from dspark_lightning import create, load_target
    from dspark_lightning.export import export_serving

    hf, target_gguf = smol_tiny
    target = load_target(str(hf), layer_ids=[2, 9, 28])
    kw = {"draft_vocab_size": 300} if kind == "reduced_vocab" else {}
    if kind == "no_confidence_head":
        kw["conf_head"] = None
    drafter = create(
        "drafter",
        "dspark",
        target,
        block_size=5,
        backbone={"class_path": "dense", "init_args": {"num_layers": 2}},
        seq_head={"class_path": "vanilla", "init_args": {"rank": 32}},
        **kw,
    )
    if kind == "reduced_vocab":
        drafter.set_draft_vocab(torch.arange(0, 600, 2))
    res = export_serving(drafter, target, "dspark-hf", tmp_path / "out", server="llamacpp",
                         dtype="bf16" if kind == "bf16" else "fp32")  # fmt: skip
    rep = check_llamacpp_load(drafter, res.path / "draft.gguf", target_gguf)
    assert rep["kv"]["general.file_type"] == ("32" if kind == "bf16" else "0")  # LLAMA_FTYPE_MOSTLY_BF16 / ALL_F32


def test_export_all_includes_the_gguf_and_the_target_gguf(smol_tiny, tmp_path):
    """``--server all`` writes one folder every server loads, the GGUF included; ``--target_gguf`` adds the target's."""
    from llamacpp_report import gguf_tensors, load_report

    from dspark_lightning import create, load_target
    from dspark_lightning.export import export_serving

    hf, _ = smol_tiny
    target = load_target(str(hf))
    drafter = create(
        "drafter",
        "dspark",
        target,
        block_size=4,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head={"class_path": "vanilla", "init_args": {"rank": 16}},
    )
    res = export_serving(drafter, target, "dspark-hf", tmp_path / "all", server="all", target_gguf=True)
    names = {p.name for p in res.path.iterdir()}
    assert {"config.json", "model.safetensors", "draft.gguf", "target.gguf"} <= names
    assert "token_embd.weight" not in gguf_tensors(res.path / "draft.gguf")  # the deepspec copies stay out of it
    rep = load_report(res.path / "target.gguf", res.path / "draft.gguf")
    assert rep["returncode"] == 0 and rep["n_drafted"] > 0, rep["log_tail"]


def test_fit_end_export_writes_the_gguf_and_says_how_to_serve_it(smol_tiny, tmp_path):
    """What ``fit`` runs after training for a recipe naming llamacpp: the GGUF beside the native drafter."""
    from dspark_lightning import create, load_target
    from dspark_lightning.checkpoint import save_drafter
    from dspark_lightning.export.plan import export_for_servers

    hf, target_gguf = smol_tiny
    target = load_target(str(hf))
    drafter = create(
        "drafter",
        "dspark",
        target,
        block_size=3,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head={"class_path": "vanilla", "init_args": {"rank": 16}},
    )
    native = save_drafter(drafter, tmp_path / "version_0" / "drafter", target)
    lines: list[str] = []
    done = export_for_servers(native, "dspark-hf", ["llamacpp", "vllm"], "bf16", lines.append)
    assert set(done) == {"llamacpp", "vllm"}
    gguf = tmp_path / "version_0" / "serving" / "llamacpp" / "draft.gguf"
    assert gguf.is_file() and any("--spec-type draft-dspark" in line for line in lines)
    check_llamacpp_load(drafter, gguf, target_gguf)
